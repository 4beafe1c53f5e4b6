"""GPU discovery through NVML: what GPUs this node has, how they are wired, and which CPUs are near them.

Only public pynvml calls are used, so the same code runs against a real driver and against the fake
library of ``fake_nvml`` (which replaces ``libnvidia-ml`` underneath pynvml).

The NVLink matrix follows Slurm's method (count each active lane by the GPU at its remote PCI address)
with one correction: on NVSwitch machines every lane ends at a switch, so that method finds no links at all.
GPUs whose lanes reach a common switch fabric are instead treated as all-to-all connected.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import pynvml

from garrison.model.cpulist import format_cpu_list as format_cpu_list
from garrison.model.domain import Gpu, NodeInventory

logger = logging.getLogger(__name__)

_BITS_PER_CPU_WORD = 64  # NVML's cpu set is an array of 64-bit unsigned longs
# Ask for room for at least this many CPUs: NVML silently drops CPUs beyond the set size it is given.
_MIN_CPU_SET_CPUS = 4096

_PCIE_LABELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX",  # two GPUs on one board behave as sharing a PCIe switch
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}

# NVML errors at nvmlInit that mean "this node has no usable GPUs", with what an operator should read.
_INIT_FAILURE_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (
        pynvml.NVMLError_LibraryNotFound,
        "NVML library libnvidia-ml.so.1 not found (no NVIDIA driver installed)",
    ),
    (pynvml.NVMLError_DriverNotLoaded, "NVIDIA kernel driver is not loaded"),
    (pynvml.NVMLError_NoPermission, "no permission to open the NVIDIA devices"),
    (
        pynvml.NVMLError_LibRmVersionMismatch,
        "NVML library and kernel driver versions differ (driver updated without a reload or reboot)",
    ),
)

_PCI_BUS_ID = re.compile(r"^(?:([0-9A-F]+):)?([0-9A-F]{1,2}):([0-9A-F]{1,2})\.([0-7])$")


def discover(hostname: str) -> NodeInventory:
    """Inventory of this node's GPUs. Without a usable NVML it logs one warning and reports zero GPUs."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        logger.warning("no usable GPUs on %s: %s; reporting 0 GPUs", hostname, _init_failure_reason(err))
        return _inventory(hostname, [], [], [])
    try:
        return _discover_initialised(hostname)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as err:
        logger.warning("GPU discovery on %s failed: %s; reporting 0 GPUs", hostname, _error_text(err))
        return _inventory(hostname, [], [], [])
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            logger.warning("nvmlShutdown on %s failed: %s", hostname, _error_text(err))


def _init_failure_reason(err: pynvml.NVMLError) -> str:
    for error_class, reason in _INIT_FAILURE_REASONS:
        if isinstance(err, error_class):
            return reason
    return f"nvmlInit failed: {_error_text(err)}"


def _error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


@dataclass(slots=True)
class _LinkScan:
    """What one GPU's NVLink lanes lead to."""

    lanes_to_bus: Counter[tuple[int, ...] | str] = field(default_factory=Counter)  # direct GPU lanes
    switch_buses: set[tuple[int, ...] | str] = field(default_factory=set)
    switch_lanes: int = 0


def _discover_initialised(hostname: str) -> NodeInventory:
    handles: list[Any] = []
    gpus: list[Gpu] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu = _read_gpu(index, handle)
        except pynvml.NVMLError as err:
            # A lost or inaccessible GPU must not hide the healthy ones; it is simply not offered.
            logger.warning("GPU %d on %s skipped: %s", index, hostname, _error_text(err))
            continue
        handles.append(handle)
        gpus.append(gpu)

    scans = [_scan_links(handle) for handle in handles]
    nvlink = _nvlink_matrix(gpus, scans)
    topo = _topo_labels(gpus, handles, nvlink)
    return _inventory(hostname, gpus, nvlink, topo)


def _inventory(
    hostname: str, gpus: Sequence[Gpu], nvlink: Sequence[Sequence[int]], topo: Sequence[Sequence[str]]
) -> NodeInventory:
    return NodeInventory(
        hostname=hostname,
        gpus=tuple(gpus),
        nvlink=tuple(tuple(row) for row in nvlink),
        topo=tuple(tuple(row) for row in topo),
        cpus=os.cpu_count() or 1,
        memory_mb=psutil.virtual_memory().total // (1024 * 1024),
    )


def _read_gpu(index: int, handle: Any) -> Gpu:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return Gpu(
        index=index,
        uuid=pynvml.nvmlDeviceGetUUID(handle),
        name=pynvml.nvmlDeviceGetName(handle),
        memory_mib=memory.total // (1024 * 1024),
        pci_bus_id=pynvml.nvmlDeviceGetPciInfo(handle).busId,
        numa_node=_numa_node(handle),
        cpu_affinity=_cpu_affinity(handle),
        mig_enabled=_mig_enabled(handle),
    )


