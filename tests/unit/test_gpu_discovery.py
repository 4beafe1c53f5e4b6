"""discover() against fake machines: the real pynvml code path with a fake libnvidia-ml underneath."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pynvml
import pytest

from garrison.machines.description import TOPOLOGY_NAMES, fake_gpu_uuid, load_description, resolve_topology
from garrison.model.domain import NodeInventory
from garrison.nodeagent.gpu import (
    discover,
    format_cpu_list,
    install_failing_nvml,
    install_fake_nvml,
    install_missing_nvml,
    uninstall_fake_nvml,
)
from garrison.nodeagent.gpu.fake_nvml import FakeNvmlLibrary

DISCOVERY_LOGGER = "garrison.nodeagent.gpu.discovery"


@pytest.fixture(autouse=True)
def no_fake_left_behind() -> Iterator[None]:
    uninstall_fake_nvml()
    yield
    uninstall_fake_nvml()


def discover_fake(name: str, node: str = "node01", **options: Any) -> NodeInventory:
    install_fake_nvml(load_description(resolve_topology(name)), node, **options)
    return discover(node)


def nvml_is_shut_down() -> bool:
    fake = pynvml.nvmlLib
    assert isinstance(fake, FakeNvmlLibrary)
    return fake.init_count == 0


def expected_nvlink(description: dict[str, Any]) -> list[list[int]]:
    """The NVLink matrix straight from a description's direct pairs."""
    count = len(description["gpus"])
    matrix = [[0] * count for _ in range(count)]
    for a, b, lanes in description.get("nvlink_pairs", []):
        matrix[a][b] += lanes
        matrix[b][a] += lanes
    return matrix


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_gpus_match_the_machine_description(name: str) -> None:
    description = load_description(resolve_topology(name))
    cpus_of_numa = {node["id"]: node["cpus"] for node in description["numa"]}
    inventory = discover_fake(name, "gpu-node-3")

    assert inventory.hostname == "gpu-node-3"
    assert len(inventory.gpus) == len(description["gpus"])
    for gpu, spec in zip(inventory.gpus, description["gpus"], strict=True):
        assert gpu.index == spec["index"]
        assert gpu.uuid == fake_gpu_uuid("gpu-node-3", spec["index"])
        assert gpu.name == description["defaults"]["gpu_name"]
        assert gpu.memory_mib == description["defaults"]["memory_mib"]
        assert gpu.pci_bus_id == spec["bus"]
        assert gpu.numa_node == spec["numa"]
        assert gpu.cpu_affinity == cpus_of_numa[spec["numa"]]
        assert gpu.mig_enabled is False
    assert nvml_is_shut_down()


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_matrices_are_square_and_symmetric(name: str) -> None:
    inventory = discover_fake(name)
    count = len(inventory.gpus)
    assert len(inventory.nvlink) == len(inventory.topo) == count
    for i in range(count):
        assert inventory.nvlink[i][i] == 0
        assert inventory.topo[i][i] == "X"
        for j in range(count):
            assert inventory.nvlink[i][j] == inventory.nvlink[j][i]
            assert inventory.topo[i][j] == inventory.topo[j][i]


def test_dgx1v_hybrid_cube_mesh_links_are_counted_per_lane() -> None:
    description = load_description(resolve_topology("dgx1v"))
    inventory = discover_fake("dgx1v")
    # Slurm's Links= row for GPU0 is -1,1,1,2,2,0,0,0; the diagonal is 0 here
    assert inventory.nvlink[0] == (0, 1, 1, 2, 2, 0, 0, 0)
    assert [list(row) for row in inventory.nvlink] == expected_nvlink(description)


def test_dgx_a100_nvswitch_gpus_are_all_to_all_with_twelve_links() -> None:
    inventory = discover_fake("dgx-a100")
    for i, row in enumerate(inventory.nvlink):
        assert [links for j, links in enumerate(row) if j != i] == [12] * 7


def test_pcie4_links_only_the_bridged_pairs() -> None:
    inventory = discover_fake("pcie4")
    assert [list(row) for row in inventory.nvlink] == [[0, 4, 0, 0], [4, 0, 0, 0], [0, 0, 0, 4], [0, 0, 4, 0]]


def test_pcie8_has_no_nvlink() -> None:
    inventory = discover_fake("pcie8")
    assert all(links == 0 for row in inventory.nvlink for links in row)


def test_node_wide_facts_come_from_the_host() -> None:
    inventory = discover_fake("pcie4")
    assert inventory.cpus == os.cpu_count()
    assert inventory.memory_mb == psutil.virtual_memory().total // (1024 * 1024)
    assert inventory.model == ""


