"""The fake NVML library, exercised through the real pynvml wrappers exactly as discovery uses them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest

from garrison.machines.description import fake_gpu_uuid, load_description, resolve_topology
from garrison.nodeagent.gpu import (
    install_failing_nvml,
    install_fake_nvml,
    install_missing_nvml,
    uninstall_fake_nvml,
)
from garrison.nodeagent.gpu.fake_nvml import FakeNvmlLibrary

SMALL_MACHINE = """\
name = "two GPUs, one bridge"
numa = [{id=0, cpus="0-3"}]
defaults = {gpu_name = "Test GPU", memory_mib = 1024, max_links = 2, nvlink_version = 3}
gpus = [
  {index=0, bus="00000000:01:00.0", numa=0, pcie_switch="sw0", host_bridge="hb0"},
  {index=1, bus="00000000:02:00.0", numa=0, pcie_switch="sw0", host_bridge="hb0"},
]
nvlink_pairs = [[0,1,2]]
"""


@pytest.fixture(autouse=True)
def no_fake_left_behind() -> Iterator[None]:
    uninstall_fake_nvml()
    yield
    uninstall_fake_nvml()


def install(name: str, node: str = "node01", **options: Any) -> None:
    install_fake_nvml(load_description(resolve_topology(name)), node, **options)


def handles() -> list[Any]:
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


@contextmanager
def running(name: str, node: str = "node01", **options: Any) -> Iterator[list[Any]]:
    """A fake node with NVML initialised; yields its device handles and shuts NVML down afterwards."""
    install(name, node, **options)
    pynvml.nvmlInit()
    try:
        yield handles()
    finally:
        pynvml.nvmlShutdown()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machine.toml"
    path.write_text(text)
    return path


# -- machine descriptions (their parsing is tested in test_machines.py) ----------------------------------


def test_install_validates_a_description_built_in_code() -> None:
    description = load_description(resolve_topology("pcie4"))
    description["gpus"][0]["bus"] = "nonsense"
    with pytest.raises(ValueError, match=r"gpus\[0\]\.bus"):
        install_fake_nvml(description, "node01")
    assert pynvml.nvmlLib is None


# -- UUIDs ----------------------------------------------------------------------------------------------


def gpu_uuids(node: str) -> list[str]:
    with running("dgx-a100", node) as gpus:
        return [pynvml.nvmlDeviceGetUUID(handle) for handle in gpus]


def test_fake_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    first = gpu_uuids("node01")
    again = gpu_uuids("node01")
    other = gpu_uuids("node02")
    assert first == again
    assert len(set(first)) == 8
    assert not set(first) & set(other)
    assert first == [fake_gpu_uuid("node01", index) for index in range(8)]
    for gpu_uuid in first:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", gpu_uuid)


def test_handles_can_be_found_by_uuid_and_by_bus_id() -> None:
    with running("dgx1v", "node07"):
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(fake_gpu_uuid("node07", 5))
        assert pynvml.nvmlDeviceGetIndex(by_uuid) == 5
        by_bus = pynvml.nvmlDeviceGetHandleByPciBusId("0000:8a:00.0")
        assert pynvml.nvmlDeviceGetIndex(by_bus) == 7
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


# -- library behaviour ----------------------------------------------------------------------------------


def test_calls_before_init_are_uninitialized() -> None:
    install("pcie4")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_init_and_shutdown_are_reference_counted() -> None:
    install("pcie4")
    fake = pynvml.nvmlLib
    assert isinstance(fake, FakeNvmlLibrary)
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 4
    pynvml.nvmlShutdown()
    assert fake.init_count == 0
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_symbols_the_fake_lacks_raise_function_not_found() -> None:
    with running("pcie4") as gpus:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetPowerUsage(gpus[0])
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlEventSetCreate()


def test_system_and_device_facts() -> None:
    with running("dgx-a100"):
        assert pynvml.nvmlSystemGetDriverVersion()
        assert pynvml.nvmlDeviceGetCount() == 8
        gpu0, gpu7 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(7)
        assert pynvml.nvmlDeviceGetName(gpu0) == "NVIDIA A100-SXM4-40GB"
        memory = pynvml.nvmlDeviceGetMemoryInfo(gpu0)
        assert memory.total == 40960 * 1024 * 1024
        assert memory.used == 0
        assert pynvml.nvmlDeviceGetPciInfo(gpu7).busId == "00000000:BD:00.0"
        assert pynvml.nvmlDeviceGetNumaNodeId(gpu0) == 3
        assert pynvml.nvmlDeviceGetNumaNodeId(gpu7) == 5
        # NUMA node 3 owns CPUs 48-63 and 176-191: bits 48-63 of words 0 and 2
        words = list(pynvml.nvmlDeviceGetCpuAffinity(gpu0, 4))
        assert words == [0xFFFF << 48, 0, 0xFFFF << 48, 0]
        assert pynvml.nvmlDeviceGetMigMode(gpu0) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 0
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses(gpu0) == []
        utilization = pynvml.nvmlDeviceGetUtilizationRates(gpu0)
        assert (utilization.gpu, utilization.memory) == (0, 0)
        assert pynvml.nvmlDeviceGetTotalEccErrors(gpu0, 1, 1) == 0
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(8)


def test_cpu_affinity_is_cut_to_the_set_size_the_caller_gives() -> None:
    with running("dgx-a100") as gpus:
        assert list(pynvml.nvmlDeviceGetCpuAffinity(gpus[0], 1)) == [0xFFFF << 48]


# -- NVLink ---------------------------------------------------------------------------------------------


def test_nvswitch_lanes_all_end_at_switches() -> None:
    description = load_description(resolve_topology("dgx-a100"))
    switch_buses = [switch["bus"] for switch in description["nvswitches"]]
    install_fake_nvml(description, "node01")
    pynvml.nvmlInit()
    try:
        gpu3 = handles()[3]
        for link in range(12):
            assert pynvml.nvmlDeviceGetNvLinkState(gpu3, link) == pynvml.NVML_NVLINK_STATE_ACTIVE
            assert (
                pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(gpu3, link)
                == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
            )
            assert pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpu3, link).busId == switch_buses[link // 2]
            assert pynvml.nvmlDeviceGetNvLinkVersion(gpu3, link) == 3
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(gpu3, 12)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(gpu3, pynvml.NVML_NVLINK_MAX_LINKS)
    finally:
        pynvml.nvmlShutdown()


def test_direct_lanes_lead_to_the_peer_gpu() -> None:
    with running("dgx1v") as gpus:
        bus = [pynvml.nvmlDeviceGetPciInfo(handle).busId for handle in gpus]
        remotes = [pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpus[0], link).busId for link in range(6)]
        # dgx1v.toml: G0 has 1 lane to G1, 1 to G2, 2 to G3, 2 to G4
        assert remotes == [bus[1], bus[2], bus[3], bus[3], bus[4], bus[4]]
        assert {pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(gpus[0], link) for link in range(6)} == {
            pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        }
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(gpus[0], 6)


def test_unwired_lanes_below_the_lane_count_are_invalid_argument(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_MACHINE.replace("[[0,1,2]]", "[[0,1,1]]"))
    with running(str(path)) as gpus:
        assert pynvml.nvmlDeviceGetNvLinkState(gpus[0], 0) == pynvml.NVML_NVLINK_STATE_ACTIVE
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(gpus[0], 1)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNvLinkState(gpus[0], 2)


def test_gpus_without_nvlink_answer_not_supported_on_every_lane() -> None:
    with running("pcie8") as gpus:
        for link in (0, 1, 35):
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(gpus[0], link)


# -- PCIe topology and P2P ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "first", "second", "level"),
    [
        ("pcie8", 0, 0, pynvml.NVML_TOPOLOGY_INTERNAL),
        ("pcie8", 0, 1, pynvml.NVML_TOPOLOGY_SINGLE),  # same PCIe switch
        ("pcie8", 0, 2, pynvml.NVML_TOPOLOGY_NODE),  # other host bridge, same socket
        ("pcie8", 3, 4, pynvml.NVML_TOPOLOGY_SYSTEM),  # across sockets
        ("dgx1v", 0, 2, pynvml.NVML_TOPOLOGY_HOSTBRIDGE),  # two switches under one host bridge
        ("pcie4", 0, 1, pynvml.NVML_TOPOLOGY_NODE),  # no switch given: never PIX
    ],
)
def test_common_ancestor_follows_the_description(name: str, first: int, second: int, level: int) -> None:
    with running(name) as gpus:
        assert pynvml.nvmlDeviceGetTopologyCommonAncestor(gpus[first], gpus[second]) == level
        assert pynvml.nvmlDeviceGetTopologyCommonAncestor(gpus[second], gpus[first]) == level


def test_p2p_status() -> None:
    read, nvlink = 0, pynvml.NVML_P2P_CAPS_INDEX_NVLINK  # pynvml's READ constant is a tuple by mistake
    with running("dgx1v") as gpus:
        assert pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[1], nvlink) == pynvml.NVML_P2P_STATUS_OK
        assert pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[5], nvlink) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        assert (
            pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[5], read)
            == pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
        )
        assert pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[2], read) == pynvml.NVML_P2P_STATUS_OK
    with running("dgx-a100") as gpus:
        assert pynvml.nvmlDeviceGetP2PStatus(gpus[0], gpus[7], nvlink) == pynvml.NVML_P2P_STATUS_OK


# -- failure modes --------------------------------------------------------------------------------------


def test_missing_library_mode() -> None:
    install_missing_nvml()
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, pynvml.NVMLError_DriverNotLoaded),
        (pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVMLError_NoPermission),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, pynvml.NVMLError_LibRmVersionMismatch),
    ],
)
def test_failing_init_modes(code: int, error: type[Exception]) -> None:
    install_failing_nvml(code)
    with pytest.raises(error):
        pynvml.nvmlInit()


def test_injected_failures() -> None:
    failures = {
        "nvmlDeviceGetNumaNodeId": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetNvLinkRemoteDeviceType": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }
    with running("pcie4", failures=failures) as gpus:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetNumaNodeId(gpus[0])
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(gpus[0], 0)
        assert pynvml.nvmlDeviceGetNvLinkState(gpus[0], 0) == pynvml.NVML_NVLINK_STATE_ACTIVE


def test_reinstalling_replaces_the_previous_fake_everywhere() -> None:
    with running("dgx1v") as gpus:
        assert len(gpus) == 8
    # pynvml caches symbols by name; the new fake must answer, not the cached old one
    with running("pcie4") as gpus:
        assert len(gpus) == 4


def test_uninstall_removes_the_fake() -> None:
    install("pcie4")
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    uninstall_fake_nvml()
    assert pynvml.nvmlLib is None
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_device_minors_and_gpu_accounting_through_nvml() -> None:
    from garrison.nodeagent.gpu import accounting
    from garrison.nodeagent.gpu.accounting import attempt_gpu_usage
    from garrison.nodeagent.gpu.minors import device_minors

    accounting._no_accounting_until.clear()  # what an earlier test here found
    install("dgx-a100")
    assert device_minors(range(8)) == {i: i for i in range(8)}  # the fake's minors are its indices
    # The fake library has no per-process accounting (nor has a driver with accounting mode off): no
    # figures rather than invented ones; a real driver's are read through the same calls.
    assert attempt_gpu_usage([0, 1], started_at=0.0) is None
    assert attempt_gpu_usage([], started_at=0.0) is None
    uninstall_fake_nvml()
    accounting._no_accounting_until.clear()
    install_missing_nvml()
    assert device_minors([3]) == {3: 3}  # no NVML at all: the index stands


def test_gpus_without_accounting_are_not_asked_again_at_every_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU found without accounting (the fake library has none, as a driver with accounting mode off) is
    not asked again, nvmlInit included, until NO_ACCOUNTING_RECHECK_S has passed; other GPUs still are."""
    from garrison.nodeagent.gpu import accounting

    accounting._no_accounting_until.clear()
    install("dgx-a100")
    inits = []
    real_init = pynvml.nvmlInit
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: (inits.append(1), real_init())[1])
    try:
        assert accounting.attempt_gpu_usage([0, 1], started_at=0.0) is None
        assert len(inits) == 1
        assert accounting.attempt_gpu_usage([0], started_at=0.0) is None  # known: NVML not asked
        assert accounting.attempt_gpu_usage([5, 0], started_at=0.0) is None  # one known GPU answers for all
        assert len(inits) == 1
        assert accounting.attempt_gpu_usage([1], started_at=0.0) is None  # GPU 1 was not reached: asked now
        assert len(inits) == 2
        later = accounting.time.monotonic() + accounting.NO_ACCOUNTING_RECHECK_S + 1
        monkeypatch.setattr(accounting.time, "monotonic", lambda: later)
        assert accounting.attempt_gpu_usage([0], started_at=0.0) is None  # asked again after the recheck time
        assert len(inits) == 3
    finally:
        uninstall_fake_nvml()
        accounting._no_accounting_until.clear()
