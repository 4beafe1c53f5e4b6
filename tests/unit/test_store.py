"""The controller's durable store: one contract, run against every backend on a real database.

``StoreContract`` holds the tests; ``TestSqliteStore`` and ``TestPostgresStore`` run them on SQLite in a
temporary directory and on PostgreSQL at 127.0.0.1:5432. The PostgreSQL run creates a database
``garrison_test_<random>`` for the session (a fresh, empty schema per test) and drops it at the end. Without a
reachable server those tests are skipped, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import Engine, create_engine, event, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from garrison.controller.store import (
    AttemptStop,
    JobQuery,
    LoadedState,
    SqlStore,
    Store,
    StoreChanges,
    StoreUnavailable,
    UnsupportedDatabaseURL,
    UsageRow,
    create_store_engine,
    open_store,
    upgrade,
)
from garrison.controller.store.errors import JobIdsTaken
from garrison.controller.store.migrate import HEAD_REVISION, alembic_config
from garrison.controller.store.schema import gpus, job_attempts, metadata
from garrison.controller.store.serde import (
    allocation_from_json,
    allocation_to_json,
    inventory_from_json,
    inventory_to_json,
    spec_from_json,
    spec_to_json,
)
from garrison.model.accounts import (
    Account,
    Accounting,
    Limits,
    PartitionDef,
    Qos,
    UsageRecord,
    UsageState,
    User,
)
from garrison.model.domain import (
    Allocation,
    Attempt,
    AttemptUsage,
    Gpu,
    Job,
    JobSpec,
    JobState,
    LaunchMode,
    Node,
    NodeAllocation,
    NodeInventory,
    NodeState,
)
from garrison.model.steps import Step, StepLayout, StepNode, StepState
from tests.helpers.ports import free_port

POSTGRES_HOST, POSTGRES_PORT = "127.0.0.1", 5432
POSTGRES_ADMIN_DSN = f"host={POSTGRES_HOST} port={POSTGRES_PORT} user=postgres dbname=test connect_timeout=3"
POSTGRES_URL_TEMPLATE = f"postgresql+psycopg://postgres@{POSTGRES_HOST}:{POSTGRES_PORT}/{{database}}"

# -- sample values ---------------------------------------------------------------------------------------


def full_spec() -> JobSpec:
    """A spec with every field away from its default, so that a field the store drops shows up."""
    return JobSpec(
        name="train-llm",
        command=("torchrun", "--nproc-per-node=8", "train.py", "--lr", "3e-4"),
        script="#!/bin/bash\necho 'héllo'\n",
        nodes=2,
        gpus=16,
        gpus_per_node=8,
        gpu_type="h100",
        gpu_mem_mb=40_960,
        cpus_per_gpu=12,
        mem_mb=512_000,
        time_limit_s=7200,
        account="research",
        partition="gpu",
        workdir="/home/ada/run",
        env={"NCCL_DEBUG": "INFO", "EMPTY": "", "UNICODE": "ünï"},
        output="out-%j-%t.log",
        error="err-%j-%t.log",
        launch=LaunchMode.NODE,
        ntasks_per_node=4,
        requeue=False,
        max_restarts=3,
        qos="high",
        signal="USR1@90",
        dependency="afterok:1:2,afterany:3_1",
        exclude=("node-7", "node-9"),
        begin_time=1_700_003_600.25,
        nice=-250,
        umask=0o027,
        array_max_running=4,
        submit_host="login-1.example.org",
        submit_dir="/home/ann/project",
        array_task_count=10,
        array_task_min=1,
        array_task_max=19,
        array_task_step=2,
        constraint="h100&ib|a100",
        nodelist=("gpu-b", "gpu-c"),
        exclusive=True,
        ntasks=16,
        cpus_per_task=6,
        gpus_per_task=1,
        ntasks_per_gpu=1,
        cpus_per_node=3,
        mem_per_gpu_mb=65_536,
        mem_per_cpu_mb=4096,
        comment="sweep 3, lr 3e-4",
        open_mode="append",
        mem_whole_node=True,
    )


def full_job(job_id: int = 7) -> Job:
    """A job with every field away from its default and two attempts (one finished, one running)."""
    first = Attempt(
        job_id=job_id,
        attempt=0,
        allocation=Allocation(nodes=(NodeAllocation("gpu-a", (0, 1, 2, 3, 4, 5, 6, 7)),)),
        start_time=1_700_000_010.125,
        end_time=1_700_000_500.5,
        state=JobState.NODE_FAIL,
        exit_code=-9,
        reason="node gpu-a stopped responding",
        usage=AttemptUsage(max_rss_bytes=3 << 30, cpu_time_s=1234.5, gpu_utilization_pct=87.5,
                           gpu_memory_bytes=40 << 30, oom_kills=1),
    )
    second = Attempt(
        job_id=job_id,
        attempt=1,
        allocation=Allocation(
            nodes=(NodeAllocation("gpu-c", (7, 6, 5, 4, 3, 2, 1, 0)), NodeAllocation("gpu-b", (0, 2, 4, 6)))
        ),
        start_time=1_700_000_600.000_001,
        state=JobState.RUNNING,
    )
    return Job(
        job_id=job_id,
        spec=full_spec(),
        user="ada",
        uid=4_294_967_294,  # past a signed 32-bit integer
        gid=1001,
        account="research",
        partition="gpu",
        time_limit_s=7200,
        submit_time=1_700_000_000.123_456,
        state=JobState.RUNNING,
        reason="requeued after node failure",
        priority=-5,
        array_job_id=5,
        array_task_id=2,
        start_time=1_700_000_600.000_001,
        end_time=1_700_000_900.0,
        exit_code=137,
        attempts=(first, second),
        restart_count=1,
    )


def pending_job(job_id: int, user: str = "bob") -> Job:
    """A freshly submitted job: every optional field empty."""
    return Job(
        job_id=job_id,
        spec=JobSpec(name=f"job-{job_id}", command=("sleep", "60")),
        user=user,
        uid=1000,
        gid=1000,
        account="default",
        partition="main",
        time_limit_s=3600,
        submit_time=1_700_000_000.0 + job_id,
    )


def running_job(job_id: int) -> Job:
    attempt = Attempt(
        job_id=job_id,
        attempt=0,
        allocation=Allocation(nodes=(NodeAllocation("node-1", (job_id % 8,)),)),
        start_time=1_700_000_100.0 + job_id,
        state=JobState.RUNNING,
    )
    return replace(
        pending_job(job_id), state=JobState.RUNNING, start_time=attempt.start_time, attempts=(attempt,)
    )


def sample_inventory(hostname: str = "gpu-a", gpu_count: int = 2) -> NodeInventory:
    gpu_list = tuple(
        Gpu(
            index=i,
            uuid=f"GPU-{hostname}-{i:04d}",
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81_559,
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            numa_node=i // 4,
            cpu_affinity="0-47,96-143" if i < 4 else "48-95,144-191",
            mig_enabled=i == 1,
        )
        for i in range(gpu_count)
    )
    return NodeInventory(
        hostname=hostname,
        gpus=gpu_list,
        nvlink=tuple(tuple(0 if i == j else 18 for j in range(gpu_count)) for i in range(gpu_count)),
        topo=tuple(tuple("X" if i == j else "NV18" for j in range(gpu_count)) for i in range(gpu_count)),
        cpus=192,
        memory_mb=2_063_000,
        model="dgx-h100",
        features=("h100", "ib"),
        containment="cgroup-v1: memory,cpuset,devices,pids,freezer",
    )


def sample_node(name: str = "gpu-a", gpu_count: int = 2) -> Node:
    return Node(
        name=name,
        inventory=sample_inventory(name, gpu_count),
        state=NodeState.DRAIN,
        reason="bad DIMM",
        last_heartbeat=1_700_000_123.75,
    )


def assert_every_field_set(value: Any) -> None:
    """Fail if a dataclass field still holds its default: the sample would not prove it round-trips."""
    for f in fields(value):
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            continue
        assert getattr(value, f.name) != default, f"sample {type(value).__name__}.{f.name} is the default"


def sql_engine(store: Store) -> Engine:
    assert isinstance(store, SqlStore)
    return store.engine


# -- serde: pure round trips --------------------------------------------------------------------------------


class TestSerde:
    def test_samples_cover_every_field(self) -> None:
        assert_every_field_set(full_spec())
        assert_every_field_set(full_job())
        assert_every_field_set(sample_node())
        assert_every_field_set(sample_inventory())
        assert_every_field_set(sample_inventory().gpus[1])

    def test_spec_round_trip(self) -> None:
        for spec in (full_spec(), JobSpec(name="x", command=())):
            text_form = spec_to_json(spec)
            assert isinstance(json.loads(text_form), dict)
            assert spec_from_json(text_form) == spec

    def test_spec_json_is_deterministic(self) -> None:
        assert spec_to_json(full_spec()) == spec_to_json(full_spec())

    def test_spec_from_json_fills_missing_fields_and_ignores_unknown_ones(self) -> None:
        # Written before a field existed, or by a newer controller with a field this one lacks.
        spec = spec_from_json(
            '{"name": "old", "command": ["true"], "launch": "single", "from_the_future": 1}'
        )
        assert spec == JobSpec(name="old", command=("true",), launch=LaunchMode.SINGLE)

    def test_spec_from_json_rejects_non_objects(self) -> None:
        with pytest.raises(ValueError, match="not a JSON object"):
            spec_from_json("[1, 2]")

    def test_allocation_round_trip(self) -> None:
        for allocation in (
            full_job().attempts[1].allocation,
            Allocation(nodes=()),
            Allocation((NodeAllocation("n", ()),)),
        ):
            assert allocation_from_json(allocation_to_json(allocation)) == allocation

    def test_inventory_round_trip(self) -> None:
        for inventory in (sample_inventory(gpu_count=8), sample_inventory(gpu_count=0)):
            assert inventory_from_json(inventory_to_json(inventory)) == inventory


# -- the contract every backend must meet ---------------------------------------------------------------------


class StoreContract:
    """The tests; a subclass provides ``store_url``: a database URL with nothing in it yet."""

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        store = open_store(store_url)
        yield store
        store.close()

    def reopen(self, store_url: str) -> LoadedState:
        store = open_store(store_url)
        try:
            return store.load()
        finally:
            store.close()

    # -- jobs

    def test_empty_store(self, store: Store) -> None:
        assert store.load() == LoadedState(jobs=[], nodes=[], next_job_id=1)

    def test_job_round_trip_keeps_every_field(self, store: Store, store_url: str) -> None:
        saved = [full_job(7), pending_job(3), running_job(12)]
        store.save_jobs(saved)

        expected = sorted(saved, key=lambda job: job.job_id)
        assert store.load().jobs == expected
        assert self.reopen(store_url).jobs == expected  # from disk, through a new engine

    def test_save_updates_a_job_through_its_life(self, store: Store) -> None:
        job = pending_job(1)
        store.save_jobs([job])

        allocation = Allocation(nodes=(NodeAllocation("node-1", (0, 1)),))
        first = Attempt(job_id=1, attempt=0, allocation=allocation, start_time=10.0)
        job = job.with_state(JobState.CONFIGURING, start_time=10.0, attempts=(first,))
        store.save_jobs([job])
        assert store.load().jobs == [job]

        first = replace(first, state=JobState.NODE_FAIL, end_time=20.0, exit_code=-9, reason="node lost")
        second = Attempt(job_id=1, attempt=1, allocation=allocation, start_time=30.0, state=JobState.RUNNING)
        job = replace(job, attempts=(first, second), restart_count=1, priority=9, reason="requeued")
        job = job.with_state(JobState.RUNNING)
        store.save_jobs([job])
        assert store.load().jobs == [job]

        second = replace(second, state=JobState.COMPLETED, end_time=40.0, exit_code=0)
        job = job.with_state(JobState.COMPLETED, end_time=40.0, exit_code=0, attempts=(first, second))
        store.save_jobs([job])
        assert store.load().jobs == [job]

    def test_save_of_a_job_listed_twice_keeps_the_last_version(self, store: Store) -> None:
        job = running_job(4)
        finished = job.with_state(JobState.COMPLETED, end_time=99.0, exit_code=0)
        store.save_jobs([job, pending_job(5), finished])
        assert store.load().jobs == [finished, pending_job(5)]

    def test_save_jobs_with_nothing_to_save(self, store: Store) -> None:
        store.save_jobs([])
        assert store.load().jobs == []

    def test_save_jobs_is_one_transaction(self, store: Store) -> None:
        # Make the attempts' INSERT fail after the jobs' INSERT went through: nothing may stay behind.
        def fail_attempt_inserts(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO JOB_ATTEMPTS"):
                raise RuntimeError("injected failure")

        engine = sql_engine(store)
        store.save_jobs([pending_job(1)])
        event.listen(engine, "before_cursor_execute", fail_attempt_inserts)
        try:
            with pytest.raises(RuntimeError, match="injected failure"):
                store.save_jobs([running_job(1), running_job(2)])
        finally:
            event.remove(engine, "before_cursor_execute", fail_attempt_inserts)
        assert store.load().jobs == [pending_job(1)]

    def test_save_refuses_an_attempt_of_another_job(self, store: Store) -> None:
        job = replace(running_job(1), attempts=running_job(2).attempts)
        with pytest.raises(ValueError, match="attempt 0 of job 2"):
            store.save_jobs([job])

    def count_statements(self, store: Store, action: Callable[[], object]) -> list[str]:
        """Run ``action``; return the first word of each statement it sent to the database."""
        sent: list[str] = []

        def record(*args: Any) -> None:
            statement = args[2]  # before_cursor_execute(conn, cursor, statement, params, ctx, executemany)
            sent.append(statement.split(None, 1)[0].upper())

        engine = sql_engine(store)
        event.listen(engine, "before_cursor_execute", record)
        try:
            action()
        finally:
            event.remove(engine, "before_cursor_execute", record)
        return sent

    def test_save_sends_one_statement_per_table_whatever_the_batch(self, store: Store) -> None:
        # The round trips, not a stopwatch, are what keep a save cheap (tests/benchmarks/store_writes.py
        # prints the times): a batch of 1,000 jobs costs the same two statements as one job.
        first_id = store.allocate_job_ids(1001)
        one = [running_job(first_id)]
        batch = [running_job(first_id + 1 + i) for i in range(1000)]
        self.count_statements(store, lambda: store.save_jobs(one))  # the first write may set up the session

        for_one = self.count_statements(store, lambda: store.save_jobs(one))
        for_batch = self.count_statements(store, lambda: store.save_jobs(batch))

        assert [word for word in for_one if word != "BEGIN"] == ["INSERT", "INSERT"]  # job, attempt: upserts
        # The batch's 1,000 new specs go in one more statement; a spec already stored is not sent again.
        assert [word for word in for_batch if word != "BEGIN"] == ["INSERT", "INSERT", "INSERT"]
        assert self.count_statements(store, lambda: store.save_jobs(batch)) == for_one
        assert store.load().jobs == one + batch

    def test_save_is_one_transaction(self, store: Store) -> None:
        commits: list[object] = []

        def record(connection: object) -> None:
            commits.append(connection)

        engine = sql_engine(store)
        event.listen(engine, "commit", record)
        try:
            store.save_jobs([running_job(1), running_job(2), pending_job(3)])
        finally:
            event.remove(engine, "commit", record)
        assert len(commits) == 1

    def test_delete_jobs_removes_them_with_their_attempts(self, store: Store) -> None:
        store.save_jobs([full_job(1), running_job(2), running_job(3), pending_job(4)])
        store.delete_jobs([1, 3, 999])  # 999 was never there

        assert store.load().jobs == [running_job(2), pending_job(4)]
        with sql_engine(store).connect() as connection:
            remaining = connection.execute(select(job_attempts.c.job_id)).scalars().all()
        assert remaining == [2]

        store.delete_jobs([])
        assert [job.job_id for job in store.load().jobs] == [2, 4]

    def test_delete_many_jobs(self, store: Store) -> None:
        store.save_jobs([running_job(i) for i in range(1, 1201)])
        store.delete_jobs(list(range(1, 1201, 2)) + [2])  # more ids than one DELETE statement takes
        assert [job.job_id for job in store.load().jobs] == list(range(4, 1201, 2))

    def test_jobs_are_indexed_by_state_and_user(self, store: Store) -> None:
        indexes = inspect(sql_engine(store)).get_indexes("jobs")
        assert {tuple(index["column_names"]) for index in indexes} >= {("state",), ("user_name",)}

    # -- job ids

    def test_job_ids_are_consecutive_and_never_reused(self, store: Store, store_url: str) -> None:
        assert store.allocate_job_ids(1) == 1
        assert store.allocate_job_ids(5) == 2  # 2..6, a job array
        assert store.allocate_job_ids(1) == 7
        assert store.load().next_job_id == 8

        store.save_jobs([pending_job(7)])
        store.delete_jobs([7])
        assert self.reopen(store_url).next_job_id == 8
        assert store.allocate_job_ids(1) == 8

    def test_a_write_takes_job_ids_with_its_jobs_only_where_the_counter_still_reads_their_first(
        self, store: Store, store_url: str
    ) -> None:
        # The submission's own transaction moves the counter on (StoreChanges.job_ids): one commit for both.
        store.write(StoreChanges(jobs=[pending_job(1), pending_job(2)], job_ids=(1, 3)))
        assert store.load().next_job_id == 3
        assert store.allocate_job_ids(2) == 3  # another writer took 3..4
        # A write that would take ids someone else took writes nothing at all: not its jobs either.
        with pytest.raises(JobIdsTaken):
            store.write(StoreChanges(jobs=[pending_job(3)], job_ids=(3, 4)))
        reopened = self.reopen(store_url)
        assert reopened.next_job_id == 5 and sorted(job.job_id for job in reopened.jobs) == [1, 2]

    def test_allocating_no_ids_is_refused(self, store: Store) -> None:
        for count in (0, -1):
            with pytest.raises(ValueError):
                store.allocate_job_ids(count)
        assert store.allocate_job_ids(1) == 1

    def test_job_ids_are_unique_under_concurrency(self, store: Store, store_url: str) -> None:
        # Threads share two stores (two engines, two pools) so that the atomicity comes from the database,
        # not from one store's lock.
        other_store = open_store(store_url)
        stores = [store, other_store]
        ranges: list[range] = []
        ranges_lock = threading.Lock()
        errors: list[BaseException] = []

        def allocate_many(worker: int) -> None:
            try:
                for i in range(25):
                    count = 1 + (worker + i) % 4
                    first = stores[(worker + i) % 2].allocate_job_ids(count)
                    with ranges_lock:
                        ranges.append(range(first, first + count))
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=allocate_many, args=(worker,)) for worker in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        other_store.close()

        assert errors == []
        handed_out = sorted(job_id for r in ranges for job_id in r)
        assert handed_out == list(range(1, len(handed_out) + 1))  # unique, and no gaps
        assert store.load().next_job_id == len(handed_out) + 1

    # -- nodes

    def test_node_round_trip(self, store: Store, store_url: str) -> None:
        nodes = [
            sample_node("gpu-b", gpu_count=8),
            sample_node("gpu-a"),
            replace(sample_node("cpu-1", 0), state=NodeState.UP),
        ]
        for node in nodes:
            store.save_node(node)

        expected = sorted(nodes, key=lambda node: node.name)
        assert store.load().nodes == expected
        assert self.reopen(store_url).nodes == expected

        with sql_engine(store).connect() as connection:
            rows = connection.execute(
                select(gpus).where(gpus.c.node == "gpu-a").order_by(gpus.c.gpu_index)
            ).all()
        assert [tuple(row) for row in rows] == [
            ("gpu-a", g.index, g.uuid, g.name, g.memory_mib, g.pci_bus_id, g.numa_node)
            for g in sample_inventory("gpu-a").gpus
        ]

    def test_node_update_replaces_state_and_gpus(self, store: Store) -> None:
        store.save_node(sample_node("gpu-a", gpu_count=8))
        # The node came back with two GPUs missing (fallen off the bus).
        smaller = replace(
            sample_node("gpu-a", gpu_count=6), state=NodeState.DOWN, reason="", last_heartbeat=1_800_000_000.5
        )
        store.save_node(smaller)

        assert store.load().nodes == [smaller]
        with sql_engine(store).connect() as connection:
            indices = connection.execute(select(gpus.c.gpu_index).order_by(gpus.c.gpu_index)).scalars().all()
        assert indices == list(range(6))

    # -- durability

    def test_committed_state_survives_sigkill(self, store_url: str) -> None:
        """A child saves jobs, leaves a write uncommitted, and is killed: the parent finds what was committed
        and nothing else, and never gets an id the child was given."""
        child = textwrap.dedent(
            """
            import os, signal, sys
            from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState, NodeAllocation
            from garrison.controller.store import open_store
            from garrison.controller.store.schema import counters

            store = open_store(sys.argv[1])
            first = store.allocate_job_ids(10)
            spare = store.allocate_job_ids(3)  # allocated, never used
            jobs = []
            for job_id in range(first, first + 10):
                attempt = Attempt(job_id, 0, Allocation((NodeAllocation("n1", (0,)),)), 5.0, state=JobState.RUNNING)
                jobs.append(Job(job_id=job_id, spec=JobSpec(name="j", command=("true",)), user="u", uid=1,
                                gid=1, account="a", partition="p", time_limit_s=60, submit_time=1.0,
                                state=JobState.RUNNING, start_time=5.0, attempts=(attempt,)))
            store.save_jobs(jobs)
            print(first, spare, flush=True)

            # A transaction in flight at the moment of the kill: it must vanish.
            connection = store.engine.connect()
            in_flight = connection.begin()
            connection.execute(counters.update().values(next_job_id=1))
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
        result = subprocess.run(
            [sys.executable, "-c", child, store_url], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == -signal.SIGKILL, result.stderr
        first, spare = (int(word) for word in result.stdout.split())

        store = open_store(store_url)
        try:
            state = store.load()
            assert [job.job_id for job in state.jobs] == list(range(first, first + 10))
            assert all(job.state is JobState.RUNNING and len(job.attempts) == 1 for job in state.jobs)
            assert state.next_job_id == spare + 3
            assert store.allocate_job_ids(1) == spare + 3
        finally:
            store.close()

    # -- accounting queries

    @staticmethod
    def accounting_jobs() -> list[Job]:
        """Six jobs of two users in two accounts: finished, running, pending, requeued and an array."""

        def attempt(job_id: int, number: int, gpus: int, start: float, end: float | None,
                    state: JobState) -> Attempt:
            allocation = Allocation((NodeAllocation("n1", tuple(range(gpus))),))
            return Attempt(job_id, number, allocation, start, end_time=end, state=state,
                           exit_code=None if end is None else 0)

        def job(job_id: int, user: str, account: str, submit: float, **changes: Any) -> Job:
            return replace(pending_job(job_id, user), account=account, submit_time=submit, **changes)

        return [
            # ada/research: finished 100..200 on 4 GPUs
            job(1, "ada", "research", 50.0, state=JobState.COMPLETED, start_time=100.0, end_time=200.0,
                exit_code=0, attempts=(attempt(1, 0, 4, 100.0, 200.0, JobState.COMPLETED),)),
            # ada/research: node failure at 400 after 300, requeued, second attempt running since 500 on 2 GPUs
            job(2, "ada", "research", 250.0, state=JobState.RUNNING, start_time=500.0, restart_count=1,
                attempts=(attempt(2, 0, 8, 300.0, 400.0, JobState.NODE_FAIL),
                          attempt(2, 1, 2, 500.0, None, JobState.RUNNING))),
            # bob/default: pending since 600
            job(3, "bob", "default", 600.0),
            # bob/default: an array of two tasks, both finished
            job(4, "bob", "default", 10.0, array_job_id=4, array_task_id=0, state=JobState.FAILED,
                start_time=20.0, end_time=30.0, exit_code=1,
                attempts=(attempt(4, 0, 1, 20.0, 30.0, JobState.FAILED),)),
            job(5, "bob", "default", 10.0, array_job_id=4, array_task_id=1, state=JobState.COMPLETED,
                start_time=20.0, end_time=60.0, exit_code=0,
                attempts=(attempt(5, 0, 1, 20.0, 60.0, JobState.COMPLETED),)),
            # bob/research: cancelled while pending, never ran
            job(6, "bob", "research", 700.0, state=JobState.CANCELLED, end_time=710.0),
        ]

    def query_ids(self, store: Store, **filters: Any) -> list[int]:
        return [job.job_id for job in store.query_jobs(JobQuery(**filters))]

    def test_query_jobs_returns_every_field_and_attempt(self, store: Store, store_url: str) -> None:
        jobs = self.accounting_jobs()
        store.save_jobs([*jobs, full_job(9)])
        assert store.query_jobs(JobQuery()) == [*jobs, full_job(9)]
        # from disk, through a new engine: the records survive a controller restart
        reopened = open_store(store_url)
        try:
            assert reopened.query_jobs(JobQuery(job_ids=(9,))) == [full_job(9)]
        finally:
            reopened.close()

    def test_query_jobs_filters(self, store: Store) -> None:
        store.save_jobs(self.accounting_jobs())
        assert self.query_ids(store, users=("ada",)) == [1, 2]
        assert self.query_ids(store, accounts=("research",)) == [1, 2, 6]
        assert self.query_ids(store, users=("bob",), accounts=("research",)) == [6]
        assert self.query_ids(store, states=(JobState.COMPLETED, JobState.PENDING)) == [1, 3, 5]
        assert self.query_ids(store, job_ids=(4,)) == [4, 5]  # an array's id selects every task
        assert self.query_ids(store, job_ids=(2, 5)) == [2, 5]
        assert self.query_ids(store, array_tasks=((4, 1),)) == [5]
        assert self.query_ids(store, job_ids=(1,), array_tasks=((4, 0),)) == [1, 4]
        assert self.query_ids(store, job_ids=(99,)) == []
        assert self.query_ids(store, users=("nobody",)) == []

    def test_query_jobs_time_window(self, store: Store) -> None:
        store.save_jobs(self.accounting_jobs())
        # Existing at some moment of [S, E]: submitted by E, and not ended before S.
        assert self.query_ids(store, active_after=0.0, active_before=40.0) == [4, 5]
        assert self.query_ids(store, active_after=150.0, active_before=260.0) == [1, 2]
        assert self.query_ids(store, active_after=650.0) == [2, 3, 6]
        assert self.query_ids(store, active_after=711.0) == [2, 3]  # unfinished jobs never age out
        assert self.query_ids(store, active_before=20.0) == [4, 5]
        assert self.query_ids(store, active_after=200.0, active_before=200.0) == [1]  # the edges count

    def test_query_jobs_pages_by_job_id(self, store: Store) -> None:
        store.save_jobs([running_job(i) for i in range(1, 1101)])  # more than one IN (...) batch
        pages: list[list[int]] = []
        after = 0
        while True:
            page = store.query_jobs(JobQuery(after_job_id=after, limit=400))
            if not page:
                break
            assert all(len(job.attempts) == 1 for job in page)
            pages.append([job.job_id for job in page])
            after = page[-1].job_id
        assert [len(page) for page in pages] == [400, 400, 300]
        assert [i for page in pages for i in page] == list(range(1, 1101))

    def test_usage_charges_gpu_time_inside_the_period(self, store: Store) -> None:
        store.save_jobs(self.accounting_jobs())
        # job 1: 4 GPUs x 100 s; job 2: 8 x 100 (first attempt) + 2 x (1000 - 500) running until now
        # job 4: 1 x 10; job 5: 1 x 40; jobs 3 and 6 never ran
        assert store.usage(0.0, 2000.0, now=1000.0) == [
            UsageRow("default", "bob", gpu_seconds=50.0, jobs=2, attempts=2),
            UsageRow("research", "ada", gpu_seconds=400.0 + 800.0 + 1000.0, jobs=2, attempts=3),
        ]
        # A period cuts attempts at its edges: [150, 350] holds 50 s of job 1 and 50 s of job 2's first.
        assert store.usage(150.0, 350.0, now=1000.0) == [
            UsageRow("research", "ada", gpu_seconds=4 * 50.0 + 8 * 50.0, jobs=2, attempts=2)
        ]
        assert store.usage(0.0, 2000.0, now=1000.0, users=["bob"]) == [
            UsageRow("default", "bob", gpu_seconds=50.0, jobs=2, attempts=2)
        ]
        assert store.usage(0.0, 2000.0, now=1000.0, accounts=["default", "nothing"]) == [
            UsageRow("default", "bob", gpu_seconds=50.0, jobs=2, attempts=2)
        ]
        assert store.usage(5000.0, 6000.0, now=1000.0) == []

    def test_usage_of_an_unclosed_attempt_ends_with_its_job(self, store: Store) -> None:
        job = running_job(1)  # one GPU from 1_700_000_101
        start = job.attempts[0].start_time
        ended = replace(job, state=JobState.FAILED, end_time=start + 30.0)  # attempt left without an end
        store.save_jobs([ended])
        (row,) = store.usage(0.0, start + 10_000.0, now=start + 5_000.0)
        assert row.gpu_seconds == 30.0

    def test_accounting_reads_do_not_hold_up_writes(self, store: Store) -> None:
        store.save_jobs([running_job(1)])
        assert isinstance(store, SqlStore)
        read_attempts = select(job_attempts.c.job_id)
        with store._read_snapshot() as connection:  # a long accounting read in progress
            assert connection.execute(read_attempts).scalars().all() == [1]
            # Held up, this write would wait out SQLite's 30 s busy timeout and fail "database is locked".
            store.save_jobs([running_job(2)])
            assert connection.execute(read_attempts).scalars().all() == [1]  # the read keeps its snapshot
        assert self.query_ids(store) == [1, 2]

    # -- migrations

    def test_migrations_build_exactly_the_declared_schema(self, store_url: str) -> None:
        upgrade(store_url)
        engine = create_engine(store_url)
        try:
            with engine.connect() as connection:
                migration_context = MigrationContext.configure(connection, opts={"compare_type": True})
                assert compare_metadata(migration_context, metadata) == []
                head = ScriptDirectory.from_config(alembic_config()).get_current_head()
                assert migration_context.get_current_revision() == head
                # What a restarted controller compares against, without importing Alembic
                assert head == HEAD_REVISION
        finally:
            engine.dispose()

    def test_migrations_downgrade_and_upgrade_again(self, store_url: str) -> None:
        upgrade(store_url)
        engine = create_engine(store_url)
        try:
            with engine.begin() as connection:
                command.downgrade(alembic_config(connection), "base")
            assert set(inspect(engine).get_table_names()) == {"alembic_version"}
        finally:
            engine.dispose()
        upgrade(store_url)
        upgrade(store_url)  # already at head: nothing to do
        assert self.reopen(store_url) == LoadedState(jobs=[], nodes=[], next_job_id=1)

    def test_migration_0004_types_the_launch_failures_older_controllers_wrote_as_reasons(self, store_url: str) -> None:
        """Before 0004 an attempt whose launch failed said so only by the prefix of its reason."""
        store = open_store(store_url)
        try:
            job = replace(running_job(1), state=JobState.PENDING)
            failed = replace(job.attempts[0], state=JobState.FAILED, end_time=job.attempts[0].start_time + 1,
                             reason="launch failed: MASTER_PORT 20001 is in use on this node")
            store.save_jobs([replace(job, attempts=(failed,))])
        finally:
            store.close()
        engine = create_engine(store_url)
        try:
            with engine.begin() as connection:
                command.downgrade(alembic_config(connection), "0003_steps")
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "head")
        finally:
            engine.dispose()
        (loaded,) = self.reopen(store_url).jobs
        assert loaded.attempts[0].launch_failed

    # -- scheduling policy: accounting data, usage, holds (migration 0002) ------------------------------------

    def test_accounting_is_none_until_saved_then_round_trips(self, store: Store, store_url: str) -> None:
        assert store.load_accounting() is None
        accounting = sample_accounting()
        store.save_accounting(accounting)
        assert store.load_accounting() == accounting
        reopened = open_store(store_url)
        try:
            assert reopened.load_accounting() == accounting
        finally:
            reopened.close()

    def test_saving_accounting_replaces_the_whole_of_it(self, store: Store) -> None:
        accounting = sample_accounting()
        store.save_accounting(accounting)
        smaller = accounting.without_user("ann").with_limits("account", "team", Limits())
        smaller = smaller.with_partition(PartitionDef("debug", max_time_s=600, default_time_s=60, default=True))
        store.save_accounting(smaller)
        loaded = store.load_accounting()
        assert loaded == smaller
        assert loaded is not None and [p.name for p in loaded.partitions] == ["main", "debug"]

    def test_usage_is_upserted_with_its_times(self, store: Store) -> None:
        assert store.load_usage() == UsageState()
        first = UsageState((UsageRecord("team", "ann", 10.5, 20.25, 30.0),), updated_at=1_700_000_000.5,
                           period_start=1_699_000_000.0)
        store.save_usage(first)
        second = UsageState((UsageRecord("team", "ann", 11.0, 21.0, 31.0), UsageRecord("org", "bob", 1.0, 2.0, 3.0)),
                            updated_at=1_700_000_010.25, period_start=1_699_000_000.0)
        store.save_usage(second)
        assert store.load_usage() == UsageState(tuple(sorted(second.records, key=lambda r: (r.account, r.user))),
                                                second.updated_at, second.period_start)

    def test_holds_are_kept_and_go_with_their_jobs(self, store: Store) -> None:
        store.save_jobs([pending_job(1), pending_job(2)])
        store.set_hold(1, by_admin=True)
        store.set_hold(2, by_admin=False)
        store.set_hold(2, by_admin=True)
        assert store.load_holds() == {1: True, 2: True}
        store.set_hold(2, None)
        store.set_hold(3, None)  # not held: nothing to do
        assert store.load_holds() == {1: True}
        store.delete_jobs([1])
        assert store.load_holds() == {}

    # -- job steps (migration 0003_steps) ---------------------------------------------------------------------

    def test_steps_round_trip_update_and_go_with_their_jobs(self, store: Store, store_url: str) -> None:
        store.save_jobs([running_job(5), running_job(6)])
        layout = StepLayout(nodes=(
            StepNode("node-1", (0, 1), ((0,), (1,)), ((2, 3), (4, 5)), held_gpus=(0, 1), held_cpus=(2, 3, 4, 5)),
            StepNode("node-2", (2,), ((0, 1),), ((),)),
        ))
        first = Step(job_id=5, step_id=0, name="python", user="ann", uid=1000, argv=("python", "-c", "é"),
                     layout=layout, start_time=1_700_000_200.5)
        store.save_step(first)
        store.save_step(replace(first, step_id=1, name="hostname", argv=("hostname",)))
        store.save_step(replace(first, job_id=6, user="bob"))
        assert store.last_step_id(5) == 1 and store.last_step_id(6) == 0 and store.last_step_id(7) is None
        ended = replace(first, state=StepState.FAILED, end_time=1_700_000_300.0, exit_code=143, reason="cancelled")
        store.save_step(ended)
        assert store.query_steps([5])[0] == ended
        assert [(s.job_id, s.step_id) for s in store.query_steps()] == [(5, 0), (5, 1), (6, 0)]
        assert [(s.job_id, s.step_id) for s in store.query_steps(users=["bob"])] == [(6, 0)]
        assert [(s.job_id, s.step_id) for s in store.query_steps(limit=2)] == [(5, 0), (5, 1)]
        reopened = open_store(store_url)
        try:
            assert reopened.query_steps([5, 6])[0] == ended
            reopened.delete_jobs([5])
            assert [(s.job_id, s.step_id) for s in reopened.query_steps()] == [(6, 0)]
        finally:
            reopened.close()
    # -- one operation, one transaction (issue 19)

    def test_write_stores_jobs_holds_nodes_and_stops_in_one_transaction(self, store: Store, store_url: str) -> None:
        commits: list[object] = []
        record = commits.append
        engine = sql_engine(store)
        event.listen(engine, "commit", record)
        stopping = replace(running_job(1), state=JobState.COMPLETING, reason="stopping:PENDING")
        stop = AttemptStop(1, 0, JobState.PENDING, JobState.PREEMPTED, "preempted", terminate_at=1234.5)
        try:
            store.write(StoreChanges(jobs=[stopping, pending_job(2)], holds={2: True}, nodes=[sample_node()],
                                     stops=[stop, AttemptStop(2, 0, JobState.CANCELLED, JobState.CANCELLED, "x")]))
        finally:
            event.remove(engine, "commit", record)
        assert len(commits) == 1
        loaded = self.reopen(store_url)
        assert [job.job_id for job in loaded.jobs] == [1, 2] and [n.name for n in loaded.nodes] == ["gpu-a"]
        assert loaded.stops == (stop,)  # only those of jobs still being stopped
        assert store.load_holds() == {2: True}
        store.write(StoreChanges(holds={2: None}))
        assert store.load_holds() == {}
        store.delete_jobs([1])
        assert self.reopen(store_url).stops == ()

    def test_a_write_that_fails_writes_nothing(self, store: Store, store_url: str) -> None:
        # The hold names a job that does not exist: the last statement fails, and the jobs before it with it.
        with pytest.raises(IntegrityError):
            store.write(StoreChanges(jobs=[pending_job(1)], nodes=[sample_node()], holds={99: False}))
        loaded = self.reopen(store_url)
        assert loaded.jobs == [] and loaded.nodes == []


