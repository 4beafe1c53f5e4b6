"""`topo -m` rendering of each bundled machine, through install_fake_nvml + discover + render.

Set GARRISON_UPDATE_GOLDEN=1 to rewrite the golden files after an intended change, then review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from garrison.cli.topo import render_topo_matrix
from garrison.machines.description import TOPOLOGY_NAMES, load_description, resolve_topology
from garrison.model.domain import Gpu, NodeInventory
from garrison.nodeagent.gpu import discover, install_fake_nvml, uninstall_fake_nvml

GOLDEN_DIR = Path(__file__).parent / "golden"

# nvml.md: DGX-1V (6 links per V100; G0-G3 NUMA 0, G4-G7 NUMA 1)
DGX1V_EXPECTED = """\
G0    X   NV1 NV1 NV2 NV2 SYS SYS SYS
G1    NV1 X   NV2 NV1 SYS NV2 SYS SYS
G2    NV1 NV2 X   NV2 SYS SYS NV1 SYS
G3    NV2 NV1 NV2 X   SYS SYS SYS NV1
G4    NV2 SYS SYS SYS X   NV1 NV1 NV2
G5    SYS NV2 SYS SYS NV1 X   NV2 NV1
G6    SYS SYS NV1 SYS NV1 NV2 X   NV2
G7    SYS SYS SYS NV1 NV2 NV1 NV2 X
"""


@pytest.fixture(autouse=True)
def no_fake_left_behind() -> Iterator[None]:
    uninstall_fake_nvml()
    yield
    uninstall_fake_nvml()


def render(name: str) -> str:
    install_fake_nvml(load_description(resolve_topology(name)), "node01")
    return render_topo_matrix(discover("node01"))


def label_rows(rendered: str) -> dict[str, list[str]]:
    """GPU name -> its link labels, read back from the rendered text."""
    lines = rendered.splitlines()
    gpu_count = len(lines) - 1
    return {line.split()[0]: line.split()[1 : 1 + gpu_count] for line in lines[1:]}


@pytest.mark.parametrize("name", TOPOLOGY_NAMES)
def test_rendering_matches_golden_file(name: str) -> None:
    golden = GOLDEN_DIR / f"topo_{name}.txt"
    rendered = render(name)
    if os.environ.get("GARRISON_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_header_and_affinity_columns() -> None:
    lines = render("pcie4").splitlines()
    assert lines[0].split() == ["G0", "G1", "G2", "G3", "CPU", "Affinity", "NUMA", "Affinity"]
    assert lines[1].split()[-2:] == ["0-23,48-71", "0"]
    assert lines[4].split()[-2:] == ["24-47,72-95", "1"]


def test_dgx1v_matches_the_reference_matrix() -> None:
    rows = label_rows(render("dgx1v"))
    assert rows["G0"] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    expected = {line.split()[0]: line.split()[1:] for line in DGX1V_EXPECTED.splitlines()}
    assert rows == expected


def test_dgx_a100_is_nv12_between_every_pair() -> None:
    rows = label_rows(render("dgx-a100"))
    for i in range(8):
        assert rows[f"G{i}"] == ["X" if j == i else "NV12" for j in range(8)]


def test_pcie4_bridged_pairs_are_nv4_and_cross_socket_pairs_sys() -> None:
    rows = label_rows(render("pcie4"))
    assert rows == {
        "G0": ["X", "NV4", "SYS", "SYS"],
        "G1": ["NV4", "X", "SYS", "SYS"],
        "G2": ["SYS", "SYS", "X", "NV4"],
        "G3": ["SYS", "SYS", "NV4", "X"],
    }


def test_pcie8_has_no_nvlink_and_follows_switches_and_sockets() -> None:
    rendered = render("pcie8")
    assert "NV" not in rendered
    rows = label_rows(rendered)
    assert rows["G0"] == ["X", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert rows["G6"] == ["SYS", "SYS", "SYS", "SYS", "NODE", "NODE", "X", "PIX"]


def test_a_node_without_gpus_renders_a_short_note() -> None:
    inventory = NodeInventory(hostname="cpu01", gpus=(), nvlink=(), topo=(), cpus=8, memory_mb=1024)
    assert render_topo_matrix(inventory) == "no GPUs\n"


def test_unknown_numa_node_and_affinity_render_as_not_available() -> None:
    gpu = Gpu(
        index=0,
        uuid="GPU-x",
        name="g",
        memory_mib=1,
        pci_bus_id="00000000:01:00.0",
        numa_node=-1,
        cpu_affinity="",
    )
    inventory = NodeInventory(hostname="n", gpus=(gpu,), nvlink=((0,),), topo=(("X",),), cpus=1, memory_mb=1)
    assert render_topo_matrix(inventory).splitlines()[1].split() == ["G0", "X", "N/A", "N/A"]
