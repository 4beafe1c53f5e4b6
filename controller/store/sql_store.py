"""The store on SQLAlchemy Core, for SQLite and PostgreSQL alike.

Writes are Core ``INSERT ... ON CONFLICT DO UPDATE`` statements run as one executemany per table, built once
per store: no ORM session, no read before write. A submit waits for its write, so this is the hot path.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, Insert, Table, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from ..domain import Attempt, Job, JobState, Node, NodeState
from . import schema
from .engine import is_sqlite
from .interface import LoadedState
from .schema import COUNTER_ROW_ID
from .serde import (
    allocation_from_json,
    allocation_to_json,
    inventory_from_json,
    inventory_to_json,
    spec_from_json,
    spec_to_json,
)

# Ids per DELETE ... WHERE job_id IN (...): SQLite caps the bound parameters of one statement.
DELETE_BATCH = 500


class SqlStore:
    """``Store`` on a SQLAlchemy engine whose database is already migrated to head (see ``open_store``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sqlite = is_sqlite(engine)
        # SQLite has one writer at a time. Queueing this process's writers on a Python lock hands over at
        # once, where SQLite's busy handler would poll with sleeps; it also guards the single shared
        # connection of an in-memory database. PostgreSQL handles concurrent writers itself.
        self._serialise: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if self._sqlite else contextlib.nullcontext()
        )
        self._upsert_jobs = self._upsert(schema.jobs)
        self._upsert_attempts = self._upsert(schema.job_attempts)
        self._upsert_node = self._upsert(schema.nodes)
        self._upsert_gpus = self._upsert(schema.gpus)

    @property
    def engine(self) -> Engine:
        """The engine underneath, for diagnostics and tests; the controller goes through the methods."""
        return self._engine

    def _upsert(self, table: Table) -> Insert:
        insert = sqlite.insert(table) if self._sqlite else postgresql.insert(table)
        return insert.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={c.name: insert.excluded[c.name] for c in table.columns if not c.primary_key},
        )

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._serialise, self._engine.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        with self._serialise, self._engine.connect() as connection:
            if not self._sqlite:
                # One snapshot for every SELECT, so that jobs and attempts agree even if someone commits
                # between them. (SQLite's BEGIN IMMEDIATE already excludes other writers.)
                connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                yield connection

    # -- Store -----------------------------------------------------------------------------------------

    def load(self) -> LoadedState:
        with self._snapshot() as connection:
            next_job_id = connection.execute(
                select(schema.counters.c.next_job_id).where(schema.counters.c.id == COUNTER_ROW_ID)
            ).scalar_one()
            attempt_rows = connection.execute(
                select(schema.job_attempts).order_by(
                    schema.job_attempts.c.job_id, schema.job_attempts.c.attempt
                )
            ).all()
            job_rows = connection.execute(select(schema.jobs).order_by(schema.jobs.c.job_id)).all()
            node_rows = connection.execute(select(schema.nodes).order_by(schema.nodes.c.name)).all()

        attempts_by_job: defaultdict[int, list[Attempt]] = defaultdict(list)
        for row in attempt_rows:
            attempts_by_job[row.job_id].append(
                Attempt(
                    job_id=row.job_id,
                    attempt=row.attempt,
                    allocation=allocation_from_json(row.allocation_json),
                    start_time=row.start_time,
                    end_time=row.end_time,
                    state=JobState(row.state),
                    exit_code=row.exit_code,
                    reason=row.reason,
                )
            )
        loaded_jobs = [
            Job(
                job_id=row.job_id,
                spec=spec_from_json(row.spec_json),
                user=row.user_name,
                uid=row.uid,
                gid=row.gid,
                account=row.account,
                partition=row.partition,
                time_limit_s=row.time_limit_s,
                submit_time=row.submit_time,
                state=JobState(row.state),
                reason=row.reason,
                priority=row.priority,
                array_job_id=row.array_job_id,
                array_task_id=row.array_task_id,
                start_time=row.start_time,
                end_time=row.end_time,
                exit_code=row.exit_code,
                attempts=tuple(attempts_by_job.get(row.job_id, ())),
                restart_count=row.restart_count,
            )
            for row in job_rows
        ]
        loaded_nodes = [
            Node(
                name=row.name,
                inventory=inventory_from_json(row.inventory_json),
                state=NodeState(row.state),
                reason=row.reason,
                last_heartbeat=row.last_heartbeat,
            )
            for row in node_rows
        ]
        return LoadedState(jobs=loaded_jobs, nodes=loaded_nodes, next_job_id=next_job_id)

    def allocate_job_ids(self, count: int) -> int:
        if count < 1:
            raise ValueError(f"cannot allocate {count} job ids")
        # One UPDATE ... RETURNING: the row lock (PostgreSQL) or the write lock (SQLite) makes the
        # read-and-bump atomic between concurrent callers, and the commit makes it survive a crash.
        bump = (
            update(schema.counters)
            .where(schema.counters.c.id == COUNTER_ROW_ID)
            .values(next_job_id=schema.counters.c.next_job_id + count)
            .returning(schema.counters.c.next_job_id)
        )
        with self._write() as connection:
            next_free: int = connection.execute(bump).scalar_one()
        return next_free - count

    def save_jobs(self, jobs: Sequence[Job]) -> None:
        # A job listed twice takes its last version: PostgreSQL refuses an upsert that touches a row twice.
        latest = {job.job_id: job for job in jobs}
        if not latest:
            return
        job_rows = [_job_row(job) for job in latest.values()]
        attempt_rows = list({key: row for job in latest.values() for key, row in _attempt_rows(job)}.values())
        with self._write() as connection:
            connection.execute(self._upsert_jobs, job_rows)
            if attempt_rows:
                connection.execute(self._upsert_attempts, attempt_rows)

    def save_node(self, node: Node) -> None:
        node_row = {
            "name": node.name,
            "state": node.state.value,
            "reason": node.reason,
            "last_heartbeat": node.last_heartbeat,
            "inventory_json": inventory_to_json(node.inventory),
        }
        gpu_indices = [gpu.index for gpu in node.inventory.gpus]
        with self._write() as connection:
            connection.execute(self._upsert_node, node_row)
            # GPUs gone from the inventory (one fell off the bus, the node was rebuilt) must not linger.
            connection.execute(
                delete(schema.gpus).where(
                    schema.gpus.c.node == node.name, schema.gpus.c.gpu_index.not_in(gpu_indices)
                )
            )
            if gpu_indices:
                connection.execute(self._upsert_gpus, _gpu_rows(node))

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        unique_ids = list(dict.fromkeys(job_ids))
        if not unique_ids:
            return
        with self._write() as connection:
            for start in range(0, len(unique_ids), DELETE_BATCH):
                batch = unique_ids[start : start + DELETE_BATCH]
                # Attempts first, explicitly: correct even where the foreign key's cascade is not enforced.
                connection.execute(delete(schema.job_attempts).where(schema.job_attempts.c.job_id.in_(batch)))
                connection.execute(delete(schema.jobs).where(schema.jobs.c.job_id.in_(batch)))

    def close(self) -> None:
        self._engine.dispose()


