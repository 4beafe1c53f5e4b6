"""The pure scheduling core: gang placement, NVLink-aware device choice, queue order, reasons."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.placement import pick_connected_gpus, place
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import NodeView, PendingJob, Snapshot
from garrison.model.domain import JobSpec

# DGX-1V hybrid cube-mesh NVLink lanes (see garrison/machines/topologies/dgx1v.toml).
DGX1V_PAIRS = [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2), (2, 6, 1),
               (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2)]


def dgx1v_matrix() -> tuple[tuple[int, ...], ...]:
    m = [[0] * 8 for _ in range(8)]
    for a, b, n in DGX1V_PAIRS:
        m[a][b] = m[b][a] = n
    return tuple(tuple(r) for r in m)


def node(name: str, gpus: int = 8, free: set[int] | None = None, nvlink=(), gpu_name: str = "NVIDIA A100") -> NodeView:
    return NodeView(
        name=name,
        schedulable=True,
        gpu_names=(gpu_name,) * gpus,
        free_gpus=frozenset(range(gpus) if free is None else free),
        nvlink=nvlink,
        partitions=frozenset({"main"}),
    )


def pending(job_id: int, **spec: object) -> PendingJob:
    return PendingJob(job_id=job_id, spec=JobSpec(name="j", command=("true",), **spec), partition="main",  # type: ignore[arg-type]
                      submit_time=float(job_id))


def test_gang_is_placed_whole_or_not_at_all() -> None:
    nodes = [node("a", free={0, 1, 2, 3}), node("b", free={0, 1, 2, 3, 4, 5, 6, 7})]
    assert place(JobSpec(name="j", command=("x",), nodes=2, gpus_per_node=8), nodes) is None
    alloc = place(JobSpec(name="j", command=("x",), nodes=2, gpus_per_node=4), nodes)
    assert alloc is not None
    assert sorted(len(n.gpus) for n in alloc.nodes) == [4, 4]


def test_total_gpus_prefer_one_node_then_fewest_nodes() -> None:
    nodes = [node("a", free={0, 1}), node("b", free=set(range(6))), node("c", free=set(range(4)))]
    one = place(JobSpec(name="j", command=("x",), gpus=4), nodes)
    assert one is not None and one.node_names == ("c",)  # best fit: the tightest node that fits
    spread = place(JobSpec(name="j", command=("x",), gpus=10), nodes)
    assert spread is not None and spread.node_names == ("b", "c") and spread.gpu_count() == 10
    assert place(JobSpec(name="j", command=("x",), gpus=13), nodes) is None


def test_dgx1v_four_gpu_job_gets_a_fully_connected_quad() -> None:
    quad = pick_connected_gpus(list(range(8)), 4, dgx1v_matrix())
    m = dgx1v_matrix()
    assert all(m[a][b] > 0 for a in quad for b in quad if a != b), quad


def test_typed_gpus_match_names() -> None:
    nodes = [node("v", gpu_name="Tesla V100-SXM2-16GB"), node("a", gpu_name="NVIDIA A100-SXM4-40GB")]
    alloc = place(JobSpec(name="j", command=("x",), gpus=2, gpu_type="a100"), nodes)
    assert alloc is not None and alloc.node_names == ("a",)
    assert place(JobSpec(name="j", command=("x",), gpus=2, gpu_type="h100"), nodes) is None


def test_fifo_blocked_job_blocks_lower_priority_in_its_partition() -> None:
    snap = Snapshot(nodes=(node("a", free={0, 1}),), pending=(pending(1, gpus=4), pending(2, gpus=1)))
    plan = schedule(snap, now=0.0, config=preset("fifo"))
    assert plan.starts == ()
    assert plan.waiting == {1: Reason.RESOURCES, 2: Reason.PRIORITY}


def test_fifo_order_and_array_limit() -> None:
    jobs = tuple(
        PendingJob(job_id=i, spec=JobSpec(name="a", command=("x",), gpus=1, array_max_running=2), partition="main",
                   submit_time=0.0, array_job_id=10)
        for i in range(10, 14)
    )
    plan = schedule(Snapshot(nodes=(node("a"),), pending=jobs), now=0.0)
    assert [s.job_id for s in plan.starts] == [10, 11]
    assert plan.waiting == {12: Reason.ARRAY_LIMIT, 13: Reason.ARRAY_LIMIT}


def test_job_that_cannot_run_on_up_nodes_does_not_block_others() -> None:
    down = NodeView(name="big", schedulable=False, gpu_names=("g",) * 8, free_gpus=frozenset(range(8)), nvlink=(),
                    partitions=frozenset({"main"}))
    snap = Snapshot(nodes=(down, node("small", gpus=2)), pending=(pending(1, gpus=8), pending(2, gpus=1)))
    plan = schedule(snap, now=0.0)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.waiting[1] == Reason.NODES_UNAVAILABLE


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.sets(st.integers(0, 7)), min_size=1, max_size=6),
    requests=st.lists(
        st.one_of(
            st.builds(lambda g: {"gpus": g}, st.integers(1, 20)),
            st.builds(lambda n, g: {"nodes": n, "gpus_per_node": g}, st.integers(1, 4), st.integers(1, 8)),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_property_no_gpu_twice_gangs_whole_and_deterministic(free: list[set[int]], requests: list[dict]) -> None:
    nodes = tuple(node(f"n{i}", free=f) for i, f in enumerate(free))
    jobs = tuple(pending(i + 1, **r) for i, r in enumerate(requests))
    snap = Snapshot(nodes=nodes, pending=jobs)
    plan = schedule(snap, now=0.0)
    assert plan == schedule(snap, now=0.0)
    used: set[tuple[str, int]] = set()
    by_id = {j.job_id: j for j in jobs}
    for start in plan.starts:
        spec = by_id[start.job_id].spec
        assert start.allocation.gpu_count() == spec.total_gpus()  # whole gang, never partial
        if spec.nodes is not None:
            assert len(start.allocation.nodes) == spec.nodes
        for n in start.allocation.nodes:
            for g in n.gpus:
                assert (n.node, g) not in used
                assert g in nodes[int(n.node[1:])].free_gpus
                used.add((n.node, g))
    assert set(plan.waiting) | {s.job_id for s in plan.starts} == set(by_id)
