"""gsim clusters: the NxG[:TOPOLOGY][/NODES_PER_SWITCH] spec, cluster files, and NVLink matrices that match
what a real agent discovers through (fake) NVML on the same machine description."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from garrison.controller.sim.cluster import ClusterError, parse_cluster
from garrison.machines.description import TOPOLOGY_NAMES, load_description, resolve_topology
from garrison.nodeagent.gpu.discovery import discover
from garrison.nodeagent.gpu.fake_nvml import FakeNvmlLibrary, install_fake_nvml, uninstall_fake_nvml


@pytest.fixture(autouse=True)
def _no_fake_left_behind() -> Iterator[None]:
    uninstall_fake_nvml()
    yield
    uninstall_fake_nvml()


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_a_simulated_node_has_the_inventory_an_agent_discovers(name: str) -> None:
    install_fake_nvml(load_description(resolve_topology(name)), "probe")
    expected = discover("probe")
    uninstall_fake_nvml()
    (node,) = parse_cluster(f"1x{len(expected.gpus)}:{name}").nodes
    # Everything but the UUIDs, which the fake derives from the node name.
    assert [replace(g, uuid="") for g in node.inventory.gpus] == [replace(g, uuid="") for g in expected.gpus]
    assert node.nvlink == expected.nvlink and node.inventory.topo == expected.topo
    # The fake library was only borrowed: nothing is left installed.
    assert not isinstance(pynvml.nvmlLib, FakeNvmlLibrary)


def test_machine_wiring_reaches_the_scheduler_view() -> None:
    a100 = parse_cluster("1x8:dgx-a100").nodes[0]
    assert all(a100.nvlink[i][j] == 12 for i in range(8) for j in range(8) if i != j)
    v100 = parse_cluster("1x8:dgx1v").nodes[0]
    assert v100.nvlink[0][3] == 2 and v100.nvlink[0][5] == 0
    pcie = parse_cluster("1x8:pcie8").nodes[0]
    assert not any(any(row) for row in pcie.nvlink)
    assert pcie.inventory.topo[0][1] == "PIX" and pcie.inventory.topo[0][4] == "SYS"


def test_spec_with_topology_and_switches() -> None:
    cluster = parse_cluster("12x8:dgx-a100/4")
    assert [n.name for n in cluster.nodes] == [f"node{i}" for i in range(1, 13)]
    assert [n.switch for n in cluster.nodes] == ["sw1"] * 4 + ["sw2"] * 4 + ["sw3"] * 4
    assert cluster.total_gpus == 96 and cluster.max_gpus_per_node == 8 and cluster.nodes_per_switch == 4
    assert cluster.nodes[0].gpu_names == ("NVIDIA A100-SXM4-40GB",) * 8
    assert cluster.nodes[0].nvlink[0][1] == 12


def test_plain_spec_has_unlinked_gpus_under_one_switch() -> None:
    cluster = parse_cluster("3x2")
    assert [n.switch for n in cluster.nodes] == ["sw1"] * 3
    assert cluster.nodes[0].nvlink == ((0, 0), (0, 0))
    assert cluster.nodes[0].gpu_names == ("GPU", "GPU")
    assert cluster.describe() == "3x2 GPU; 6 GPUs; 1 switch(es)"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("12by8", "expected NODESxGPUS[:TOPOLOGY][/NODES_PER_SWITCH]"),
        ("0x8", "at least one node"),
        ("2x0", "a GPU count of at least 1"),
        ("2x8/0", "at least one node per switch"),
        ("2x4:dgx-a100", "topology 'dgx-a100' has 8 GPUs per node, not 4"),
        ("2x8:dgx-z", "unknown topology 'dgx-z'"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster(spec)


def test_cluster_file_for_a_mixed_cluster(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(
        'nodes_per_switch = 2\n'
        '[[nodes]]\ncount = 3\ntopology = "dgx-a100"\n'
        '[[nodes]]\ntopology = "dgx1v"\n'
        '[[nodes]]\ncount = 2\ngpus = 4\ngpu_name = "NVIDIA L40S"\nswitch = "edge"\n'
    )
    cluster = parse_cluster(str(path))
    assert [(n.name, n.gpu_count, n.switch, n.model) for n in cluster.nodes] == [
        ("node1", 8, "sw1", "dgx-a100"),
        ("node2", 8, "sw1", "dgx-a100"),
        ("node3", 8, "sw2", "dgx-a100"),
        ("node4", 8, "sw2", "dgx1v"),
        ("node5", 4, "edge", ""),
        ("node6", 4, "edge", ""),
    ]
    assert cluster.nodes[4].gpu_names == ("NVIDIA L40S",) * 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes = []\n", "expected at least one \\[\\[nodes\\]\\] table"),
        ("racks = 2\n[[nodes]]\ngpus = 8\n", "unknown key 'racks'"),
        ("[[nodes]]\ngpus = 8\ncolour = 'red'\n", r"nodes\[0\]: unknown key 'colour'"),
        ("[[nodes]]\ncount = 0\ngpus = 8\n", r"nodes\[0\].count: must be a whole number of at least 1"),
        ("[[nodes]]\ncount = 2\n", r"nodes\[0\]: give a GPU count of at least 1 or a topology"),
        ("nodes_per_switch = 0\n[[nodes]]\ngpus = 8\n", "nodes_per_switch must be a whole number"),
        ("[[nodes]\n", "invalid TOML"),
    ],
)
def test_bad_cluster_files_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    with pytest.raises(ClusterError, match=message):
        parse_cluster(str(path))
