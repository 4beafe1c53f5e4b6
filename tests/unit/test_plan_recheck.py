"""The plan re-check (AttemptLedger.review) checks what placement checked: node, GPUs, CPUs and host memory.

- a start on CPUs a live attempt holds, or on memory the node no longer has, is rejected with a typed
  reason (CPUS_TAKEN, MEMORY_SHORT) naming the node, and the engine logs and counts it (metrics);
- property (hypothesis): the core's plan on a fresh snapshot of a real ClusterState (in-memory SQLite
  store) is never rejected by the re-check, whatever runs and whatever the queue asks for.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from garrison.controller.ledger import Rejected
from garrison.controller.sched.cycle import Plan, Start, schedule
from garrison.controller.sched.presets import preset
from garrison.controller.state import ClusterState
from garrison.controller.store import open_store
from garrison.model.domain import Allocation, Gpu, Job, JobSpec, NodeAllocation, NodeInventory

CPUS = 16
MEMORY_MB = 8000


def inventory(name: str, gpus: int) -> NodeInventory:
    return NodeInventory(
        hostname=name,
        gpus=tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100", 40960, f"0000:{i:02x}:00.0", 0, f"0-{CPUS - 1}")
                   for i in range(gpus)),
        nvlink=tuple(tuple(0 if i == j else 12 for j in range(gpus)) for i in range(gpus)),
        topo=(),
        cpus=CPUS,
        memory_mb=MEMORY_MB,
    )


def new_state(nodes: dict[str, int]) -> ClusterState:
    state = ClusterState(open_store("sqlite://"), heartbeat_timeout_s=1e9)
    state.load(0.0, retention_s=1e9)
    for name, gpus in nodes.items():
        state.register_node(name, inventory(name, gpus), frozenset({"main"}), [], [], 0.0)
    return state


def job(job_id: int, **spec: object) -> Job:
    return Job(job_id=job_id, spec=JobSpec(name="t", command=("true",), **spec),  # type: ignore[arg-type]
               user="alice", uid=1000, gid=1000, account="default", partition="main", time_limit_s=600,
               submit_time=float(job_id))


def start(state: ClusterState, job_id: int, node: str, gpus: tuple[int, ...], cpus: tuple[int, ...], mem: int,
          now: float = 1.0) -> None:
    state.add_jobs([job(job_id, gpus=len(gpus) or None)])
    state.start_attempts([(job_id, Allocation((NodeAllocation(node, gpus, cpus, mem),)))], now)


def test_a_start_on_held_cpus_or_missing_memory_is_rejected_with_the_node() -> None:
    state = new_state({"n1": 4})
    start(state, 1, "n1", (0,), (0, 1, 2, 3), 6000)
    state.add_jobs([job(2, gpus=1), job(3, gpus=1), job(4, gpus=1), job(5, gpus=1)])
    plan = Plan(starts=(
        Start(2, Allocation((NodeAllocation("n1", (1,), (3, 4), 100),))),  # CPU 3 is job 1's
        Start(3, Allocation((NodeAllocation("n1", (2,), (5,), 3000),))),  # 6000 + 3000 > 8000
        Start(4, Allocation((NodeAllocation("n1", (2,), (CPUS,), 0),))),  # no such CPU
        Start(5, Allocation((NodeAllocation("n1", (3,), (6, 7), 2000),))),  # fits
    ))
    result, _ = state.apply_plan(plan, 2.0)
    assert [(r.job_id, r.reason, r.node) for r in result.rejected] == [
        (2, Rejected.CPUS_TAKEN, "n1"), (3, Rejected.MEMORY_SHORT, "n1"), (4, Rejected.CPUS_TAKEN, "n1")]
    assert [s.job_id for s in result.started] == [5]


def test_two_starts_of_one_plan_may_not_share_cpus_or_overfill_memory() -> None:
    state = new_state({"n1": 4})
    state.add_jobs([job(1, gpus=1), job(2, gpus=1), job(3, gpus=1)])
    plan = Plan(starts=(
        Start(1, Allocation((NodeAllocation("n1", (0,), (0, 1), 5000),))),
        Start(2, Allocation((NodeAllocation("n1", (1,), (1, 2), 0),))),
        Start(3, Allocation((NodeAllocation("n1", (2,), (4,), 5000),))),
    ))
    result, _ = state.apply_plan(plan, 2.0)
    assert [(r.job_id, r.reason) for r in result.rejected] == [(2, Rejected.CPUS_TAKEN), (3, Rejected.MEMORY_SHORT)]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, int], list[tuple[str, tuple[int, ...], tuple[int, ...], int]],
                                      list[dict[str, object]]]:
    nodes = {f"n{i}": draw(st.sampled_from([2, 4, 8])) for i in range(draw(st.integers(1, 4)))}
    runs = []
    for name, gpus in nodes.items():
        free_gpus, free_cpus, memory = list(range(gpus)), list(range(CPUS)), MEMORY_MB
        for _ in range(draw(st.integers(0, 2))):
            g = draw(st.integers(0, len(free_gpus)))
            c = draw(st.integers(0, len(free_cpus)))
            m = draw(st.integers(0, memory))
            if g == 0 and c == 0 and m == 0:
                continue
            runs.append((name, tuple(free_gpus[:g]), tuple(free_cpus[:c]), m))
            free_gpus, free_cpus, memory = free_gpus[g:], free_cpus[c:], memory - m
    jobs = [draw(st.fixed_dictionaries({
        "gpus": st.integers(1, 8),
        "cpus_per_gpu": st.sampled_from([0, 1, 2, 4]),
        "mem_mb": st.sampled_from([0, 0, 500, 2000, 6000]),
    })) for _ in range(draw(st.integers(1, 10)))]
    return nodes, runs, jobs


@settings(max_examples=120, deadline=None)
@given(case=clusters(), policy=st.sampled_from(["fifo", "fifo-easy", "garrison"]))
def test_the_cores_plan_on_a_fresh_snapshot_is_never_rejected(
    case: tuple[dict[str, int], list[tuple[str, tuple[int, ...], tuple[int, ...], int]], list[dict[str, object]]],
    policy: str,
) -> None:
    nodes, runs, jobs = case
    state = new_state(nodes)
    for i, (name, gpus, cpus, mem) in enumerate(runs):
        start(state, 100 + i, name, gpus, cpus, mem)
    state.add_jobs([job(200 + i, **fields) for i, fields in enumerate(jobs)])
    plan = schedule(state.snapshot(), 10.0, preset(policy))
    result, _ = state.apply_plan(plan, 10.0)
    assert result.rejected == ()
    assert len(result.started) == len(plan.starts)
    state.store.close()
