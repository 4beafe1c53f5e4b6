"""Dependencies through the engine: gsub --test-only of a job with one (sbatch --test-only -d ...), typed
against the jobs as they are now, as a cycle would, and the core says whether the job would wait for it or
start; and an aftercorr array, task by task. A real engine on a real SQLite store with a manual clock; the
agent link keeps what it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.engines import KeptLink, engine_with_node

from garrison.controller.commands import AttemptStarted, SubmitCommand
from garrison.controller.engine import Engine
from garrison.model.domain import JobSpec, Principal

ALICE = Principal("alice", 1000, 1000, (1000,))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = engine_with_node(tmp_path)
    yield engine
    asyncio.run(engine.stop())


def command(name: str = "t", dependency: str | None = None) -> SubmitCommand:
    return SubmitCommand(JobSpec(name=name, command=("true",), workdir="/", gpus=1, dependency=dependency))


def estimate(engine: Engine, name: str = "t", dependency: str | None = None) -> tuple[str, tuple[str, ...]]:
    estimate = asyncio.run(engine.test_submit(ALICE, command(name, dependency)))
    return estimate.reason, estimate.nodes


def running(engine: Engine, name: str) -> int:
    job_id = engine.submit(ALICE, command(name)).job_id
    asyncio.run(engine.run_cycle())
    engine.agent_message(engine.sessions["n1"], AttemptStarted(job_id, 0))  # type: ignore[arg-type]
    return job_id


def test_a_singleton_with_no_other_job_of_its_name_would_start(engine: Engine) -> None:
    assert estimate(engine, "train", "singleton") == ("", ("n1",))


def test_a_singleton_waits_while_a_job_of_its_name_runs_and_another_name_does_not(engine: Engine) -> None:
    running(engine, "train")
    reason, nodes = estimate(engine, "train", "singleton")
    assert reason == "Dependency" and nodes == ()
    assert estimate(engine, "eval", "singleton") == ("", ("n1",))


def test_a_dependency_on_a_running_job_waits_and_a_met_one_does_not(engine: Engine) -> None:
    first = running(engine, "a")
    assert estimate(engine, dependency=f"afterok:{first}")[0] == "Dependency"
    assert estimate(engine, dependency=f"after:{first}") == ("", ("n1",))  # after: it has started


def test_an_aftercorr_array_follows_the_other_array_task_by_task(tmp_path: Path) -> None:
    """sbatch -d aftercorr:A --array=1-3: task i waits for A's task i, through the engine's snapshot and a
    real cycle: B_1 starts once A_1 completed, B_2 can never (A_2 failed), B_3 waits (A_3 runs)."""
    from garrison.controller.commands import AttemptFinished
    from garrison.model.domain import NodeResult, RankOutcome
    from garrison.model.launch import LaunchDescription

    link = KeptLink("n1")
    engine = engine_with_node(tmp_path, gpus=4, link=link)
    state = engine.state
    try:
        spec = JobSpec(name="a", command=("true",), workdir="/", gpus=1)
        first = engine.submit(ALICE, SubmitCommand(spec, array_indices=(1, 2, 3))).job_id
        asyncio.run(engine.run_cycle())
        a = {state.jobs[i].array_task_id: i for i in range(first, first + 3)}
        for job_id in a.values():
            engine.agent_message(link, AttemptStarted(job_id, 0))  # type: ignore[arg-type]
        for task, code in ((1, 0), (2, 1)):
            engine.agent_message(link, AttemptFinished(NodeResult(a[task], 0, (RankOutcome(0, code),))))  # type: ignore[arg-type]
        follower = JobSpec(name="b", command=("true",), workdir="/", gpus=1, dependency=f"aftercorr:{first}")
        second = engine.submit(ALICE, SubmitCommand(follower, array_indices=(1, 2, 3))).job_id
        asyncio.run(engine.run_cycle())
        b = {state.jobs[i].array_task_id: i for i in range(second, second + 3)}
        launched = {i.job_id for i in link.sent if isinstance(i, LaunchDescription)}
        assert b[1] in launched and not {b[2], b[3]} & launched
        assert state.wait_reasons.get(b[2]) == "DependencyNeverSatisfied"
        assert state.wait_reasons.get(b[3]) == "Dependency"
        # --test-only of such an array is estimated as its first task, whose dependency (A_1) is met
        estimate = asyncio.run(engine.test_submit(ALICE, SubmitCommand(follower, array_indices=(1, 2))))
        assert estimate.reason == "" and estimate.nodes == ("n1",)
    finally:
        asyncio.run(engine.stop())
