"""The attempt ledger and apply(plan): a plan computed on a snapshot may be stale; what still holds is
accepted, the rest rejected with its reason. The daemon (ClusterState) and gsim share this code."""

from __future__ import annotations

from pathlib import Path

import pytest

from garrison.controller.ledger import (
    AttemptLedger,
    LiveAttempt,
    PlanResult,
    Rejected,
    Rejection,
    StartedAttempt,
)
from garrison.controller.sched.cycle import Plan, Preempt, Start
from garrison.controller.state import ClusterState, Launch
from garrison.controller.store import open_store
from garrison.model.domain import (
    Allocation,
    Gpu,
    Job,
    JobSpec,
    JobState,
    Node,
    NodeAllocation,
    NodeInventory,
    NodeState,
)


def inventory(name: str, gpus: int = 4) -> NodeInventory:
    return NodeInventory(
        hostname=name,
        gpus=tuple(Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100", 40960, f"0000:{i:02x}:00.0", 0, "0-1") for i in range(gpus)),
        nvlink=tuple(tuple(0 if i == j else 12 for j in range(gpus)) for i in range(gpus)),
        topo=(),
        cpus=8,
        memory_mb=4096,
    )


def on(node: str, *gpus: int, cpus: tuple[int, ...] = (), mem_mb: int = 0) -> Allocation:
    return Allocation((NodeAllocation(node, gpus, cpus=cpus, mem_mb=mem_mb),))


def ledger_with(*names: str) -> AttemptLedger:
    ledger = AttemptLedger()
    for name in names:
        ledger.nodes[name] = Node(name=name, inventory=inventory(name))
        ledger.connected.add(name)
    return ledger


def test_apply_starts_attempts_that_hold_their_gpus() -> None:
    ledger = ledger_with("n1")
    ledger.queued.update({1: 0, 2: 3})
    result = ledger.apply(Plan(starts=(Start(1, on("n1", 0, 1)), Start(2, on("n1", 2)))), now=5.0)
    assert result == PlanResult(started=(StartedAttempt(1, 0, on("n1", 0, 1)), StartedAttempt(2, 3, on("n1", 2))))
    assert ledger.free_gpus(ledger.nodes["n1"]) == frozenset({3})
    assert set(ledger.live) == {(1, 0), (2, 3)} and ledger.queued == {}
    assert ledger.held_gpu_count() == 3


def test_a_stale_plan_is_accepted_only_where_it_still_holds() -> None:
    ledger = ledger_with("n1", "n2", "n3", "n4")
    ledger.queued.update({job: 0 for job in (1, 2, 3, 4, 5, 6, 7)})
    # Since the snapshot: job 10 took GPU 0 of n1, n2 went away, n3 was drained, n4's agent disconnected,
    # job 2 was cancelled (no longer queued) and job 3 held.
    ledger.own(LiveAttempt(10, 0, on("n1", 0), pending_nodes={"n1"}))
    del ledger.nodes["n2"]
    ledger.nodes["n3"] = Node(name="n3", inventory=inventory("n3"), state=NodeState.DRAIN)
    ledger.connected.discard("n4")
    del ledger.queued[2]
    ledger.held.add(3)
    plan = Plan(starts=(
        Start(1, on("n1", 0, 1)),  # GPU 0 taken
        Start(2, on("n1", 2)),  # cancelled
        Start(3, on("n1", 3)),  # held
        Start(4, on("n2", 0)),  # node gone
        Start(5, on("n3", 0)),  # drained
        Start(6, on("n4", 0)),  # agent not connected
        Start(7, on("n1", 1, 2, 3)),  # still holds
    ))
    result = ledger.apply(plan, now=1.0)
    assert result.started == (StartedAttempt(7, 0, on("n1", 1, 2, 3)),)
    assert result.rejected == (
        Rejection(1, Rejected.GPUS_TAKEN, node="n1"),
        Rejection(2, Rejected.JOB_NOT_PENDING),
        Rejection(3, Rejected.JOB_HELD),
        Rejection(4, Rejected.NODE_GONE, node="n2"),
        Rejection(5, Rejected.NODE_DRAINED, node="n3"),
        Rejection(6, Rejected.NODE_DOWN, node="n4"),
    )
    assert ledger.queued == {1: 0, 3: 0, 4: 0, 5: 0, 6: 0}  # the rejected stay queued for the next cycle


def test_two_starts_of_one_plan_cannot_share_a_gpu() -> None:
    ledger = ledger_with("n1")
    ledger.queued.update({1: 0, 2: 0})
    result = ledger.apply(Plan(starts=(Start(1, on("n1", 0)), Start(2, on("n1", 0, 1)))), now=0.0)
    assert [s.job_id for s in result.started] == [1]
    assert result.rejected == (Rejection(2, Rejected.GPUS_TAKEN, node="n1"),)


def test_preemptions_that_no_longer_hold_are_rejected() -> None:
    ledger = ledger_with("n1")
    for job in (1, 2, 3):
        ledger.own(LiveAttempt(job, 1, on("n1", job), pending_nodes={"n1"}))
    ledger.begin_preemption(ledger.live[(2, 1)], terminate_at=60.0)  # preempted by an earlier cycle
    plan = Plan(preempts=(Preempt(1, 1, 30), Preempt(2, 1, 30), Preempt(3, 0, 30), Preempt(4, 0, 30)))
    result = ledger.apply(plan, now=0.0)
    assert result.preempting == (Preempt(1, 1, 30),)
    assert [(r.job_id, r.reason) for r in result.rejected] == [
        (2, Rejected.ATTEMPT_STOPPING), (3, Rejected.ATTEMPT_ENDED), (4, Rejected.ATTEMPT_ENDED),
    ]
    assert all(r.victim is not None for r in result.rejected)


def test_a_failed_commit_hook_leaves_the_ledger_as_it_was() -> None:
    ledger = ledger_with("n1")
    ledger.queued[1] = 0

    def failing_write(result: PlanResult, now: float) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        ledger.apply(Plan(starts=(Start(1, on("n1", 0)),)), now=0.0, before_commit=failing_write)
    assert ledger.live == {} and ledger.queued == {1: 0}
    assert ledger.free_gpus(ledger.nodes["n1"]) == frozenset(range(4))


def test_gpus_come_free_node_by_node_and_cpus_and_memory_are_counted() -> None:
    ledger = ledger_with("n1", "n2")
    alloc = Allocation((NodeAllocation("n1", (0,), cpus=(0, 1), mem_mb=100), NodeAllocation("n2", (1,), mem_mb=50)))
    live = LiveAttempt(1, 0, alloc, pending_nodes={"n1", "n2"})
    ledger.own(live)
    assert ledger.held_cpus_and_memory() == ({"n1": {0, 1}}, {"n1": 100, "n2": 50})
    ledger.release_node(live, "n1")
    assert ledger.free_gpus(ledger.nodes["n1"]) == frozenset(range(4))
    assert ledger.free_gpus(ledger.nodes["n2"]) == frozenset({0, 2, 3})
    assert ledger.held_cpus_and_memory() == ({}, {"n2": 50})
    ledger.release_node(live, "n2")
    ledger.close(live)
    assert ledger.live == {} and ledger.held_gpu_count() == 0


def test_a_leftover_keeps_only_the_gpus_nobody_else_took() -> None:
    ledger = ledger_with("n1")
    ledger.own(LiveAttempt(2, 0, on("n1", 0), pending_nodes={"n1"}))
    ledger.own_leftover(1, 0, on("n1", 0, 1), "n1")
    assert ledger.gpu_owner["n1"] == {0: (2, 0), 1: (1, 0)}
    assert ledger.live[(1, 0)].stopping


# -- the daemon's path: ClusterState.apply_plan writes the accepted starts through, then launches them


def pending_job(job_id: int) -> Job:
    return Job(job_id=job_id, spec=JobSpec(name="t", command=("true",)), user="alice", uid=1000, gid=1000,
               account="default", partition="main", time_limit_s=60, submit_time=0.0)


def test_cluster_state_applies_a_stale_plan_through_the_ledger(tmp_path: Path) -> None:
    state = ClusterState(open_store(f"sqlite:///{tmp_path / 'c.db'}"), heartbeat_timeout_s=10.0)
    state.load(0.0, retention_s=1e9)
    for name in ("n1", "n2"):
        state.register_node(name, inventory(name), frozenset({"main"}), [], [], 0.0)
    state.add_jobs([pending_job(i) for i in (1, 2, 3, 4)])
    state.start_attempts([(4, on("n1", 0))], now=1.0)  # since the snapshot: job 4 took GPU 0 of n1,
    state.cancel([2], now=1.0)  # job 2 was cancelled,
    state.disconnect("n2")  # and n2's agent went away
    plan = Plan(starts=(Start(1, on("n1", 0)), Start(2, on("n1", 1)), Start(3, on("n2", 0)), Start(1, on("n1", 2))),
                preempts=(Preempt(4, 0, 30),))
    result, instructions = state.apply_plan(plan, now=2.0)
    assert [(r.job_id, r.reason) for r in result.rejected] == [
        (1, Rejected.GPUS_TAKEN), (2, Rejected.JOB_NOT_PENDING), (3, Rejected.NODE_DOWN),
    ]
    assert result.started == (StartedAttempt(1, 0, on("n1", 2)),)
    assert result.preempting == (Preempt(4, 0, 30),)  # for the engine to carry out
    assert state.jobs[1].state == JobState.CONFIGURING and state.jobs[3].state == JobState.PENDING
    assert instructions == [Launch("n1", state.jobs[1], 0)]
    # What was accepted is in the store, as a restarted controller would load it.
    reloaded = ClusterState(state.store, heartbeat_timeout_s=10.0)
    reloaded.load(3.0, retention_s=1e9)
    assert reloaded.jobs[1].state == JobState.CONFIGURING and set(reloaded.live) == {(1, 0), (4, 0)}
