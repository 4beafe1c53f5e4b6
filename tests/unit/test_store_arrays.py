"""A job array is stored once (issue 20): one spec for all its tasks, a small row per task, on SQLite and
PostgreSQL alike, and a restarted controller shares that one spec between the tasks again.

The attack it answers: one 1 MB script in a 300-task array grew the database by 527 MB, and a 100,000-task
array cost the store tens of KB per task.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, func, select, text
from test_store import pending_job, postgres_database, sql_engine  # noqa: F401 (a fixture)

from garrison.controller.store import Store, open_store
from garrison.controller.store.migrate import alembic_config
from garrison.controller.store.schema import job_specs, jobs
from garrison.model.domain import Job, JobSpec, JobState

MB = 1 << 20
PER_TASK_BOUND = 2048  # bytes of database per pending task, at most (the bound)


def array_tasks(first: int, count: int, spec: JobSpec, user: str = "mallory") -> list[Job]:
    """An array's pending tasks as the engine makes them: one spec object shared by every task."""
    return [
        Job(job_id=first + i, spec=spec, user=user, uid=1000, gid=1000, account="default", partition="main",
            time_limit_s=3600, submit_time=1_700_000_000.0, array_job_id=first, array_task_id=i)
        for i in range(count)
    ]


def database_bytes(engine: Engine) -> int:
    """What the database takes now: SQLite's pages in use, or the total size of
    PostgreSQL's tables with their indexes and TOAST."""
    if engine.dialect.name == "sqlite":
        # The pages in use as a reader sees them (the WAL's included), on a connection of our own.
        with sqlite3.connect(str(engine.url.database)) as connection:
            pages, free, size = (connection.execute(f"PRAGMA {name}").fetchone()[0]
                                 for name in ("page_count", "freelist_count", "page_size"))
        return int((pages - free) * size)
    with engine.connect() as connection:
        return int(connection.execute(text(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        )).scalar_one())


