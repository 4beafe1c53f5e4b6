"""GPU discovery for the node agent: NVML inventory, topology rendering, and a fake NVML for GPU-less hosts."""

from garrison.cli.topo import render_topo_matrix
from garrison.nodeagent.gpu.discovery import discover, format_cpu_list
from garrison.nodeagent.gpu.fake_nvml import (
    TOPOLOGY_NAMES,
    install_failing_nvml,
    install_fake_nvml,
    install_missing_nvml,
    load_description,
    resolve_topology,
    uninstall_fake_nvml,
)

__all__ = [
    "TOPOLOGY_NAMES",
    "discover",
    "format_cpu_list",
    "install_failing_nvml",
    "install_fake_nvml",
    "install_missing_nvml",
    "load_description",
    "render_topo_matrix",
    "resolve_topology",
    "uninstall_fake_nvml",
]