def test_per_gpu_overrides_in_a_description(tmp_path: Path) -> None:
    path = tmp_path / "mixed.toml"
    path.write_text(
        'name = "mixed"\n'
        'numa = [{id=0, cpus="0-7"}]\n'
        'defaults = {gpu_name = "Big GPU", memory_mib = 81920}\n'
        "gpus = [\n"
        '  {index=0, bus="00000000:01:00.0", numa=0},\n'
        '  {index=1, bus="00000000:02:00.0", numa=0, gpu_name="Small GPU", memory_mib=24576},\n'
        "]\n"
    )
    install_fake_nvml(load_description(path), "mixed01")
    inventory = discover("mixed01")
    assert [(gpu.name, gpu.memory_mib) for gpu in inventory.gpus] == [
        ("Big GPU", 81920),
        ("Small GPU", 24576),
    ]
    assert inventory.topo == (("X", "NODE"), ("NODE", "X"))


# -- no usable NVML -------------------------------------------------------------------------------------


def test_missing_library_gives_zero_gpus_and_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    install_missing_nvml()
    with caplog.at_level(logging.DEBUG, logger=DISCOVERY_LOGGER):
        inventory = discover("cpu-node-1")
    assert inventory.gpus == ()
    assert inventory.nvlink == ()
    assert inventory.topo == ()
    assert inventory.hostname == "cpu-node-1"
    assert inventory.cpus == os.cpu_count()
    records = [record for record in caplog.records if record.name == DISCOVERY_LOGGER]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    message = records[0].getMessage()
    assert "\n" not in message
    assert "cpu-node-1" in message
    assert "libnvidia-ml" in message


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_unusable_driver_gives_zero_gpus_and_one_warning(
    caplog: pytest.LogCaptureFixture, code: int, reason: str
) -> None:
    install_failing_nvml(code)
    with caplog.at_level(logging.DEBUG, logger=DISCOVERY_LOGGER):
        inventory = discover("node09")
    assert inventory.gpus == ()
    records = [record for record in caplog.records if record.name == DISCOVERY_LOGGER]
    assert len(records) == 1
    assert reason in records[0].getMessage()


def test_failure_after_init_still_shuts_nvml_down(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=DISCOVERY_LOGGER):
        inventory = discover_fake("dgx1v", failures={"nvmlDeviceGetCount_v2": pynvml.NVML_ERROR_UNKNOWN})
    assert inventory.gpus == ()
    assert len(caplog.records) == 1
    assert nvml_is_shut_down()


def test_gpus_that_cannot_be_read_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=DISCOVERY_LOGGER):
        inventory = discover_fake("pcie4", failures={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_GPU_IS_LOST})
    assert inventory.gpus == ()
    assert len(caplog.records) == 4
    assert all("GPU is lost" in record.getMessage() for record in caplog.records)
    assert nvml_is_shut_down()


# -- older or partial drivers ---------------------------------------------------------------------------


def test_without_remote_device_type_direct_links_are_still_found() -> None:
    description = load_description(resolve_topology("dgx1v"))
    inventory = discover_fake(
        "dgx1v", failures={"nvmlDeviceGetNvLinkRemoteDeviceType": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
    )
    assert [list(row) for row in inventory.nvlink] == expected_nvlink(description)


def test_without_the_nvlink_api_pcie_labels_are_used() -> None:
    inventory = discover_fake(
        "dgx1v", failures={"nvmlDeviceGetNvLinkState": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
    )
    assert all(links == 0 for row in inventory.nvlink for links in row)
    assert inventory.topo[0] == ("X", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS")


def test_without_numa_ids_the_numa_node_is_unknown() -> None:
    inventory = discover_fake("pcie8", failures={"nvmlDeviceGetNumaNodeId": pynvml.NVML_ERROR_NOT_SUPPORTED})
    assert {gpu.numa_node for gpu in inventory.gpus} == {-1}
    assert inventory.gpus[0].cpu_affinity == "0-31,64-95"
    assert inventory.topo[0][1] == "PIX"


def test_without_the_pcie_tree_numa_nodes_decide_between_node_and_sys() -> None:
    inventory = discover_fake(
        "pcie8", failures={"nvmlDeviceGetTopologyCommonAncestor": pynvml.NVML_ERROR_NOT_SUPPORTED}
    )
    assert inventory.topo[0] == ("X", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS")


def test_mig_mode_not_supported_means_no_mig() -> None:
    inventory = discover_fake("dgx1v", failures={"nvmlDeviceGetMigMode": pynvml.NVML_ERROR_NOT_SUPPORTED})
    assert len(inventory.gpus) == 8
    assert not any(gpu.mig_enabled for gpu in inventory.gpus)


# -- cpu lists ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        ([], ""),
        ([5], "5"),
        ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
        ([*range(40, 60), *range(0, 20)], "0-19,40-59"),
        ([3, 3, 2], "2-3"),
    ],
)
def test_format_cpu_list(cpus: list[int], text: str) -> None:
    assert format_cpu_list(cpus) == text
