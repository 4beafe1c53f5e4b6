"""When the controller plans again (issue 23: 50,000 pending jobs cost nothing while nothing can start):
controller/cycles.py's rule on its own, then through the engine on a real SQLite store with a manual clock.
A cycle is due after a change of the state a cycle reads, when a begin time comes, or after the recompute
interval; not while the cluster is idle, not for heartbeats, and not for the plan's own starts. Also the
timer's purge of finished jobs, which now visits only the jobs due (a heap), never the whole queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.engines import KeptLink, engine_with_node

from garrison.controller import engine as engine_module
from garrison.controller.clock import ManualClock
from garrison.controller.commands import (
    AttemptFinished,
    AttemptStarted,
    CancelCommand,
    JobFilter,
    StillAlive,
    SubmitCommand,
)
from garrison.controller.cycles import CycleDue, Why
from garrison.controller.engine import Engine
from garrison.model.domain import JobSpec, JobState, NodeResult, Principal, RankOutcome
from garrison.model.launch import LaunchDescription

ALICE = Principal("alice", 1000, 1000, (1000,))
INTERVAL_S = 30.0


def test_the_rule_first_changed_wake_and_interval() -> None:
    due = CycleDue(INTERVAL_S)
    assert due.why(0, 100.0) == Why.FIRST
    due.planned(0, 100.0, wake_at=None)
    assert due.why(0, 100.0) is None
    assert due.why(0, 129.9) is None
    assert due.seconds_to_wait(110.0) == pytest.approx(20.0)
    assert due.why(1, 100.0) == Why.CHANGED
    assert due.why(0, 130.0) == Why.INTERVAL
    due.planned(0, 100.0, wake_at=105.0)
    assert due.seconds_to_wait(100.0) == pytest.approx(5.0)
    assert due.why(0, 104.9) is None
    assert due.why(0, 105.0) == Why.WAKE


def test_the_plans_own_changes_count_as_planned_only_if_nothing_else_changed() -> None:
    due = CycleDue(INTERVAL_S)
    due.planned(3, 100.0, None)
    due.applied(3, 7)  # nothing moved between the snapshot and the plan's application
    assert due.why(7, 100.0) is None
    due.applied(5, 9)  # something else changed while the plan was computed: plan again
    assert due.why(9, 100.0) == Why.CHANGED


def test_a_failed_application_is_retried_at_the_given_time() -> None:
    due = CycleDue(INTERVAL_S)
    due.planned(1, 100.0, None)
    due.retry_at(101.0)
    assert due.why(1, 100.5) is None
    assert due.why(1, 101.0) == Why.WAKE


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def link() -> KeptLink:
    return KeptLink("n1")


@pytest.fixture
def engine(tmp_path: Path, clock: ManualClock, link: KeptLink) -> Iterator[Engine]:
    engine = engine_with_node(tmp_path, clock=clock, link=link, schedule_interval_s=INTERVAL_S)
    yield engine
    asyncio.run(engine.stop())


def submit(engine: Engine, **spec: object) -> int:
    command = SubmitCommand(JobSpec(name="t", command=("true",), workdir="/", **spec))  # type: ignore[arg-type]
    return engine.submit(ALICE, command).job_id


def cycle(engine: Engine) -> None:
    asyncio.run(engine.run_cycle())


def launched(link: KeptLink) -> list[int]:
    return [i.job_id for i in link.sent if isinstance(i, LaunchDescription)]


def busy_cluster(engine: Engine, link: KeptLink) -> int:
    """Both GPUs taken by a running job, and two jobs pending that cannot start: the state to stay idle in."""
    running = submit(engine, gpus=2)
    cycle(engine)
    assert launched(link) == [running]
    engine.agent_message(link, AttemptStarted(running, 0))  # type: ignore[arg-type]
    submit(engine, gpus=1)
    submit(engine, gpus=2)
    cycle(engine)
    assert engine.cycle_due() is None
    return running


def test_no_cycle_is_due_while_nothing_can_change(engine: Engine, clock: ManualClock, link: KeptLink) -> None:
    busy_cluster(engine, link)
    count = engine.cycle_count
    clock.advance(INTERVAL_S - 1)
    engine.agent_message(link, StillAlive())  # type: ignore[arg-type]  # heartbeats change nothing a cycle reads
    engine.tick(clock.now())  # nor does the timer when no deadline has come
    assert engine.cycle_due() is None
    assert engine.cycle_count == count


def test_a_submission_makes_a_cycle_due(engine: Engine, link: KeptLink) -> None:
    busy_cluster(engine, link)
    submit(engine, gpus=1)
    assert engine.cycle_due() == Why.CHANGED


def test_a_job_ending_makes_a_cycle_due_and_the_cycle_starts_the_next(engine: Engine, link: KeptLink) -> None:
    running = busy_cluster(engine, link)
    engine.agent_message(link, AttemptFinished(NodeResult(running, 0, (RankOutcome(0, 0), RankOutcome(1, 0)))))  # type: ignore[arg-type]
    assert engine.cycle_due() == Why.CHANGED
    before = len(launched(link))
    cycle(engine)
    assert len(launched(link)) == before + 1  # the two-GPU job, first in the queue, now fits
    # The plan's own start changed the state, but as the plan counted on: no cycle is due for it.
    assert engine.cycle_due() is None


def test_cancel_hold_and_release_make_a_cycle_due(engine: Engine, link: KeptLink) -> None:
    busy_cluster(engine, link)
    waiting = submit(engine, gpus=1)
    cycle(engine)
    engine.state.hold([waiting], by_admin=False)
    assert engine.cycle_due() == Why.CHANGED
    cycle(engine)
    engine.state.release([waiting])
    assert engine.cycle_due() == Why.CHANGED
    cycle(engine)
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(waiting),))))
    assert engine.cycle_due() == Why.CHANGED


def test_node_changes_make_a_cycle_due(engine: Engine, link: KeptLink) -> None:
    busy_cluster(engine, link)
    engine.state.set_drain("n1", True, "maintenance")
    assert engine.cycle_due() == Why.CHANGED
    cycle(engine)
    engine.agent_disconnected(link)  # type: ignore[arg-type]
    assert engine.cycle_due() == Why.CHANGED


def test_the_interval_recomputes_priorities(engine: Engine, clock: ManualClock, link: KeptLink) -> None:
    busy_cluster(engine, link)
    clock.advance(INTERVAL_S)
    assert engine.cycle_due() == Why.INTERVAL
    cycle(engine)
    assert engine.cycle_due() is None


def test_a_begin_time_makes_a_cycle_due_when_it_comes(engine: Engine, clock: ManualClock, link: KeptLink) -> None:
    later = submit(engine, gpus=1, begin_time=clock.now() + 5)
    cycle(engine)
    assert engine.state.jobs[later].state == JobState.PENDING
    assert engine.due.seconds_to_wait(clock.now()) == pytest.approx(5.0)
    clock.advance(4.9)
    assert engine.cycle_due() is None
    clock.advance(0.1)
    assert engine.cycle_due() == Why.WAKE
    cycle(engine)
    assert launched(link) == [later]


def test_an_after_delay_makes_a_cycle_due_when_it_ends(engine: Engine, clock: ManualClock, link: KeptLink) -> None:
    first = submit(engine, gpus=1)
    cycle(engine)
    engine.agent_message(link, AttemptStarted(first, 0))  # type: ignore[arg-type]
    clock.advance(10)
    later = submit(engine, gpus=1, dependency=f"after:{first}+1")  # a minute after the first started
    cycle(engine)
    assert engine.state.jobs[later].state == JobState.PENDING
    assert engine.due.wake_at == pytest.approx(1060.0)  # the queue's repricing may come sooner
    clock.advance(49.9)
    cycle(engine)
    assert engine.state.jobs[later].state == JobState.PENDING
    assert engine.cycle_due() is None
    clock.advance(0.1)
    assert engine.cycle_due() == Why.WAKE
    cycle(engine)
    assert launched(link) == [first, later]


def test_finished_jobs_are_purged_after_the_retention_and_no_sooner(engine: Engine, clock: ManualClock) -> None:
    first, second, pending = submit(engine, gpus=1), submit(engine, gpus=1), submit(engine, gpus=2)
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(first),))))
    clock.advance(10)
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(second),))))
    assert engine.state.purge_finished(clock.now(), 10) == []
    clock.advance(0.5)
    assert engine.state.purge_finished(clock.now(), 10) == [first]
    clock.advance(10)
    assert engine.state.purge_finished(clock.now(), 10) == [second]
    assert set(engine.state.jobs) == {pending}


async def until(what: str, condition: Callable[[], bool]) -> None:
    """Poll ``condition`` under a deadline (not a fixed wait) while the engine's loop runs."""
    deadline = asyncio.get_running_loop().time() + 30
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def test_the_scheduler_loop_wakes_for_a_change_and_only_then(engine: Engine, clock: ManualClock,
                                                            link: KeptLink) -> None:
    """The real loop: it plans when the state changes (a submission, a job's end), without waiting for the
    interval, which the manual clock never reaches here."""

    async def scenario() -> None:
        engine.start()
        first = submit(engine, gpus=2)
        await until("the first job to launch", lambda: launched(link) == [first])
        second = submit(engine, gpus=2)
        await until("a cycle for the second job", lambda: engine.cycle_due() is None
                    and engine.state.wait_reasons.get(second) is not None)
        cycles = engine.cycle_count
        engine.agent_message(link, AttemptStarted(first, 0))  # type: ignore[arg-type]
        engine.agent_message(link, AttemptFinished(NodeResult(first, 0, (RankOutcome(0, 0), RankOutcome(1, 0)))))  # type: ignore[arg-type]
        await until("the second job to launch", lambda: launched(link) == [first, second])
        assert engine.cycle_count > cycles
        await engine.stop()

    asyncio.run(scenario())


def test_changes_arriving_just_after_a_cycle_are_planned_together(engine: Engine, link: KeptLink,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """After a cycle that planned, the loop gathers for CYCLE_GATHER_S: submissions made one by one in that
    window, 20 ms apart (time enough for the loop to plan each on its own), get one cycle between them, not
    one each. The window is widened here so that a slow machine cannot stretch the submissions past it."""
    monkeypatch.setattr(engine_module, "CYCLE_GATHER_S", 2.0)

    async def scenario() -> None:
        engine.start()
        first = submit(engine, gpus=1)
        await until("the first job to launch", lambda: launched(link) == [first])
        cycles = engine.cycle_count
        later = []
        for _ in range(3):
            later.append(submit(engine, gpus=1))
            await asyncio.sleep(0.02)  # requests that arrive apart: the scheduler loop runs meanwhile
        # The node's second GPU goes to the first of them; the other two are told why they wait.
        await until("a cycle for the later jobs", lambda: launched(link) == [first, later[0]]
                    and all(engine.state.wait_reasons.get(job) is not None for job in later[1:]))
        assert engine.cycle_count == cycles + 1
        await engine.stop()

    asyncio.run(scenario())
