"""The engine around the scheduling core (issue 21), driven by hand on a real SQLite store: a rejected start
is logged and counted; a victim is preempted with the grace the core decided; wait reasons of cancelled and
purged jobs are forgotten."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.engines import engine_with_node

from garrison.controller import metrics
from garrison.controller.commands import CancelCommand, JobFilter, SubmitCommand
from garrison.controller.engine import INLINE_PLAN_MAX_CPU_S, INLINE_PLAN_MAX_PENDING, Engine
from garrison.controller.sched.cycle import Plan, Start
from garrison.model.domain import Allocation, JobSpec, JobState, NodeAllocation, Principal

ALICE = Principal("alice", 1000, 1000, (1000,))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = engine_with_node(tmp_path)
    yield engine
    asyncio.run(engine.stop())


def submit(engine: Engine, **spec: object) -> int:
    command = SubmitCommand(JobSpec(name="t", command=("true",), workdir="/", **spec))  # type: ignore[arg-type]
    return engine.submit(ALICE, command).job_id


def rejections(reason: str) -> float:
    return metrics.registry().get_sample_value("garrison_plan_rejections_total",
                                             {"kind": "start", "reason": reason}) or 0.0


def test_a_start_the_recheck_rejects_is_logged_and_counted(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    first, second = submit(engine, gpus=1, mem_mb=3000), submit(engine, gpus=1, mem_mb=3000)
    before = rejections("MEMORY_SHORT")
    plan = Plan(starts=(Start(first, Allocation((NodeAllocation("n1", (0,), (0,), 3000),))),
                        Start(second, Allocation((NodeAllocation("n1", (1,), (1,), 3000),)))))
    with caplog.at_level(logging.INFO, logger="garrison.controller"):
        engine._apply_plan(plan)
    assert rejections("MEMORY_SHORT") == before + 1
    assert any(f"job={second} node=n1 start rejected: memory short" in r.getMessage() for r in caplog.records)
    assert engine.state.jobs[first].state.value == "CONFIGURING"
    assert engine.state.jobs[second].state.value == "PENDING"


def test_a_victim_is_preempted_with_the_grace_the_core_decided(engine: Engine) -> None:
    """Not its own 18-hour --signal lead time (the engine used to put that in place of the QoS grace)."""
    job_id = submit(engine, gpus=1, signal="USR1@65535")
    engine.execute(engine.state.start_attempts([(job_id, Allocation((NodeAllocation("n1", (0,)),)))], 1000.0))
    instructions = engine.preempt(job_id, 60, 1000.0)
    assert instructions and all(getattr(i, "signum", 10) == 10 for i in instructions)  # its --signal, SIGUSR1
    live = engine.state.live[(job_id, 0)]
    assert live.terminate_at == 1060.0


def apply_with_reasons(engine: Engine, plan: Plan) -> None:
    """What one scheduling cycle does with its plan: apply it, then record the wait reasons (paced)."""
    engine._apply_plan(plan)
    asyncio.run(engine._record_wait_reasons(plan.waiting))


def test_wait_reasons_are_forgotten_for_cancelled_jobs_even_from_a_plan_made_before(engine: Engine) -> None:
    waiting, cancelled_early = submit(engine, gpus=2), submit(engine, gpus=2)
    apply_with_reasons(engine, Plan(waiting={waiting: "Resources", cancelled_early: "Priority"}))
    assert engine.state.wait_reasons == {waiting: "Resources", cancelled_early: "Priority"}
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(cancelled_early),))))
    assert cancelled_early not in engine.state.wait_reasons
    stale = Plan(waiting={waiting: "Resources", cancelled_early: "Priority"})  # computed before the cancel
    apply_with_reasons(engine, stale)
    assert engine.state.wait_reasons == {waiting: "Resources"}
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(str(waiting),))))
    engine.state.purge_finished(10**9, 0)
    assert engine.state.wait_reasons == {}


def test_a_small_plan_is_made_on_the_event_loop_and_a_large_or_slow_one_on_the_planning_thread(engine: Engine) -> None:
    def planned_on_thread() -> bool:
        """Run a cycle on a fresh planning pool; whether the plan was handed to it."""
        engine._pool.shutdown()
        engine._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sched")
        assert asyncio.run(engine.run_cycle()) is not None
        return bool(engine._pool._threads)  # type: ignore[attr-defined]

    first = submit(engine, gpus=1)
    assert planned_on_thread()  # the first plan: how long plans take here is not known yet
    assert engine.state.jobs[first].state == JobState.CONFIGURING
    second = submit(engine, gpus=1)
    assert not planned_on_thread()  # a few pending jobs, and the last plan was quick
    assert engine.state.jobs[second].state == JobState.CONFIGURING
    for _ in range(INLINE_PLAN_MAX_PENDING + 1):
        submit(engine, gpus=1)
    assert planned_on_thread()  # too many pending jobs to plan while requests wait
    pending = [str(job.job_id) for job in engine.state.jobs.values() if job.state == JobState.PENDING]
    engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=tuple(pending[1:]))))  # one pending job left
    engine._last_plan_cpu_s = INLINE_PLAN_MAX_CPU_S  # as if the last plan had been slow
    assert planned_on_thread()
    assert not planned_on_thread()  # that plan was quick again