class ArrayStoreContract:
    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[Store]:
        store = open_store(store_url)
        yield store
        store.close()

    def test_a_large_script_in_a_300_task_array_is_stored_once(self, store: Store) -> None:
        # Random-looking text, so that neither backend's compression hides a per-task copy.
        script = "#!/bin/bash\n" + "".join(f"echo {i * 2654435761 % 4294967296:x}\n" for i in range(80_000))
        assert len(script) > MB
        spec = JobSpec(name="big", command=(), script=script)
        engine = sql_engine(store)
        before = database_bytes(engine)
        store.save_jobs(array_tasks(store.allocate_job_ids(300), 300, spec))
        grown = database_bytes(engine) - before
        assert grown < 3 * MB, f"the array grew the database by {grown / MB:.1f} MB"
        with engine.connect() as connection:
            assert connection.execute(select(func.count()).select_from(job_specs)).scalar_one() == 1

    def test_a_100000_task_array_costs_under_2_kb_per_pending_task(self, store: Store) -> None:
        spec = JobSpec(name="sweep", command=(), script="#!/bin/bash\npython sweep.py $SLURM_ARRAY_TASK_ID\n",
                       env={f"VAR_{i}": "x" * 40 for i in range(50)}, array_task_count=100_000)
        engine = sql_engine(store)
        before = database_bytes(engine)
        first = store.allocate_job_ids(100_000)
        tasks = array_tasks(first, 100_000, spec)
        for start in range(0, len(tasks), 10_000):  # as the controller writes it: in chunks
            store.save_jobs(tasks[start : start + 10_000])
        per_task = (database_bytes(engine) - before) / 100_000
        print(f"store bytes per pending task: {per_task:.0f}")
        assert per_task < PER_TASK_BOUND

    def test_tasks_loaded_after_a_restart_share_one_spec(self, store: Store, store_url: str) -> None:
        spec = JobSpec(name="sweep", command=("true",), script="#!/bin/bash\ntrue\n", env={"A": "1"})
        tasks = array_tasks(store.allocate_job_ids(50), 50, spec)
        store.save_jobs([*tasks, pending_job(1000)])
        reopened = open_store(store_url)
        try:
            loaded = reopened.load().jobs
        finally:
            reopened.close()
        assert loaded == [*tasks, pending_job(1000)]
        assert len({id(job.spec) for job in loaded[:50]}) == 1
        assert len({id(job.user) for job in loaded[:50]}) == 1

    def test_a_task_whose_spec_changes_gets_a_spec_of_its_own(self, store: Store, store_url: str) -> None:
        spec = JobSpec(name="sweep", command=("true",))
        tasks = array_tasks(store.allocate_job_ids(3), 3, spec)
        store.save_jobs(tasks)
        changed = replace(tasks[1], spec=replace(spec, qos="high"), state=JobState.PENDING)
        store.save_jobs([changed])
        reopened = open_store(store_url)
        try:
            loaded = reopened.load().jobs
        finally:
            reopened.close()
        assert [job.spec.qos for job in loaded] == [None, "high", None]

    def test_deleting_the_last_job_of_a_spec_deletes_the_spec(self, store: Store) -> None:
        shared = JobSpec(name="sweep", command=("true",))
        tasks = array_tasks(store.allocate_job_ids(3), 3, shared)
        store.save_jobs([*tasks, pending_job(100)])
        engine = sql_engine(store)

        def spec_count() -> int:
            with engine.connect() as connection:
                return int(connection.execute(select(func.count()).select_from(job_specs)).scalar_one())

        assert spec_count() == 2
        store.delete_jobs([tasks[0].job_id, 100])
        assert spec_count() == 1  # the array's, still used by two tasks
        store.delete_jobs([tasks[1].job_id, tasks[2].job_id])
        assert spec_count() == 0
        store.save_jobs([tasks[0]])  # saved again after its spec went: the spec is written again
        assert spec_count() == 1
        assert store.load().jobs == [tasks[0]]

    def test_existing_rows_move_to_shared_specs(self, store_url: str) -> None:
        """Migration 0003 on a database 0002 filled: one spec row per distinct spec text, every job kept."""
        engine = create_engine(store_url)
        try:
            with engine.begin() as connection:
                command.upgrade(alembic_config(connection), "0002")
                columns = ("job_id, array_job_id, array_task_id, name, user_name, uid, gid, account, partition, "
                           "state, reason, priority, time_limit_s, submit_time, restart_count, spec_json")
                for job_id in range(1, 2502):  # more than one batch of the migration
                    spec_json = '{"name":"sweep","command":["true"]}' if job_id > 1 else '{"name":"solo","command":[]}'
                    connection.execute(text(
                        f"INSERT INTO jobs ({columns}) VALUES (:id, :array, :task, 'n', 'bob', 1000, 1000, "
                        "'default', 'main', 'PENDING', '', 0, 60, 1.0, 0, :spec)"
                    ), {"id": job_id, "array": 2 if job_id > 1 else None, "task": job_id - 2 if job_id > 1 else None,
                        "spec": spec_json})
            store = open_store(store_url)
            try:
                loaded = store.load().jobs
            finally:
                store.close()
            assert len(loaded) == 2501
            assert loaded[0].spec.name == "solo"
            assert {job.spec.name for job in loaded[1:]} == {"sweep"}
            assert len({id(job.spec) for job in loaded[1:]}) == 1
            with engine.connect() as connection:
                assert connection.execute(select(func.count()).select_from(job_specs)).scalar_one() == 2
                assert connection.execute(
                    select(func.count()).select_from(jobs).where(jobs.c.spec_key == "")
                ).scalar_one() == 0
        finally:
            engine.dispose()


class TestSqliteArrayStore(ArrayStoreContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/controller.db"


@pytest.mark.postgres
class TestPostgresArrayStore(ArrayStoreContract):
    @pytest.fixture
    def store_url(self, postgres_database: str) -> str:  # noqa: F811 (the fixture imported above)
        engine = create_engine(postgres_database)
        try:
            with engine.begin() as connection:
                connection.execute(text("DROP SCHEMA public CASCADE"))
                connection.execute(text("CREATE SCHEMA public"))
        finally:
            engine.dispose()
        return postgres_database
