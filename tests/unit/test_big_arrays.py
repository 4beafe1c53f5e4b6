"""One user's large array must not stall the controller or fill it (issue 20): the engine on a real SQLite
store, driven as the RPC layer drives it.

- a large array is written in chunks while other requests are answered, cancelled the same way, and a
  controller killed in the middle of writing one restarts without any of it;
- each pending task costs the controller under 2 KB of memory, before and after a restart (one spec shared);
- the per-user cap on queued jobs (max_submit_jobs) and on array size (max_array_size) refuse in one line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.polling import wait_until
from sqlalchemy import create_engine, func, select

from garrison.config import ControllerConfig
from garrison.controller.bulk import CHUNK_JOBS
from garrison.controller.clock import ManualClock
from garrison.controller.commands import CancelCommand, JobFilter, SubmitCommand
from garrison.controller.engine import Engine
from garrison.controller.state import ClusterState
from garrison.controller.store import open_store
from garrison.controller.store.schema import jobs as jobs_table
from garrison.controller.store.schema import unfinished_submissions
from garrison.controller.submitcaps import SubmitLimitExceeded
from garrison.controller.validate import ValidationError
from garrison.model.domain import JobSpec, JobState, Principal

ALICE = Principal("alice", 1000, 1000, (1000,))
BOB = Principal("bob", 1001, 1001, (1001,))
PER_TASK_BOUND = 2048


def spec(name: str = "sweep") -> JobSpec:
    return JobSpec(name=name, command=(), script="#!/bin/bash\necho $SLURM_ARRAY_TASK_ID\n", workdir="/tmp",
                   env={f"VAR_{i}": "x" * 40 for i in range(30)})


def array(count: int, name: str = "sweep") -> SubmitCommand:
    return SubmitCommand(spec(name), array_indices=tuple(range(count)))


def make_engine(database: str, **settings: object) -> Engine:
    config = ControllerConfig(database=database, state_dir="/tmp", **settings)  # type: ignore[arg-type]
    state = ClusterState(open_store(database), config.heartbeat_timeout_s)
    clock = ManualClock(1000.0)
    state.load(clock.now(), config.finished_job_retention_s)
    return Engine(config, state, clock)


@pytest.fixture
def database(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/controller.db"


def stored_states(database: str) -> dict[str, int]:
    engine = create_engine(database)
    try:
        with engine.connect() as connection:
            rows = connection.execute(select(jobs_table.c.state, func.count()).group_by(jobs_table.c.state)).all()
    finally:
        engine.dispose()
    return {state: count for state, count in rows}


class TestChunkedWrites:
    def test_a_large_array_is_written_in_chunks_while_others_are_answered(self, database: str) -> None:
        engine = make_engine(database)
        engine.submit(BOB, SubmitCommand(spec("bobs")))
        tasks = 20 * CHUNK_JOBS

        async def scenario() -> tuple[int, int, list[int]]:
            submission = asyncio.ensure_future(engine.submit_async(ALICE, array(tasks)))
            # Bob's gqueue, asked again and again while Alice's array goes in: answered every time, and
            # never with a task of hers (the index gives him his own jobs).
            answered = 0
            seen: list[int] = []
            while not submission.done():
                seen = [job.job_id for job in engine.list_jobs(JobFilter(users=frozenset({"bob"})))]
                answered += 1
                await asyncio.sleep(0)
            submitted = await submission
            return submitted.task_count, answered, seen

        count, answered, seen = asyncio.run(scenario())
        assert count == tasks
        assert answered > tasks // CHUNK_JOBS  # the loop ran Bob's requests between every chunk, and more
        assert seen == [1]
        assert sum(1 for job in engine.state.jobs.values() if job.user == "alice") == tasks
        assert stored_states(database) == {"PENDING": tasks + 1}
        # Every task shares the one spec object.
        assert len({id(job.spec) for job in engine.state.jobs.values() if job.user == "alice"}) == 1

    def test_a_large_held_array_is_held_in_chunks_too(self, database: str) -> None:
        engine = make_engine(database)
        tasks = 3 * CHUNK_JOBS + 7
        command = SubmitCommand(spec(), array_indices=tuple(range(tasks)), hold=True)
        first = asyncio.run(engine.submit_async(ALICE, command)).job_id
        ids = set(range(first, first + tasks))
        assert ids <= engine.state.held
        assert set(engine.state.store.load_holds()) == ids
        assert make_engine(database).state.held == ids  # and after a restart

    def test_a_large_array_is_cancelled_in_chunks(self, database: str) -> None:
        engine = make_engine(database)
        tasks = 5 * CHUNK_JOBS

        async def scenario() -> tuple[int, int]:
            submitted = await engine.submit_async(ALICE, array(tasks))
            cancel = asyncio.ensure_future(engine.cancel_async(
                ALICE, CancelCommand(JobFilter(job_refs=(str(submitted.job_id),)))))
            answered = 0
            while not cancel.done():
                engine.list_jobs(JobFilter(users=frozenset({"bob"})))
                answered += 1
                await asyncio.sleep(0)
            return len((await cancel).cancelled), answered

        cancelled, answered = asyncio.run(scenario())
        assert cancelled == tasks
        assert answered > 5
        assert {job.state for job in engine.state.jobs.values()} == {JobState.CANCELLED}
        assert stored_states(database) == {"CANCELLED": tasks}

    @pytest.mark.slow
    def test_a_controller_killed_while_writing_an_array_restarts_without_it(self, database: str) -> None:
        """The client never got the array's id, so none of its tasks may run: a real controller process
        (the engine, on the store) is SIGKILLed once part of the array is stored."""
        script = textwrap.dedent(f"""
            import asyncio, sys
            sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
            from test_big_arrays import ALICE, BOB, array, make_engine, spec
            from garrison.controller.commands import SubmitCommand
            engine = make_engine({database!r}, max_array_size=500_000, max_submit_jobs=0)
            engine.submit(BOB, SubmitCommand(spec("bobs")))
            print("ready", flush=True)
            asyncio.run(engine.submit_async(ALICE, array(500_000)))
            print("finished", flush=True)
        """)
        process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None and process.stdout.readline() == "ready\n"
            wait_until(lambda: stored_states(database).get("PENDING", 0) > 1 + CHUNK_JOBS, 120,
                       what="part of the array to be stored")
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=60)
        assert 1 + CHUNK_JOBS < stored_states(database)["PENDING"] < 1 + 500_000

        engine = make_engine(database)  # the restart
        assert [(job.job_id, job.user) for job in engine.state.jobs.values()] == [(1, "bob")]
        assert stored_states(database) == {"PENDING": 1}
        check = create_engine(database)
        try:
            with check.connect() as connection:
                assert connection.execute(select(func.count()).select_from(unfinished_submissions)).scalar_one() == 0
        finally:
            check.dispose()
        # The ids it had taken are not handed out again.
        assert engine.submit(BOB, SubmitCommand(spec("later"))).job_id > 500_000


MEMORY_SCRIPT = """
import asyncio, gc, sys
sys.path[:0] = [{here!r}, {tests!r}]
from test_big_arrays import ALICE, array, make_engine