def sample_accounting() -> Accounting:
    """Accounting data with every kind of record, built through its validated changes."""
    accounting = Accounting(default_account="default", enforce_associations=True)
    accounting = accounting.with_qos(Qos("low", 0, grace_s=30))
    accounting = accounting.with_qos(Qos("high", 20, ("low",), max_gpus_per_user=8, max_jobs_per_user=2,
                                         max_time_s=86_400, grace_s=120, description="for deadlines"))
    accounting = accounting.with_default_qos("low")
    accounting = accounting.with_account(Account("default"))
    accounting = accounting.with_account(Account("org", shares=3, description="the lab"))
    accounting = accounting.with_account(Account("team", "org", 2, ("high", "low")))
    accounting = accounting.with_user(User("ann", "team", (("default", 1), ("team", 4)), ("org",)))
    accounting = accounting.with_limits("account", "team", Limits(max_gpus=16, max_jobs=4, max_gpu_hours=1000.5))
    accounting = accounting.with_limits("user", "bob", Limits(max_gpus=2))
    return accounting.with_partition(PartitionDef("main", ("n1", "n2"), 600, 86_400, True, ("org",), ("high",), 5))


# -- SQLite ---------------------------------------------------------------------------------------------------


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        # A directory that does not exist yet: the store creates it.
        return f"sqlite:///{tmp_path}/state/controller.db"

    def test_connection_settings(self, store: Store) -> None:
        with sql_engine(store).connect() as connection:
            settings = {
                pragma: connection.exec_driver_sql(f"PRAGMA {pragma}").scalar()
                for pragma in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            }
        assert settings == {
            "journal_mode": "wal",
            "synchronous": 1,
            "foreign_keys": 1,
            "busy_timeout": 30_000,
        }

    def test_a_write_connection_the_driver_lost_is_replaced(self, store: Store, store_url: str) -> None:
        # The store keeps one connection for its SQLite writes: a write on it once the driver has lost it is an
        # outage that writes nothing, and the next write connects again (SQLAlchemy invalidated the old one).
        assert isinstance(store, SqlStore)
        store.save_jobs([running_job(1)])
        kept = store._writer
        assert kept is not None and kept.connection.dbapi_connection is not None
        kept.connection.dbapi_connection.close()
        with pytest.raises(StoreUnavailable):
            store.save_jobs([running_job(2)])
        store.save_jobs([running_job(3)])
        assert [job.job_id for job in self.reopen(store_url).jobs] == [1, 3]

    def test_a_kill_mid_write_on_the_kept_connection_loses_only_that_write(self, store_url: str) -> None:
        """A child acknowledges a submission once its write (ids and job, one transaction on the kept write
        connection) returned, starts the next one on the same connection and is killed inside it: the
        acknowledged job and its ids survive, nothing of the interrupted write does."""
        child = textwrap.dedent(
            """
            import os, signal, sys
            from garrison.model.domain import Job, JobSpec, JobState
            from garrison.controller.store import StoreChanges, open_store
            from garrison.controller.store.schema import counters

            def job(job_id):
                return Job(job_id=job_id, spec=JobSpec(name="j", command=("true",)), user="u", uid=1, gid=1,
                           account="a", partition="p", time_limit_s=60, submit_time=1.0)

            store = open_store(sys.argv[1])
            first = store.allocate_job_ids(1)
            store.save_jobs([job(first)])
            store.write(StoreChanges(jobs=(job(first + 1),), job_ids=(first + 1, first + 2)))
            print(first, flush=True)  # the acknowledgement
            with store._write() as connection:
                store._write_jobs(connection, [job(first + 2)])
                connection.execute(counters.update().values(next_job_id=first + 3))
                os.kill(os.getpid(), signal.SIGKILL)
            """
        )
        result = subprocess.run([sys.executable, "-c", child, store_url], capture_output=True, text=True, timeout=60)
        assert result.returncode == -signal.SIGKILL, result.stderr
        first = int(result.stdout)
        state = self.reopen(store_url)
        assert [job.job_id for job in state.jobs] == [first, first + 1]
        assert state.next_job_id == first + 2

    def test_kept_write_connection_sees_other_writers(self, store: Store, store_url: str) -> None:
        # Another store on the same file (a migration, a second controller refused by its lock) moves the job id
        # counter between two writes of this one: the kept connection reads it, not a stale copy.
        assert store.allocate_job_ids(2) == 1
        other = open_store(store_url)
        try:
            assert other.allocate_job_ids(3) == 3
        finally:
            other.close()
        assert store.allocate_job_ids(1) == 6
        with pytest.raises(JobIdsTaken):
            store.write(StoreChanges(jobs=(pending_job(3),), job_ids=(3, 4)))
        assert store.load().jobs == []