def _job_row(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "array_job_id": job.array_job_id,
        "array_task_id": job.array_task_id,
        "name": job.spec.name,
        "user_name": job.user,
        "uid": job.uid,
        "gid": job.gid,
        "account": job.account,
        "partition": job.partition,
        "state": job.state.value,
        "reason": job.reason,
        "priority": job.priority,
        "time_limit_s": job.time_limit_s,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "exit_code": job.exit_code,
        "restart_count": job.restart_count,
        "spec_json": spec_to_json(job.spec),
    }


def _attempt_rows(job: Job) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    """Each attempt's row with its primary key (duplicates would make PostgreSQL refuse the upsert)."""
    for attempt in job.attempts:
        if attempt.job_id != job.job_id:
            raise ValueError(f"job {job.job_id} holds attempt {attempt.attempt} of job {attempt.job_id}")
        yield (
            (attempt.job_id, attempt.attempt),
            {
                "job_id": attempt.job_id,
                "attempt": attempt.attempt,
                "allocation_json": allocation_to_json(attempt.allocation),
                "start_time": attempt.start_time,
                "end_time": attempt.end_time,
                "state": attempt.state.value,
                "exit_code": attempt.exit_code,
                "reason": attempt.reason,
            },
        )


def _gpu_rows(node: Node) -> list[dict[str, Any]]:
    return [
        {
            "node": node.name,
            "gpu_index": gpu.index,
            "uuid": gpu.uuid,
            "name": gpu.name,
            "memory_mib": gpu.memory_mib,
            "pci_bus_id": gpu.pci_bus_id,
            "numa_node": gpu.numa_node,
        }
        for gpu in node.inventory.gpus
    ]
