"""A fake NVML C library driven by a machine description, so the real pynvml code path runs without a GPU.

nvidia-ml-py resolves every C symbol with ``getattr(pynvml.nvmlLib, name)``, and ``nvmlInit()`` only loads
``libnvidia-ml.so.1`` while ``pynvml.nvmlLib`` is None. Installing a ``FakeNvmlLibrary`` there therefore
replaces the shared library underneath the real Python wrappers: their ctypes structs, buffer sizes and
error classes are all exercised, and discovery code cannot tell the difference. Symbols the fake does not
implement are missing attributes, which pynvml turns into ``NVMLError_FunctionNotFound`` exactly as it does
for an old driver.

The machine it answers for is a parsed description (``garrison.machines``: the TOML format, its
validation and the shipped ``topologies/*.toml``); this module only turns that model into NVML's answers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from garrison.machines.description import (
    GpuDescription,
    Lane,
    LaneEnd,
    MachineDescription,
    PcieRelation,
    fake_gpu_uuid,
    normalise_bus_id,
    parse_machine,
    pcie_relation,
)

_NVML_VERSION = "12.570.86.15"
_CUDA_DRIVER_VERSION = 12080
_NVIDIA_PCI_VENDOR_ID = 0x10DE
# Device handles are opaque pointers to the caller; the fake hands out these recognisable fake addresses.
_HANDLE_BASE = 0x6A70_0000
_HANDLE_STRIDE = 0x100

_LANE_END_TYPES = {LaneEnd.GPU: pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, LaneEnd.SWITCH: pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH}
_TOPOLOGY_LEVELS = {
    PcieRelation.SAME_GPU: pynvml.NVML_TOPOLOGY_INTERNAL,
    PcieRelation.PCIE_SWITCH: pynvml.NVML_TOPOLOGY_SINGLE,
    PcieRelation.HOST_BRIDGE: pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    PcieRelation.NUMA_NODE: pynvml.NVML_TOPOLOGY_NODE,
    PcieRelation.SYSTEM: pynvml.NVML_TOPOLOGY_SYSTEM,
}


# --------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------


def install_fake_nvml(
    description: Mapping[str, Any] | MachineDescription, node_name: str, *, failures: Mapping[str, int] | None = None
) -> None:
    """Make pynvml talk to a fake GPU node built from ``description``.

    ``failures`` maps C symbol names to NVML error codes the symbol returns instead of answering, to test
    how callers cope with a misbehaving driver; NVML_ERROR_FUNCTION_NOT_FOUND removes the symbol entirely.
    """
    _swap_library(FakeNvmlLibrary(description, node_name, failures=failures))


def install_missing_nvml() -> None:
    """Make pynvml behave as on a node without libnvidia-ml: nvmlInit raises NVMLError_LibraryNotFound."""
    install_failing_nvml(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)


def install_failing_nvml(init_error: int) -> None:
    """Make nvmlInit fail with ``init_error`` (e.g. NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_NO_PERMISSION)."""
    _swap_library(_FailingNvmlLibrary(init_error))


def uninstall_fake_nvml() -> None:
    """Remove an installed fake, so the next nvmlInit loads the real library; a real library is left alone."""
    if isinstance(pynvml.nvmlLib, FakeNvmlLibrary | _FailingNvmlLibrary):
        _swap_library(None)


def _swap_library(library: object | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        # pynvml caches symbols per name across libraries; stale entries would keep calling the old fake.
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


# --------------------------------------------------------------------------------------------------------
# The fake C library
# --------------------------------------------------------------------------------------------------------


class _Symbol:
    """One exported C function. pynvml may set ``restype`` on it, as on a ctypes function pointer."""

    def __init__(self, name: str, call: Callable[..., Any]) -> None:
        self.__name__ = name
        self.restype: Any = ctypes.c_int
        self.argtypes: Any = None
        self._call = call

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)


def _as_int(value: object) -> int:
    """A scalar argument arrives as a ctypes object (c_uint(3)) or a plain int, as ctypes would accept."""
    if isinstance(value, ctypes._SimpleCData):
        value = value.value
    if isinstance(value, int):
        return value
    raise ctypes.ArgumentError(f"don't know how to convert parameter {value!r}")


def _target(reference: Any) -> Any:
    """The ctypes object behind a ``byref(x)`` out-argument."""
    return getattr(reference, "_obj", reference)


def _write_string(buffer: Any, size: object, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > _as_int(size):
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    buffer.value = data
    return pynvml.NVML_SUCCESS


def _fill_pci_info(info: Any, bus_id: str) -> None:
    domain, bus, device_function = bus_id.split(":")
    device, _function = device_function.split(".")
    info.busId = bus_id
    info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{device_function}"
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(device, 16)
    info.pciDeviceId = _NVIDIA_PCI_VENDOR_ID  # device id 0 in the high half: no real SKU is claimed
    info.pciSubSystemId = 0


class FakeNvmlLibrary:
    """Stands where ``CDLL("libnvidia-ml.so.1")`` would be, answering from a machine description.

    ``init_count`` mirrors NVML's own reference count (nvmlInit minus nvmlShutdown), so tests can check
    that a caller shut NVML down again.
    """

    def __init__(
        self,
        description: Mapping[str, Any] | MachineDescription,
        node_name: str,
        *,
        failures: Mapping[str, int] | None = None,
        source: str = "<machine description>",
    ) -> None:
        self.machine = (
            description if isinstance(description, MachineDescription) else parse_machine(description, source)
        )
        self.node_name = node_name
        self.uuids = tuple(fake_gpu_uuid(node_name, gpu.index) for gpu in self.machine.gpus)
        self.init_count = 0
        self._failures = dict(failures or {})
        # GPU index -> (GPU busy %, memory controller busy %, memory used MiB); idle GPUs are absent.
        self._usage: dict[int, tuple[int, int, int]] = {}
        self._symbols: dict[str, Callable[..., int | bytes]] = {
            "nvmlInitWithFlags": self._init_with_flags,
            "nvmlInit_v2": self._init,
            "nvmlShutdown": self._shutdown,
            "nvmlErrorString": self._error_string,
            "nvmlSystemGetDriverVersion": self._driver_version,
            "nvmlSystemGetNVMLVersion": self._nvml_version,
            "nvmlSystemGetCudaDriverVersion": self._cuda_driver_version,
            "nvmlSystemGetCudaDriverVersion_v2": self._cuda_driver_version,
            "nvmlDeviceGetCount_v2": self._device_count,
            "nvmlDeviceGetHandleByIndex_v2": self._handle_by_index,
            "nvmlDeviceGetHandleByUUID": self._handle_by_uuid,
            "nvmlDeviceGetHandleByPciBusId_v2": self._handle_by_pci_bus_id,
            "nvmlDeviceGetIndex": self._index,
            "nvmlDeviceGetMinorNumber": self._index,
            "nvmlDeviceGetUUID": self._uuid,
            "nvmlDeviceGetName": self._name,
            "nvmlDeviceGetMemoryInfo": self._memory_info,
            "nvmlDeviceGetMemoryInfo_v2": self._memory_info_v2,
            "nvmlDeviceGetPciInfo_v3": self._pci_info,
            "nvmlDeviceGetNumaNodeId": self._numa_node_id,
            "nvmlDeviceGetCpuAffinity": self._cpu_affinity,
            "nvmlDeviceGetNvLinkState": self._nvlink_state,
            "nvmlDeviceGetNvLinkVersion": self._nvlink_version,
            "nvmlDeviceGetNvLinkRemotePciInfo_v2": self._nvlink_remote_pci_info,
            "nvmlDeviceGetNvLinkRemoteDeviceType": self._nvlink_remote_device_type,
            "nvmlDeviceGetTopologyCommonAncestor": self._topology_common_ancestor,
            "nvmlDeviceGetP2PStatus": self._p2p_status,
            "nvmlDeviceGetMigMode": self._mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": self._max_mig_device_count,
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_device_handle_by_index,
            "nvmlDeviceGetComputeRunningProcesses_v3": self._no_processes,
            "nvmlDeviceGetComputeRunningProcesses_v2": self._no_processes,
            "nvmlDeviceGetUtilizationRates": self._utilization_rates,
            "nvmlDeviceGetTotalEccErrors": self._total_ecc_errors,
        }

    def __getattr__(self, name: str) -> _Symbol:
        # Only reached for names that are not ordinary attributes, i.e. C symbol lookups.
        if name.startswith("_"):
            raise AttributeError(name)
        implementation = self._symbols.get(name)
        if implementation is None or self._failures.get(name) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise AttributeError(f"fake libnvidia-ml has no symbol {name}")
        return _Symbol(name, lambda *args: self._call(name, implementation, args))

    def _call(
        self, name: str, implementation: Callable[..., int | bytes], args: tuple[Any, ...]
    ) -> int | bytes:
        if name in self._failures:
            return self._failures[name]
        needs_init = name not in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlErrorString")
        if needs_init and self.init_count == 0:
            return pynvml.NVML_ERROR_UNINITIALIZED
        return implementation(*args)

    # -- library -----------------------------------------------------------------------------------------

    def set_usage(self, index: int, *, gpu_percent: int, memory_percent: int, memory_used_mib: int) -> None:
        """Make GPU ``index`` report a load, as a GPU running a job would: its utilization rates and used
        memory (free memory shrinks to match). ValueError for an unknown GPU or values out of range."""
        gpu = next((g for g in self.machine.gpus if g.index == index), None)
        if gpu is None:
            raise ValueError(f"no GPU {index} on this fake node")
        if not (0 <= gpu_percent <= 100 and 0 <= memory_percent <= 100 and 0 <= memory_used_mib <= gpu.memory_mib):
            raise ValueError(f"GPU {index}: usage out of range")
        self._usage[index] = (gpu_percent, memory_percent, memory_used_mib)

    def _init_with_flags(self, flags: object) -> int:
        _as_int(flags)
        return self._init()

    def _init(self) -> int:
        self.init_count += 1
        return pynvml.NVML_SUCCESS

    def _shutdown(self) -> int:
        self.init_count -= 1
        return pynvml.NVML_SUCCESS

    def _error_string(self, code: object) -> bytes:
        return pynvml.NVMLError._errcode_to_string.get(_as_int(code), "Unknown Error").encode()

    def _driver_version(self, buffer: Any, size: object) -> int:
        return _write_string(buffer, size, self.machine.driver_version)

    def _nvml_version(self, buffer: Any, size: object) -> int:
        return _write_string(buffer, size, _NVML_VERSION)

    def _cuda_driver_version(self, version_ref: Any) -> int:
        _target(version_ref).value = _CUDA_DRIVER_VERSION
        return pynvml.NVML_SUCCESS

    # -- device handles ----------------------------------------------------------------------------------

    def _device_count(self, count_ref: Any) -> int:
        _target(count_ref).value = len(self.machine.gpus)
        return pynvml.NVML_SUCCESS

    def _give_handle(self, index: int, handle_ref: Any) -> int:
        ctypes.c_void_p.from_buffer(_target(handle_ref)).value = _HANDLE_BASE + (index + 1) * _HANDLE_STRIDE
        return pynvml.NVML_SUCCESS

    def _gpu(self, handle: Any) -> GpuDescription | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address is None:
            return None
        index, remainder = divmod(address - _HANDLE_BASE, _HANDLE_STRIDE)
        if remainder or not 1 <= index <= len(self.machine.gpus):
            return None
        return self.machine.gpus[index - 1]

    def _handle_by_index(self, index: object, handle_ref: Any) -> int:
        position = _as_int(index)
        if not 0 <= position < len(self.machine.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return self._give_handle(position, handle_ref)

    def _handle_by_uuid(self, uuid_arg: Any, handle_ref: Any) -> int:
        wanted = _target(uuid_arg).value.decode()
        for index, gpu_uuid in enumerate(self.uuids):
            if gpu_uuid == wanted:
                return self._give_handle(index, handle_ref)
        return pynvml.NVML_ERROR_NOT_FOUND

    def _handle_by_pci_bus_id(self, bus_arg: Any, handle_ref: Any) -> int:
        wanted = normalise_bus_id(_target(bus_arg).value.decode())
        if wanted is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for gpu in self.machine.gpus:
            if gpu.bus == wanted:
                return self._give_handle(gpu.index, handle_ref)
        return pynvml.NVML_ERROR_NOT_FOUND

    # -- per-device facts --------------------------------------------------------------------------------

    def _index(self, handle: Any, index_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(index_ref).value = gpu.index
        return pynvml.NVML_SUCCESS

    def _uuid(self, handle: Any, buffer: Any, size: object) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return _write_string(buffer, size, self.uuids[gpu.index])

    def _name(self, handle: Any, buffer: Any, size: object) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return _write_string(buffer, size, gpu.name)

    def _memory_info(self, handle: Any, memory_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        memory = _target(memory_ref)
        memory.total = gpu.memory_mib * 1024 * 1024
        memory.used = self._usage.get(gpu.index, (0, 0, 0))[2] * 1024 * 1024  # 0 unless set_usage said so
        memory.free = memory.total - memory.used
        return pynvml.NVML_SUCCESS

    def _memory_info_v2(self, handle: Any, memory_ref: Any) -> int:
        result = self._memory_info(handle, memory_ref)
        if result == pynvml.NVML_SUCCESS:
            _target(memory_ref).reserved = 0
        return result

    def _pci_info(self, handle: Any, pci_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _fill_pci_info(_target(pci_ref), gpu.bus)
        return pynvml.NVML_SUCCESS

    def _numa_node_id(self, handle: Any, node_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(node_ref).value = gpu.numa
        return pynvml.NVML_SUCCESS

    def _cpu_affinity(self, handle: Any, cpu_set_size: object, words_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        word_count = _as_int(cpu_set_size)
        words = _target(words_ref)
        bits_per_word = ctypes.sizeof(ctypes.c_ulonglong) * 8
        for cpu in gpu.cpus:
            word, bit = divmod(cpu, bits_per_word)
            # Like NVML, CPUs beyond the caller's set size are silently left out.
            if word < word_count:
                words[word] |= 1 << bit
        return pynvml.NVML_SUCCESS

    # -- NVLink ------------------------------------------------------------------------------------------

    def _lane(self, handle: Any, link: object) -> Lane | int:
        """The wired lane, or the error code NVML gives for that (device, link) pair."""
        gpu = self._gpu(handle)
        lane_index = _as_int(link)
        if gpu is None or not 0 <= lane_index < pynvml.NVML_NVLINK_MAX_LINKS:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if lane_index >= self.machine.max_links:
            return pynvml.NVML_ERROR_NOT_SUPPORTED  # past this GPU's real lane count
        if lane_index >= len(gpu.lanes):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT  # a lane the GPU has but nothing is plugged into
        return gpu.lanes[lane_index]

    def _nvlink_state(self, handle: Any, link: object, state_ref: Any) -> int:
        lane = self._lane(handle, link)
        if isinstance(lane, int):
            return lane
        _target(state_ref).value = pynvml.NVML_FEATURE_ENABLED
        return pynvml.NVML_SUCCESS

    def _nvlink_version(self, handle: Any, link: object, version_ref: Any) -> int:
        lane = self._lane(handle, link)
        if isinstance(lane, int):
            return lane
        if self.machine.nvlink_version is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        _target(version_ref).value = self.machine.nvlink_version
        return pynvml.NVML_SUCCESS

    def _nvlink_remote_pci_info(self, handle: Any, link: object, pci_ref: Any) -> int:
        lane = self._lane(handle, link)
        if isinstance(lane, int):
            return lane
        _fill_pci_info(_target(pci_ref), lane.remote_bus)
        return pynvml.NVML_SUCCESS

    def _nvlink_remote_device_type(self, handle: Any, link: object, type_ref: Any) -> int:
        lane = self._lane(handle, link)
        if isinstance(lane, int):
            return lane
        _target(type_ref).value = _LANE_END_TYPES[lane.remote_end]
        return pynvml.NVML_SUCCESS

    # -- topology ----------------------------------------------------------------------------------------

    def _common_ancestor(self, first: GpuDescription, second: GpuDescription) -> int:
        return _TOPOLOGY_LEVELS[pcie_relation(first, second)]

    def _topology_common_ancestor(self, handle1: Any, handle2: Any, level_ref: Any) -> int:
        first, second = self._gpu(handle1), self._gpu(handle2)
        if first is None or second is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(level_ref).value = self._common_ancestor(first, second)
        return pynvml.NVML_SUCCESS

    def _nvlink_connected(self, first: GpuDescription, second: GpuDescription) -> bool:
        if any(lane.remote_bus == second.bus for lane in first.lanes):
            return True
        # GPUs wired to a common NVSwitch reach each other through it
        first_switches = {
            lane.remote_bus
            for lane in first.lanes
            if lane.remote_end is LaneEnd.SWITCH
        }
        return any(lane.remote_bus in first_switches for lane in second.lanes)

    def _p2p_status(self, handle1: Any, handle2: Any, capability: object, status_ref: Any) -> int:
        first, second = self._gpu(handle1), self._gpu(handle2)
        capability_index = _as_int(capability)
        if first is None or second is None or not 0 <= capability_index < pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if first.index == second.index or self._nvlink_connected(first, second):
            status = pynvml.NVML_P2P_STATUS_OK
        elif capability_index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            status = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        elif self._common_ancestor(first, second) == pynvml.NVML_TOPOLOGY_SYSTEM:
            # PCIe peer traffic across the CPU socket interconnect is what chipsets typically refuse
            status = pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        else:
            status = pynvml.NVML_P2P_STATUS_OK
        _target(status_ref).value = status
        return pynvml.NVML_SUCCESS

    # -- MIG, usage and health ---------------------------------------------------------------------------

    def _mig_mode(self, handle: Any, current_ref: Any, pending_ref: Any) -> int:
        if self._gpu(handle) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(current_ref).value = pynvml.NVML_DEVICE_MIG_DISABLE
        _target(pending_ref).value = pynvml.NVML_DEVICE_MIG_DISABLE
        return pynvml.NVML_SUCCESS

    def _max_mig_device_count(self, handle: Any, count_ref: Any) -> int:
        if self._gpu(handle) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(count_ref).value = 0
        return pynvml.NVML_SUCCESS

    def _mig_device_handle_by_index(self, handle: Any, index: object, mig_handle_ref: Any) -> int:
        if self._gpu(handle) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _as_int(index)
        return pynvml.NVML_ERROR_NOT_FOUND  # MIG is disabled, so every slot is empty

    def _no_processes(self, handle: Any, count_ref: Any, infos: Any) -> int:
        if self._gpu(handle) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _target(count_ref).value = 0
        return pynvml.NVML_SUCCESS

    def _utilization_rates(self, handle: Any, utilization_ref: Any) -> int:
        gpu = self._gpu(handle)
        if gpu is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        utilization = _target(utilization_ref)
        utilization.gpu, utilization.memory, _ = self._usage.get(gpu.index, (0, 0, 0))
        return pynvml.NVML_SUCCESS

    def _total_ecc_errors(self, handle: Any, error_type: object, counter_type: object, count_ref: Any) -> int:
        if self._gpu(handle) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        _as_int(error_type)
        _as_int(counter_type)
        _target(count_ref).value = 0
        return pynvml.NVML_SUCCESS


class _FailingNvmlLibrary:
    """A node where NVML cannot start: nvmlInit answers ``init_error`` and nothing else is initialised."""

    def __init__(self, init_error: int) -> None:
        self.init_error = init_error

    def __getattr__(self, name: str) -> _Symbol:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("nvmlInitWithFlags", "nvmlInit_v2"):
            return _Symbol(name, lambda *args: self.init_error)
        if name == "nvmlErrorString":
            return _Symbol(
                name, lambda code: pynvml.NVMLError._errcode_to_string.get(_as_int(code), "").encode()
            )
        return _Symbol(name, lambda *args: pynvml.NVML_ERROR_UNINITIALIZED)
