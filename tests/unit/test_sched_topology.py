"""Topology-aware placement on the real machine descriptions and on a multi-switch cluster.

The node views are built from what an agent discovers through the fake NVML library on each machine
description (the same path as a real node), so the NVLink lanes and PCIe labels are the real ones.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import NOW, machine, node, pending, view_of

from garrison.controller.sched.cycle import schedule
from garrison.controller.sched.placement import place
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot, parse_cpu_list
from garrison.controller.sched.topology import gpu_affinity
from garrison.model.domain import JobSpec


@pytest.fixture(scope="module")
def dgx1v():  # type: ignore[no-untyped-def]
    return replace(machine("dgx1v"), cpus=80)


def spec(**fields: object) -> JobSpec:
    return JobSpec(name="j", command=("true",), **fields)  # type: ignore[arg-type]


def fully_nvlinked(gpus: tuple[int, ...], nvlink: tuple[tuple[int, ...], ...]) -> bool:
    return all(nvlink[a][b] > 0 for a in gpus for b in gpus if a != b)


def test_dgx1v_quads_are_fully_nvlink_connected(dgx1v) -> None:  # type: ignore[no-untyped-def]
    first = place(spec(gpus=4), [view_of(dgx1v, "v")])
    assert first is not None
    quad = first.nodes[0].gpus
    assert fully_nvlinked(quad, dgx1v.nvlink), quad
    # The other half is a fully connected quad too, and it is what a second 4-GPU job gets.
    rest = set(range(8)) - set(quad)
    second = place(spec(gpus=4), [view_of(dgx1v, "v", free=rest)])
    assert second is not None and fully_nvlinked(second.nodes[0].gpus, dgx1v.nvlink)
    assert set(second.nodes[0].gpus) == rest


def test_dgx1v_pair_takes_a_double_nvlink(dgx1v) -> None:  # type: ignore[no-untyped-def]
    pair = place(spec(gpus=2), [view_of(dgx1v, "v")])
    assert pair is not None
    a, b = pair.nodes[0].gpus
    assert dgx1v.nvlink[a][b] == 2


def test_dgx1v_quad_avoids_broken_sets_when_one_gpu_is_busy(dgx1v) -> None:  # type: ignore[no-untyped-def]
    # GPU 0 busy: the only fully connected quad left is 4-7.
    quad = place(spec(gpus=4), [view_of(dgx1v, "v", free=set(range(1, 8)))])
    assert quad is not None and quad.nodes[0].gpus == (4, 5, 6, 7)


def test_dgx_a100_nvswitch_makes_every_set_equal() -> None:
    inventory = machine("dgx-a100")
    affinity = gpu_affinity(inventory.nvlink, inventory.topo)
    assert len({affinity[i][j] for i in range(8) for j in range(8) if i != j}) == 1
    job = place(spec(gpus=3), [view_of(inventory, "a", free={1, 4, 6, 7})])
    assert job is not None and job.nodes[0].gpus == (1, 4, 6)  # lowest indices: any set is as good


def test_pcie4_pairs_stay_on_their_nvlink_bridge() -> None:
    inventory = machine("pcie4")
    first = place(spec(gpus=2), [view_of(inventory, "p")])
    assert first is not None and first.nodes[0].gpus == (0, 1)
    # With GPU 0 busy, the bridged pair 2-3 beats the cross-socket 1-2.
    second = place(spec(gpus=2), [view_of(inventory, "p", free={1, 2, 3})])
    assert second is not None and second.nodes[0].gpus == (2, 3)


def test_pcie8_prefers_same_switch_then_same_numa_node() -> None:
    inventory = machine("pcie8")
    topo = inventory.topo
    pair = place(spec(gpus=2), [view_of(inventory, "p")])
    assert pair is not None
    a, b = pair.nodes[0].gpus
    assert topo[a][b] == "PIX"
    # Free GPUs 1, 2 and 5: no PIX pair left; the pair on one NUMA node beats the cross-socket one.
    free = {1, 2, 5}
    labels = {(x, y): topo[x][y] for x in free for y in free if x < y}
    assert "NODE" in labels.values() and "SYS" in labels.values()
    pair = place(spec(gpus=2), [view_of(inventory, "p", free=free)])
    assert pair is not None
    a, b = pair.nodes[0].gpus
    assert topo[a][b] == "NODE"


def test_cpus_come_from_the_numa_node_of_the_gpus(dgx1v) -> None:  # type: ignore[no-untyped-def]
    job = place(spec(gpus=4, cpus_per_gpu=4, mem_mb=1024), [view_of(dgx1v, "v", free={4, 5, 6, 7})])
    assert job is not None
    alloc = job.nodes[0]
    local = parse_cpu_list(dgx1v.gpus[4].cpu_affinity)
    assert alloc.gpus == (4, 5, 6, 7) and len(alloc.cpus) == 16 and set(alloc.cpus) <= local
    assert alloc.mem_mb == 1024


def test_cpu_and_memory_requests_must_fit(dgx1v) -> None:  # type: ignore[no-untyped-def]
    assert place(spec(gpus=1, cpus_per_gpu=81), [view_of(dgx1v, "v")]) is None
    assert place(spec(gpus=1, mem_mb=dgx1v.memory_mb + 1), [view_of(dgx1v, "v")]) is None


def test_gpu_memory_and_type_select_nodes() -> None:
    v100 = view_of(machine("dgx1v"), "v")
    a100 = view_of(machine("dgx-a100"), "a")
    assert place(spec(gpus=1, gpu_mem_mb=20_000), [v100, a100]).node_names == ("a",)  # type: ignore[union-attr]
    assert place(spec(gpus=1, gpu_mem_mb=20_000, gpu_type="v100"), [v100, a100]) is None
    assert place(spec(gpus=2, gpu_type="v100"), [v100, a100]).node_names == ("v",)  # type: ignore[union-attr]


# -- across nodes ------------------------------------------------------------------------------------------


def switched_cluster(busy_on_s1: bool = False) -> list:  # type: ignore[type-arg]
    """Two blocks: s1 (a0-a3) and s2 (b0-b3) under block x; s3 (c0-c3) under block y."""
    out = []
    for prefix, path in (("a", ("x", "s1")), ("b", ("x", "s2")), ("c", ("y", "s3"))):
        for i in range(4):
            free = set(range(4)) if busy_on_s1 and prefix == "a" and i < 2 else None
            out.append(node(f"{prefix}{i}", free=free, switches=path))
    return out


def test_a_gang_that_fits_under_one_switch_stays_there() -> None:
    nodes = switched_cluster(busy_on_s1=True)
    job = place(spec(nodes=4, gpus_per_node=8), nodes)
    assert job is not None
    switches = {next(n for n in nodes if n.name == name).switches for name in job.node_names}
    assert len(switches) == 1 and switches != {("x", "s1")}  # s1 has only two whole nodes free


def test_a_gang_too_big_for_a_switch_stays_in_its_block_with_neighbours_adjacent() -> None:
    nodes = switched_cluster()
    job = place(spec(nodes=6, gpus_per_node=8), nodes)
    assert job is not None
    assert all(name[0] in "ab" for name in job.node_names)  # one block, not spread to block y
    # Ranks in node-list order (here names follow the switches, so one switch's nodes are consecutive ranks).
    prefixes = [name[0] for name in job.node_names]
    assert prefixes == sorted(prefixes)


def test_a_gangs_ranks_follow_its_node_list_as_in_slurm() -> None:
    """Rank 0 (and the batch script) on the first host of SLURM_JOB_NODELIST, whatever the switches: scripts,
    submitit and Lightning take the head node from the list. Numbers in names count as numbers (node2 before
    node10), as the list writes them (node[2,10])."""
    nodes = [node("node2", switches=("s1",)), node("node10", switches=("s1",)), node("node1", switches=("s2",))]
    job = place(spec(nodes=3, gpus_per_node=8), nodes)
    assert job is not None and job.node_names == ("node1", "node2", "node10")
    pair = place(spec(nodes=2, gpus_per_node=8), nodes[:2])
    assert pair is not None and pair.node_names == ("node2", "node10")
    spread = place(spec(gpus=16), [node("gpu10"), node("gpu9")])
    assert spread is not None and spread.node_names == ("gpu9", "gpu10")


def test_total_gpus_spread_over_the_fewest_nodes_of_the_tightest_group() -> None:
    nodes = switched_cluster(busy_on_s1=True)
    job = place(spec(gpus=12), nodes)
    assert job is not None
    # Two whole-ish nodes are enough; they share a switch.
    assert len(job.nodes) == 2
    switches = {next(n for n in nodes if n.name == name).switches for name in job.node_names}
    assert len(switches) == 1


def test_local_ranks_are_consecutive_on_each_node() -> None:
    job = place(spec(nodes=2, gpus_per_node=4), switched_cluster())
    assert job is not None
    assert [len(n.gpus) for n in job.nodes] == [4, 4]  # node rank order = allocation order


def test_small_jobs_pack_so_whole_nodes_stay_free() -> None:
    nodes = [node("a"), node("b", free={5, 6, 7}), node("c")]
    plan = schedule(Snapshot(nodes=tuple(nodes), pending=(pending(1, gpus=2), pending(2, gpus=1),
                                                          pending(3, nodes=2, gpus_per_node=8))),
                    NOW, preset("garrison"))
    placed = {s.job_id: s.allocation.node_names for s in plan.starts}
    assert placed[1] == ("b",) and placed[2] == ("b",)
    assert set(placed[3]) == {"a", "c"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*(f"node{i}" for i in range(1, 30)), *(f"gpu{i:02d}" for i in range(1, 12)),
                                 "n7", "n07", "login", "a10"]), min_size=2, max_size=8, unique=True))
def test_a_gangs_nodes_come_in_their_node_lists_order(names: list[str]) -> None:
    """Rank order is the order SLURM_JOB_NODELIST names the nodes in (compress_hostlist's), whether the names
    share a prefix (numbers alone order them: the common case, without building the list) or not."""
    from types import SimpleNamespace

    from garrison.controller.sched.placement import _in_node_list_order
    from garrison.model.hostlist import compress_hostlist, expand_hostlist

    chosen = [(SimpleNamespace(view=SimpleNamespace(name=name)), 1) for name in names]
    ordered = [candidate.view.name for candidate, _ in _in_node_list_order(chosen)]  # type: ignore[arg-type]
    assert ordered == expand_hostlist(compress_hostlist(names))
