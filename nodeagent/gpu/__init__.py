"""GPU discovery for the node agent: the NVML inventory, and a fake NVML library for GPU-less hosts.

Machine descriptions (what a fake node has) live in ``garrison.machines``; ``topo -m`` rendering is the
CLI's (``garrison.cli.topo``).
"""

from garrison.nodeagent.gpu.discovery import discover, format_cpu_list
from garrison.nodeagent.gpu.fake_nvml import (
    install_failing_nvml,
    install_fake_nvml,
    install_missing_nvml,
    uninstall_fake_nvml,
)

__all__ = [
    "discover",
    "format_cpu_list",
    "install_failing_nvml",
    "install_fake_nvml",
    "install_missing_nvml",
    "uninstall_fake_nvml",
]