class TestInMemorySqliteStore:
    def test_round_trip(self) -> None:
        store = open_store("sqlite://")
        try:
            assert store.allocate_job_ids(2) == 1
            store.save_jobs([full_job(1)])
            store.save_node(sample_node())
            assert store.load() == LoadedState(jobs=[full_job(1)], nodes=[sample_node()], next_job_id=3)
        finally:
            store.close()


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(UnsupportedDatabaseURL, match="mysql://root:\\*\\*\\*@db/garrison"):
        open_store("mysql://root:secret@db/garrison")


# -- PostgreSQL -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A database of its own for this test session, dropped at the end; its URL."""
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as error:
        reason = f"PostgreSQL at {POSTGRES_HOST}:{POSTGRES_PORT} is unreachable: {error}".strip()
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: PostgreSQL tests must run)")
        pytest.skip(reason)
    name = f"garrison_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield POSTGRES_URL_TEMPLATE.format(database=name)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.postgres
class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store_url(self, postgres_database: str) -> str:
        # Each test starts from an empty schema, which is quicker than a database per test.
        engine = create_engine(postgres_database)
        try:
            with engine.begin() as connection:
                connection.execute(text("DROP SCHEMA public CASCADE"))
                connection.execute(text("CREATE SCHEMA public"))
        finally:
            engine.dispose()
        return postgres_database

    def test_an_unreachable_server_is_store_unavailable(self, store: Store, store_url: str) -> None:
        url = make_url(store_url).set(port=free_port())  # nothing listens there
        unreachable = SqlStore(create_store_engine(url))
        try:
            with pytest.raises(StoreUnavailable) as refused:
                unreachable.save_jobs([pending_job(1)])
            assert str(refused.value) == StoreUnavailable.MESSAGE and "refused" in refused.value.cause.lower()
            with pytest.raises(StoreUnavailable):
                unreachable.load()
        finally:
            unreachable.close()

    def test_bare_postgresql_url_uses_psycopg(self, store_url: str) -> None:
        store = open_store(store_url.replace("postgresql+psycopg://", "postgresql://"))
        try:
            assert sql_engine(store).dialect.driver == "psycopg"
            assert store.load().next_job_id == 1
        finally:
            store.close()

    def test_counter_row_is_locked_while_allocating(self, store: Store, store_url: str) -> None:
        # A second allocator waits for the first one's transaction instead of reading the same value.
        engine = create_engine(store_url)
        try:
            with engine.begin() as connection:
                connection.execute(text("SELECT next_job_id FROM counters FOR UPDATE"))
                results: list[int] = []
                waiter = threading.Thread(target=lambda: results.append(store.allocate_job_ids(1)))
                waiter.start()
                waiter.join(timeout=0.3)
                assert waiter.is_alive() and results == []
                connection.execute(text("UPDATE counters SET next_job_id = next_job_id + 100"))
            waiter.join(timeout=10)
            assert results == [101]
        finally:
            engine.dispose()