def rss() -> int:
    gc.collect()
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

engine = make_engine({database!r})
engine.state.snapshot()
before = rss()
if {submit}:
    asyncio.run(engine.submit_async(ALICE, array({tasks})))
engine.state.snapshot()  # the scheduling views of the pending tasks too
print(rss() - before, len(engine.state.jobs), len({{id(job.spec) for job in engine.state.jobs.values()}}))
"""


class TestMemoryPerTask:
    @pytest.mark.slow
    def test_pending_tasks_cost_under_2_kb_each_before_and_after_a_restart(self, database: str) -> None:
        """The controller's resident memory per pending task of a 100,000-task array, as submitted and as a
        restarted controller loads it (each in a fresh process: the growth from an empty queue)."""
        tasks = 100_000

        def grown(submit: bool) -> tuple[float, int, int]:
            script = MEMORY_SCRIPT.format(here=str(Path(__file__).parent), tests=str(Path(__file__).parents[1]),
                                          database=database, submit=submit, tasks=tasks)
            if not submit:  # a restart: the growth is the load itself, from a process that loaded nothing
                script = script.replace("engine = make_engine(", "engine = None\nbefore0 = rss()\nengine = make_engine(")
                script = script.replace("before = rss()", "before = before0")
            out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out.stderr[-3000:]
            growth, jobs, specs = out.stdout.split()
            return int(growth) / tasks, int(jobs), int(specs)

        submitted, jobs, specs = grown(submit=True)
        assert (jobs, specs) == (tasks, 1)
        restarted, jobs, specs = grown(submit=False)
        assert (jobs, specs) == (tasks, 1)  # one spec shared by every task after the restart too
        print(f"controller bytes per pending task: {submitted:.0f} submitted, {restarted:.0f} after a restart")
        assert submitted < PER_TASK_BOUND
        assert restarted < PER_TASK_BOUND


class TestCaps:
    def test_a_user_past_max_submit_jobs_is_refused_in_one_line(self, database: str) -> None:
        engine = make_engine(database, max_submit_jobs=10)
        engine.submit(ALICE, array(8))
        with pytest.raises(SubmitLimitExceeded) as refused:
            engine.submit(ALICE, array(3))
        message = str(refused.value)
        assert "\n" not in message
        assert "alice has 8 jobs pending or running" in message and "at most 10 (max_submit_jobs)" in message
        engine.submit(ALICE, array(2))  # up to the cap exactly
        engine.submit(BOB, array(10))  # a cap per user: Bob is not Alice
        with pytest.raises(SubmitLimitExceeded):
            engine.submit(ALICE, SubmitCommand(spec()))
        assert stored_states(database) == {"PENDING": 20}  # nothing of the refused ones was stored

    def test_ended_jobs_no_longer_count(self, database: str) -> None:
        engine = make_engine(database, max_submit_jobs=5)
        first = engine.submit(ALICE, array(5)).job_id
        engine.cancel(ALICE, CancelCommand(JobFilter(job_refs=(f"{first}_0", f"{first}_1"))))
        engine.submit(ALICE, array(2))
        with pytest.raises(SubmitLimitExceeded):
            engine.submit(ALICE, array(1))

    def test_the_count_survives_a_restart(self, database: str) -> None:
        make_engine(database, max_submit_jobs=5).submit(ALICE, array(4))
        restarted = make_engine(database, max_submit_jobs=5)
        with pytest.raises(SubmitLimitExceeded, match="alice has 4 jobs"):
            restarted.submit(ALICE, array(2))

    def test_zero_means_no_cap(self, database: str) -> None:
        engine = make_engine(database, max_submit_jobs=0)
        assert engine.submit(ALICE, array(3000)).task_count == 3000

    def test_an_array_past_max_array_size_is_refused_in_one_line(self, database: str) -> None:
        engine = make_engine(database, max_array_size=100)
        with pytest.raises(ValidationError) as refused:
            engine.submit(ALICE, array(101))
        assert "\n" not in str(refused.value) and "max_array_size" in str(refused.value)
        assert stored_states(database) == {}
        assert engine.submit(ALICE, array(100)).task_count == 100
