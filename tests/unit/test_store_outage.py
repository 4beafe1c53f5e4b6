"""Store first, then memory: every path that changes the cluster state, with the store refusing the write.

The store is a real SQLite database made read-only mid-run (tests/helpers/broken_store.py: SQLite itself
refuses the write and the driver raises its own error). For each path the test checks that the operation
raises StoreUnavailable, that memory is exactly as it was (jobs, the queue, holds, live attempts and what
they hold, GPUs, nodes, connections), that the store holds nothing of it (a controller restarted on the
same file sees the old state), and that the same operation succeeds once the store takes writes again.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from garrison.controller.state import AckResult, ClusterState, SignalAttempt
from garrison.controller.store import StoreUnavailable
from garrison.model.domain import (
    Allocation,
    Job,
    JobState,
    NodeAllocation,
    NodeResult,
    NodeState,
    RankOutcome,
)
from tests.helpers.broken_store import BreakableStore
from tests.unit.test_cluster_state import connect, inventory, ok, submit, two_node_alloc


def memory(state: ClusterState) -> dict[str, Any]:
    """Everything the controller keeps in memory about jobs, attempts and nodes, as plain values."""
    return copy.deepcopy({
        "jobs": dict(state.jobs),
        "queued": dict(state.ledger.queued),
        "held": set(state.held),
        "admin_held": set(state.admin_held),
        "live": dict(state.live),
        "gpu_owner": {node: dict(owners) for node, owners in state.gpu_owner.items() if owners},
        "nodes": dict(state.nodes),
        "connected": set(state.connected),
        "silent_drained": set(state.silent_drained),
        "wait_reasons": dict(state.wait_reasons),
    })


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'c.db'}"
        self.db = BreakableStore(self.url)
        self.state = ClusterState(self.db.store, heartbeat_timeout_s=10.0)
        self.state.load(0.0, retention_s=1e9)
        self._reader: BreakableStore | None = None  # a second store on the same file: what a restart reads

    def refused(self, operation: Any, *args: Any, **kwargs: Any) -> None:
        """Run ``operation`` with the store broken: it must raise StoreUnavailable and change nothing."""
        before = memory(self.state)
        stored = self.stored()
        self.db.break_()
        try:
            with pytest.raises(StoreUnavailable, match="the database is unavailable, retry"):
                operation(*args, **kwargs)
        finally:
            self.db.heal()
        assert memory(self.state) == before
        assert self.stored() == stored

    def stored(self) -> dict[str, Any]:
        """What a restarted controller would load."""
        if self._reader is None:
            self._reader = BreakableStore(self.url)
        again = ClusterState(self._reader.store, heartbeat_timeout_s=10.0)
        again.load(0.0, retention_s=1e9)
        return {"jobs": dict(again.jobs), "held": set(again.held), "admin_held": set(again.admin_held),
                "nodes": {n: (node.state, node.reason) for n, node in again.nodes.items()}}


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def running(h: Harness, job_id: int = 1, **spec: object) -> None:
    connect(h.state, "n1", "n2")
    submit(h.state, job_id, nodes=2, gpus_per_node=2, **spec)
    h.state.start_attempts([(job_id, two_node_alloc())], now=1.0)
    h.state.node_started("n1", job_id, 0)
    h.state.node_started("n2", job_id, 0)
    assert h.state.jobs[job_id].state == JobState.RUNNING


def test_a_refused_write_is_an_outage_not_a_driver_error(h: Harness) -> None:
    connect(h.state, "n1")
    h.db.break_()
    with pytest.raises(StoreUnavailable) as refused:
        submit(h.state, 1)
    assert str(refused.value) == "the database is unavailable, retry"
    assert "readonly" in refused.value.cause  # the driver's words stay in the log, not in the answer


def test_submission(h: Harness) -> None:
    connect(h.state, "n1")
    h.refused(submit, h.state, 1)
    submit(h.state, 1)
    assert h.state.jobs[1].state == JobState.PENDING and 1 in h.state.ledger.queued


def test_submission_with_hold_is_one_transaction(h: Harness) -> None:
    def held_submit() -> None:
        with h.state.atomically():
            submit(h.state, 1)
            h.state.hold([1], by_admin=False)

    h.refused(held_submit)
    held_submit()
    assert h.stored()["held"] == {1}


def test_cancel_pending_and_running(h: Harness) -> None:
    running(h)
    submit(h.state, 2)
    h.refused(h.state.cancel, [1, 2], 5.0)
    cancelled, out = h.state.cancel([1, 2], 5.0)
    assert cancelled == [1, 2] and SignalAttempt("n1", 1, 0, "terminate") in out
    assert h.state.jobs[2].state == JobState.CANCELLED and h.state.jobs[1].state == JobState.COMPLETING


def test_hold_and_release(h: Harness) -> None:
    connect(h.state, "n1")
    submit(h.state, 1)
    submit(h.state, 2)
    h.refused(h.state.hold, [1, 2], True)
    assert h.state.hold([1, 2], True) == [1, 2]
    h.refused(h.state.release, [1, 2])
    assert h.state.release([1, 2]) == [1, 2]
    assert h.stored()["held"] == set()


def test_plan_start(h: Harness) -> None:
    connect(h.state, "n1", "n2")
    submit(h.state, 1, nodes=2, gpus_per_node=2)
    h.state.wait_reasons[1] = "Resources"
    h.refused(h.state.start_attempts, [(1, two_node_alloc())], 1.0)
    assert h.state.free_gpus(h.state.nodes["n1"]) == frozenset(range(8))  # no GPU left taken
    assert len(h.state.start_attempts([(1, two_node_alloc())], 1.0)) == 2


def test_preemption(h: Harness) -> None:
    running(h)
    h.refused(h.state.preempt, 1, 30.0, 10, 5.0)
    assert h.state.preempt(1, 30.0, 10, 5.0) == [SignalAttempt(n, 1, 0, "signal", 10) for n in ("n1", "n2")]


def test_attempt_started(h: Harness) -> None:
    connect(h.state, "n1", "n2")
    submit(h.state, 1, nodes=2, gpus_per_node=2)
    h.state.start_attempts([(1, two_node_alloc())], now=1.0)
    h.state.node_started("n1", 1, 0)
    h.refused(h.state.node_started, "n2", 1, 0)
    h.state.node_started("n2", 1, 0)
    assert h.state.jobs[1].state == JobState.RUNNING


def test_attempt_finished_on_the_last_node(h: Harness) -> None:
    running(h)
    h.state.node_finished("n1", ok(1), now=2.0)
    h.refused(h.state.node_finished, "n2", ok(1), 3.0)
    assert h.state.free_gpus(h.state.nodes["n2"]) == frozenset(range(2, 8))  # still held: not acknowledged
    # n1's result was held until now (its end was in memory only): both are acknowledged once durable.
    assert h.state.node_finished("n2", ok(1), now=3.0) == [AckResult("n1", 1, 0), AckResult("n2", 1, 0)]
    assert h.state.jobs[1].state == JobState.COMPLETED
    assert h.stored()["jobs"][1].state == JobState.COMPLETED


def test_a_failed_rank_stopping_the_gang(h: Harness) -> None:
    running(h, requeue=False)
    failed = NodeResult(1, 0, (RankOutcome(0, 0), RankOutcome(1, 3)))
    h.refused(h.state.node_finished, "n1", failed, 2.0)
    out = h.state.node_finished("n1", failed, now=2.0)
    assert SignalAttempt("n2", 1, 0, "terminate") in out and AckResult("n1", 1, 0) in out


def test_requeue(h: Harness) -> None:
    running(h)
    h.refused(h.state.requeue, [1], 5.0)
    assert h.state.requeue([1], 5.0)[0] == [1]


def test_update_job(h: Harness) -> None:
    connect(h.state, "n1")
    job = submit(h.state, 1)
    changed: Job = replace(h.state.jobs[job.job_id], time_limit_s=120)
    h.refused(h.state.update_job, changed)
    h.state.update_job(changed)
    assert h.stored()["jobs"][1].time_limit_s == 120


def test_drain_and_resume(h: Harness) -> None:
    connect(h.state, "n1")
    h.refused(h.state.set_drain, "n1", True, "maintenance")
    h.state.set_drain("n1", True, "maintenance")
    assert h.stored()["nodes"]["n1"] == (NodeState.DRAIN, "maintenance")
    h.refused(h.state.set_drain, "n1", False, "")


def test_time_limit_expiry_waits_for_the_store_then_catches_up(h: Harness) -> None:
    running(h)
    before = memory(h.state)
    h.db.break_()
    assert h.state.expire_time_limits(now=100.0) == []  # past the 60 s limit, but nothing can be written
    assert memory(h.state) == before
    h.db.heal()
    out = h.state.expire_time_limits(now=100.5)  # the first tick that can write
    assert SignalAttempt("n1", 1, 0, "terminate") in out
    assert h.stored()["jobs"][1].state == JobState.COMPLETING


def test_grace_end_is_signalled_even_while_the_store_is_down(h: Harness) -> None:
    running(h)
    h.state.preempt(1, 30.0, 10, 5.0)
    h.db.break_()
    assert h.state.expire_time_limits(now=35.0) == [SignalAttempt(n, 1, 0, "terminate") for n in ("n1", "n2")]
    h.db.heal()


def test_heartbeat_expiry_waits_for_the_store_then_catches_up(h: Harness) -> None:
    running(h)
    before = memory(h.state)
    h.db.break_()
    assert h.state.expire_heartbeats(now=50.0) == []
    assert memory(h.state) == before
    h.db.heal()
    out = h.state.expire_heartbeats(now=50.2)
    assert SignalAttempt("n2", 1, 0, "terminate") in out  # n1 went first: the rest of its gang is stopped (SIGTERM, kill wait)
    assert h.state.nodes["n1"].state == NodeState.DOWN and h.stored()["nodes"]["n1"][0] == NodeState.DOWN
    assert h.state.jobs[1].state == JobState.PENDING  # requeued: every node of the gang is lost


def test_an_agent_registers_while_the_store_is_down(h: Harness) -> None:
    running(h)
    h.state.node_finished("n1", ok(1), now=2.0)
    h.state.disconnect("n2")
    h.db.break_()
    h.state.attach_node("n2", inventory("n2"), frozenset({"main"}), now=5.0)
    assert "n2" in h.state.connected and h.state.nodes["n2"].state == NodeState.UP
    assert h.state.unsaved_nodes == {"n2"}
    # Its report of what ended while it was away must wait: it changes jobs.
    before = memory(h.state)
    with pytest.raises(StoreUnavailable):
        h.state.reconcile_node("n2", [], [ok(1)], now=5.0)
    assert memory(h.state) == before
    h.db.heal()
    assert h.state.flush_nodes() and not h.state.unsaved_nodes
    assert AckResult("n2", 1, 0) in h.state.reconcile_node("n2", [], [ok(1)], now=5.1)


def test_a_restart_during_a_preemption_keeps_the_grace_and_records_preempted(h: Harness) -> None:
    running(h)
    h.state.preempt(1, 30.0, 10, now=5.0)
    again = ClusterState(BreakableStore(h.url).store, heartbeat_timeout_s=10.0)
    again.load(8.0, retention_s=1e9)
    live = again.live[(1, 0)]
    assert live.terminate_at == 35.0 and live.requeue_as == JobState.PREEMPTED
    # The agents come back with the victim still running: no SIGTERM before the grace period ends.
    out = connect(again, "n1", "n2", now=9.0, running=[(1, 0)])
    assert not any(isinstance(i, SignalAttempt) and i.action == "terminate" for i in out)
    assert again.expire_time_limits(now=34.0) == []
    assert again.expire_time_limits(now=35.0) == [SignalAttempt(n, 1, 0, "terminate") for n in ("n1", "n2")]
    again.node_finished("n1", ok(1), now=36.0)
    again.node_finished("n2", ok(1), now=36.0)
    attempt = again.jobs[1].attempts[0]
    assert again.jobs[1].state == JobState.PENDING
    assert (attempt.state, attempt.reason) == (JobState.PREEMPTED, "preempted")


def test_a_failed_registration_write_does_not_leave_a_gpu_allocated(h: Harness) -> None:
    connect(h.state, "n1")
    submit(h.state, 1, gpus=2)
    alloc = Allocation((NodeAllocation("n1", (0, 1)),))
    for _ in range(5):
        h.refused(h.state.start_attempts, [(1, alloc)], 1.0)
    assert h.state.ledger.held_gpu_count() == 0


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_each_refused_once_leave_memory_as_it_was(tmp_path: Path, seed: int) -> None:
    """Any sequence of operations: each is first tried with the store refusing it (memory must not change,
    and the store must hold nothing of it), then again with the store healthy."""
    import random

    rng = random.Random(seed)
    h = Harness(tmp_path)
    state = h.state
    names = ("n1", "n2", "n3")
    connect(state, *names)
    clock = [1.0]
    next_id = [1]

    def tick() -> float:
        clock[0] += rng.choice((0.5, 5.0, 40.0))
        for name in names:
            if name in state.connected and rng.random() < 0.9:
                state.heartbeat(name, clock[0])
        return clock[0]

    def pick(states: tuple[JobState, ...]) -> int | None:
        found = [j.job_id for j in state.jobs.values() if j.state in states]
        return rng.choice(found) if found else None

    def op_submit() -> None:
        submit(state, next_id[0], gpus=rng.choice((1, 2)))
        next_id[0] += 1

    def op_start() -> None:
        job_id = pick((JobState.PENDING,))
        node = rng.choice(names)
        free = sorted(state.free_gpus(state.nodes[node]))
        if job_id is None or len(free) < 2:
            return
        state.start_attempts([(job_id, Allocation((NodeAllocation(node, tuple(free[:2])),)))], clock[0])

    def live_node() -> tuple[int, int, str] | None:
        lives = [(live.job_id, live.attempt, n) for live in state.live.values() for n in sorted(live.pending_nodes)]
        return rng.choice(lives) if lives else None

    def op_started() -> None:
        found = live_node()
        if found:
            state.node_started(found[2], found[0], found[1])

    def op_finished() -> None:
        found = live_node()
        if found:
            code = rng.choice((0, 0, 1))
            state.node_finished(found[2], NodeResult(found[0], found[1], (RankOutcome(0, code),)), clock[0])

    def op_cancel() -> None:
        job_id = pick((JobState.PENDING, JobState.RUNNING, JobState.CONFIGURING))
        if job_id is not None:
            state.cancel([job_id], clock[0])

    def op_hold_release() -> None:
        job_id = pick((JobState.PENDING,))
        if job_id is not None:
            (state.release([job_id]) if job_id in state.held else state.hold([job_id], rng.random() < 0.5))

    def op_requeue_or_preempt() -> None:
        job_id = pick((JobState.RUNNING,))
        if job_id is not None:
            (state.requeue([job_id], clock[0]) if rng.random() < 0.5 else state.preempt(job_id, 10.0, 10, clock[0]))

    def op_timers() -> None:
        now = tick()
        state.expire_time_limits(now)
        state.expire_heartbeats(now)

    def op_register() -> None:
        name = rng.choice(names)
        running = [(live.job_id, live.attempt) for live in state.live.values() if name in live.pending_nodes]
        state.attach_node(name, inventory(name), frozenset({"main"}), clock[0])
        state.reconcile_node(name, running[: rng.randint(0, len(running))], [], clock[0])

    ops = [op_submit, op_submit, op_start, op_start, op_started, op_finished, op_finished, op_cancel,
           op_hold_release, op_requeue_or_preempt, op_timers, op_register]
    for _ in range(40):
        op = rng.choice(ops)
        if op in (op_timers, op_register):
            # Timers defer what they cannot write, and registering attaches the node whatever the store does:
            # both are checked by their own tests above. Here they only move the cluster on.
            op()
            continue
        before, stored = memory(state), h.stored()
        h.db.break_()
        try:
            op()
        except StoreUnavailable:
            refused = True
        else:
            refused = False  # it needed no write (a duplicate report, a job already moved on): it is done
        finally:
            h.db.heal()
        assert h.stored() == stored, op.__name__
        if refused:
            assert memory(state) == before, op.__name__
            op()
    assert state.ledger.held_gpu_count() == sum(
        len(live.allocation.gpus_on(n)) for live in state.live.values() for n in live.pending_nodes
    )
