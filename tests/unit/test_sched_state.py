"""The scheduling policy's state operations on ClusterState with a real SQLite store: drains that survive
silence and restarts, holds that survive restarts, requeue, job updates, and the snapshot's cached views
following every change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cluster_state import connect, inventory, new_state, ok, submit

from garrison.controller.sched.snapshot import PendingJob
from garrison.controller.snapshots import SnapshotCache
from garrison.controller.state import ClusterState, SignalAttempt
from garrison.model.domain import Allocation, JobState, NodeAllocation, NodeState


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.db'}"


def test_a_drained_node_stays_drained_through_silence_and_restarts(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    state.set_drain("n1", True, "bad DIMM")
    # It goes silent (rebooted for maintenance): its jobs are lost, but it stays drained.
    state.expire_heartbeats(100.0)
    assert state.nodes["n1"].state == NodeState.DRAIN and "n1" not in state.connected
    assert state.expire_heartbeats(200.0) == []  # handled once
    connect(state, "n1", now=300.0)
    assert state.nodes["n1"].state == NodeState.DRAIN and state.nodes["n1"].reason == "bad DIMM"
    again = new_state(db, now=300.0)  # the controller restarts
    assert again.nodes["n1"].state == NodeState.DRAIN
    connect(again, "n1", now=300.0)
    view = again.snapshot().nodes[0]
    assert view.drained and not view.schedulable
    again.set_drain("n1", False, "")
    assert again.nodes["n1"].state == NodeState.UP and again.snapshot().nodes[0].schedulable


def test_holds_survive_a_restart_and_mark_the_pending_view(db: str) -> None:
    state = new_state(db)
    submit(state, 1, gpus=1)
    submit(state, 2, gpus=1)
    assert state.hold([1], by_admin=True) == [1]
    assert state.hold([2], by_admin=False) == [2]
    assert {p.job_id: p.held for p in state.snapshot().pending} == {1: True, 2: True}
    assert state.release([2]) == [2] and state.release([2]) == []
    again = new_state(db)
    assert again.held == {1} and again.admin_held == {1}
    assert {p.job_id: p.held for p in again.snapshot().pending} == {1: True, 2: False}


def test_requeue_stops_a_running_job_and_queues_it_again(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    submit(state, 1, gpus=1)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (0,)),)))], 1.0)
    requeued, instructions = state.requeue([1], 2.0)
    assert requeued == [1] and instructions == [SignalAttempt("n1", 1, 0, "terminate")]
    assert state.requeue([1], 2.0) == ([], [])  # already being stopped

    state.node_finished("n1", ok(1, ranks=1), 3.0)
    job = state.jobs[1]
    # The attempt is REQUEUED, as sacct -D shows Slurm's requeued runs (it was CANCELLED, which it was not).
    assert job.state == JobState.PENDING and job.attempts[0].state == JobState.REQUEUED
    assert job.attempts[0].reason == "requeued by request"
    assert [p.job_id for p in state.snapshot().pending] == [1]


def test_snapshot_views_follow_job_changes(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    job = submit(state, 1, gpus=1)
    first = state.snapshot()
    assert first.pending[0].time_limit_s == 60 and first.nodes[0].free_gpus == frozenset(range(8))
    state.update_job(replace(job, time_limit_s=30, priority=5))
    second = state.snapshot()
    assert (second.pending[0].time_limit_s, second.pending[0].priority) == (30, 5)
    state.start_attempts([(1, Allocation((NodeAllocation("n1", (2, 3)),)))], 1.0)
    third = state.snapshot()
    assert third.pending == () and third.nodes[0].free_gpus == frozenset(range(8)) - {2, 3}
    assert [(r.job_id, r.expected_end) for r in third.running] == [(1, 31.0)]
    assert inventory("n1").gpus[0].name == third.nodes[0].gpu_names[0]


def test_first_views_made_in_chunks_while_jobs_change_are_those_of_one_build(db: str) -> None:
    """A restarted controller makes its pending jobs' first views a chunk at a time between requests
    (Engine._make_first_views): jobs that change, start, end or arrive meanwhile, before or after their
    chunk, give the snapshot that one build after the same changes gives."""
    state = new_state(db)
    connect(state, "n1")
    jobs = [submit(state, job_id, gpus=1) for job_id in range(1, 11)]
    again = new_state(db)
    connect(again, "n1")
    assert again.snapshots.make_first_views(again, 3)  # jobs 1-3 viewed, 7 left
    again.update_job(replace(jobs[1], time_limit_s=30))  # viewed already
    again.update_job(replace(jobs[7], priority=5))  # not yet viewed
    again.cancel([3, 9], 1.0)
    again.start_attempts([(5, Allocation((NodeAllocation("n1", (0,)),)))], 1.0)
    submit(again, 11, gpus=2)
    assert again.snapshots.make_first_views(again, 3)
    assert again.snapshots.make_first_views(again, 3)
    assert not again.snapshots.make_first_views(again, 3)  # the last job: none left
    assert not again.snapshots.make_first_views(again, 3)

    built_once = new_state(db)
    connect(built_once, "n1")
    viewed, expected = again.snapshot(), built_once.snapshot()
    assert sorted(viewed.pending, key=lambda p: p.job_id) == sorted(expected.pending, key=lambda p: p.job_id)
    assert [p.job_id for p in sorted(viewed.pending, key=lambda p: p.job_id)] == [1, 2, 4, 6, 7, 8, 10, 11]
    assert viewed.running == expected.running


def test_a_build_makes_the_first_views_still_to_be_made(db: str) -> None:
    state = new_state(db)
    for job_id in range(1, 6):
        submit(state, job_id, gpus=1)
    again = new_state(db)
    assert again.snapshots.make_first_views(again, 2)
    assert [p.job_id for p in again.snapshot().pending] == [1, 2, 3, 4, 5]
    assert not again.snapshots.make_first_views(again, 2)  # the build made them all


def _fresh_pending(state: ClusterState) -> tuple[PendingJob, ...]:
    """The pending views one build from nothing makes of the state as it is now."""
    return SnapshotCache().build(state).pending


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["submit", "submit_after", "hold", "release", "priority", "start",
                                                 "finish", "cancel", "snapshot"]),
                                st.integers(min_value=1, max_value=12)), max_size=60))
def test_held_and_dependent_views_patched_incrementally_are_those_of_a_fresh_build(
        tmp_path: Path, steps: list[tuple[str, int]]) -> None:
    """The snapshot's held and dependent views are patched only where something changed since the last build
    (a cycle over 50,000 held jobs made 50,000 views again): after any sequence of submissions, holds,
    releases, changes, starts and ends, the views given to the core are those a fresh build makes, in the same
    order, and a held job's view that nothing changed is the same object as the last build's."""
    state = new_state(f"sqlite:///{tmp_path / f'h{len(list(tmp_path.iterdir()))}.db'}")
    connect(state, "n1")
    gpu = 0
    previous: dict[int, PendingJob] = {}
    for action, job_id in steps:
        job = state.jobs.get(job_id)
        pending = job is not None and job.state == JobState.PENDING
        if action == "submit" and job is None:
            submit(state, job_id, gpus=1)
        elif action == "submit_after" and job is None:
            submit(state, job_id, gpus=1, dependency=f"afterok:{max(job_id - 1, 1)}")
        elif action == "hold" and pending:
            state.hold([job_id], by_admin=False)
        elif action == "release" and pending:
            state.release([job_id])
        elif action == "priority" and pending:
            state.update_job(replace(job, priority=job.priority + 1))
        elif action == "start" and pending and job_id not in state.held and gpu < 8:
            state.start_attempts([(job_id, Allocation((NodeAllocation("n1", (gpu,)),)))], 1.0)
            state.node_started("n1", job_id, 0)
            gpu += 1
        elif action == "finish" and job is not None and job.state == JobState.RUNNING:
            state.node_finished("n1", ok(job_id, ranks=1), 2.0)
        elif action == "cancel" and pending:
            state.cancel([job_id], 2.0)
        elif action == "snapshot":
            given_now = state.snapshot().pending
            assert given_now == _fresh_pending(state)
            for view in given_now:
                if view.held and not view.dependencies and previous.get(view.job_id) == view:
                    assert previous[view.job_id] is view  # the core keeps its place in the queue by identity
            previous = {view.job_id: view for view in given_now}
    assert state.snapshot().pending == _fresh_pending(state)


def test_a_hold_set_without_a_job_change_still_marks_the_view(db: str) -> None:
    """The held set is also changed on its own (a held submission's chunks, a rolled-back hold): the next
    build sees it although the job itself did not change."""
    state = new_state(db)
    submit(state, 1, gpus=1)
    assert [p.held for p in state.snapshot().pending] == [False]
    state.held.add(1)
    assert [p.held for p in state.snapshot().pending] == [True]
    state.held.discard(1)
    assert [p.held for p in state.snapshot().pending] == [False]
