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

from sqlalchemy import Engine, Insert, Row, Table, and_, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from garrison.model.domain import Attempt, Job, JobState, Node, NodeState

from . import schema
from .engine import create_sqlite_reader, is_sqlite
from .interface import JobQuery, LoadedState, UsageRow
from .policy_tables import PolicyTables
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


class SqlStore(PolicyTables):
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
        self._reader: Engine | None = None  # for accounting reads on SQLite, made on first use
        self._reader_lock = threading.Lock()

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

    @contextlib.contextmanager
    def _read_snapshot(self) -> Iterator[Connection]:
        """One consistent view for a long read that must not hold up the controller's writes."""
        if self._sqlite:
            with self._reader_lock:
                if self._reader is None:
                    self._reader = create_sqlite_reader(self._engine)
            if self._reader is not None:
                with self._reader.connect() as connection, connection.begin():
                    yield connection
                return
        with self._snapshot() as connection:
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

        loaded_jobs = _jobs_from_rows(job_rows, attempt_rows)
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

    # -- accounting ------------------------------------------------------------------------------------

    def query_jobs(self, query: JobQuery) -> list[Job]:
        jobs_table = schema.jobs
        conditions: list[Any] = [jobs_table.c.job_id > query.after_job_id]
        by_id: list[Any] = []
        if query.job_ids:
            by_id += [jobs_table.c.job_id.in_(query.job_ids), jobs_table.c.array_job_id.in_(query.job_ids)]
        by_id += [
            and_(jobs_table.c.array_job_id == array_id, jobs_table.c.array_task_id == task_id)
            for array_id, task_id in query.array_tasks
        ]
        if by_id:
            conditions.append(or_(*by_id))
        if query.users:
            conditions.append(jobs_table.c.user_name.in_(query.users))
        if query.accounts:
            conditions.append(jobs_table.c.account.in_(query.accounts))
        if query.states:
            conditions.append(jobs_table.c.state.in_([state.value for state in query.states]))
        if query.active_before is not None:
            conditions.append(jobs_table.c.submit_time <= query.active_before)
        if query.active_after is not None:
            conditions.append(
                or_(jobs_table.c.end_time.is_(None), jobs_table.c.end_time >= query.active_after)
            )
        statement = select(jobs_table).where(*conditions).order_by(jobs_table.c.job_id)
        if query.limit is not None:
            statement = statement.limit(query.limit)
        attempts_table = schema.job_attempts
        with self._read_snapshot() as connection:
            job_rows = connection.execute(statement).all()
            ids = [row.job_id for row in job_rows]
            attempt_rows: list[Row[Any]] = []
            for start in range(0, len(ids), DELETE_BATCH):
                attempt_rows += connection.execute(
                    select(attempts_table)
                    .where(attempts_table.c.job_id.in_(ids[start : start + DELETE_BATCH]))
                    .order_by(attempts_table.c.job_id, attempts_table.c.attempt)
                ).all()
        return _jobs_from_rows(job_rows, attempt_rows)

    def usage(
        self,
        start: float,
        end: float,
        now: float,
        users: Sequence[str] = (),
        accounts: Sequence[str] = (),
    ) -> list[UsageRow]:
        jobs_table, attempts_table = schema.jobs, schema.job_attempts
        # An attempt with no end of its own (still running, or closed by a path that never stamped it)
        # ends with its job, else now.
        attempt_end = func.coalesce(attempts_table.c.end_time, jobs_table.c.end_time, now)
        conditions: list[Any] = [attempts_table.c.start_time < end, attempt_end > start]
        if users:
            conditions.append(jobs_table.c.user_name.in_(list(users)))
        if accounts:
            conditions.append(jobs_table.c.account.in_(list(accounts)))
        statement = (
            select(
                jobs_table.c.account,
                jobs_table.c.user_name,
                attempts_table.c.job_id,
                attempts_table.c.start_time,
                attempt_end.label("end_time"),
                attempts_table.c.allocation_json,
            )
            .select_from(attempts_table.join(jobs_table, attempts_table.c.job_id == jobs_table.c.job_id))
            .where(*conditions)
        )
        gpu_seconds: defaultdict[tuple[str, str], float] = defaultdict(float)
        job_ids: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
        attempt_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
        with self._read_snapshot() as connection:
            rows = connection.execute(statement).all()
        for row in rows:
            key = (row.account, row.user_name)
            overlap = min(row.end_time, end) - max(row.start_time, start)
            # The GPU count lives in the allocation's JSON; parsing it here keeps the schema free of a
            # derived column that every writer would have to keep in step.
            gpu_seconds[key] += max(overlap, 0.0) * allocation_from_json(row.allocation_json).gpu_count()
            job_ids[key].add(row.job_id)
            attempt_counts[key] += 1
        return [
            UsageRow(account=account, user=user, gpu_seconds=gpu_seconds[(account, user)],
                     jobs=len(job_ids[(account, user)]), attempts=attempt_counts[(account, user)])
            for account, user in sorted(gpu_seconds)
        ]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.dispose()
        self._engine.dispose()


def _attempt_from_row(row: Row[Any]) -> Attempt:
    return Attempt(
        job_id=row.job_id,
        attempt=row.attempt,
        allocation=allocation_from_json(row.allocation_json),
        start_time=row.start_time,
        end_time=row.end_time,
        state=JobState(row.state),
        exit_code=row.exit_code,
        reason=row.reason,
    )


def _jobs_from_rows(job_rows: Sequence[Row[Any]], attempt_rows: Sequence[Row[Any]]) -> list[Job]:
    """Jobs from their rows, each with its attempts (``attempt_rows`` in attempt order)."""
    attempts_by_job: defaultdict[int, list[Attempt]] = defaultdict(list)
    for row in attempt_rows:
        attempts_by_job[row.job_id].append(_attempt_from_row(row))
    return [
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