def _numa_node(handle: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetNumaNodeId(handle))
    except pynvml.NVMLError:
        return -1  # older drivers and single-node machines cannot say


def _cpu_affinity(handle: Any) -> str:
    cpu_capacity = max(os.cpu_count() or 1, _MIN_CPU_SET_CPUS)
    word_count = -(-cpu_capacity // _BITS_PER_CPU_WORD)
    try:
        words = pynvml.nvmlDeviceGetCpuAffinity(handle, word_count)
    except pynvml.NVMLError:
        return ""
    cpus = [
        word_index * _BITS_PER_CPU_WORD + bit
        for word_index, word in enumerate(words)
        for bit in range(_BITS_PER_CPU_WORD)
        if word >> bit & 1
    ]
    return format_cpu_list(cpus)


def _mig_enabled(handle: Any) -> bool:
    try:
        current_mode, _pending_mode = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return False  # pre-Ampere GPUs answer NotSupported: no MIG
    return bool(current_mode == pynvml.NVML_DEVICE_MIG_ENABLE)


def _bus_key(bus_id: str) -> tuple[int, ...] | str:
    """A PCI address comparable across NVML's spellings (8- or 4-digit domain, any case)."""
    match = _PCI_BUS_ID.match(bus_id.strip().upper())
    if match is None:
        return bus_id.strip().upper()
    domain, bus, device, function = match.groups()
    return (int(domain or "0", 16), int(bus, 16), int(device, 16), int(function))


def _scan_links(handle: Any) -> _LinkScan:
    scan = _LinkScan()
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_NVLINK_STATE_ACTIVE:
                continue
        except pynvml.NVMLError_FunctionNotFound:
            break  # a driver without the NVLink API has no usable links at all
        except pynvml.NVMLError:
            # NotSupported past the GPU's lane count, InvalidArgument for unused lanes; the lane numbering
            # may have holes, so keep looking instead of stopping at the first one.
            continue
        try:
            remote_bus = _bus_key(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except pynvml.NVMLError:
            continue
        try:
            remote_type = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except pynvml.NVMLError:
            # Drivers before NVSwitch support cannot say; a remote that is one of our GPUs is matched below.
            remote_type = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            scan.switch_lanes += 1
            scan.switch_buses.add(remote_bus)
        elif remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            scan.lanes_to_bus[remote_bus] += 1
    return scan


def _switch_fabrics(scans: Sequence[_LinkScan]) -> list[int]:
    """Fabric number per GPU: GPUs that reach a common NVSwitch, directly or through others, share one."""
    fabric = list(range(len(scans)))

    def root(position: int) -> int:
        while fabric[position] != position:
            position = fabric[position]
        return position

    first_gpu_on_switch: dict[tuple[int, ...] | str, int] = {}
    for position, scan in enumerate(scans):
        for switch in scan.switch_buses:
            other = first_gpu_on_switch.setdefault(switch, position)
            fabric[root(position)] = root(other)
    return [root(position) for position in range(len(scans))]


def _nvlink_matrix(gpus: Sequence[Gpu], scans: Sequence[_LinkScan]) -> list[list[int]]:
    bus_keys = [_bus_key(gpu.pci_bus_id) for gpu in gpus]
    fabrics = _switch_fabrics(scans)
    matrix = [[0] * len(gpus) for _ in gpus]
    for i, scan in enumerate(scans):
        for j in range(len(gpus)):
            if i == j:
                continue
            links = scan.lanes_to_bus[bus_keys[j]]
            if scan.switch_lanes and scans[j].switch_lanes and fabrics[i] == fabrics[j]:
                # Traffic between two GPUs on a fabric is bounded by the GPU with fewer working switch
                # lanes; taking the smaller count keeps the matrix symmetric when one GPU is degraded.
                links += min(scan.switch_lanes, scans[j].switch_lanes)
            matrix[i][j] = links
    return matrix


def _topo_labels(
    gpus: Sequence[Gpu], handles: Sequence[Any], nvlink: Sequence[Sequence[int]]
) -> list[list[str]]:
    labels = [["X"] * len(gpus) for _ in gpus]
    for i in range(len(gpus)):
        for j in range(len(gpus)):
            if i == j:
                continue
            if nvlink[i][j] > 0:
                labels[i][j] = f"NV{nvlink[i][j]}"
            else:
                labels[i][j] = _pcie_label(gpus[i], gpus[j], handles[i], handles[j])
    return labels


def _pcie_label(first: Gpu, second: Gpu, first_handle: Any, second_handle: Any) -> str:
    try:
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(first_handle, second_handle)
    except pynvml.NVMLError:
        # Without the PCIe tree, the NUMA nodes still tell whether the path crosses sockets.
        same_node = first.numa_node >= 0 and first.numa_node == second.numa_node
        return "NODE" if same_node else "SYS"
    return _PCIE_LABELS.get(level, "SYS")
