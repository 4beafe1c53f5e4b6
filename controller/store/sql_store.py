"""The store on SQLAlchemy Core, for SQLite and PostgreSQL alike.

Writes are Core ``INSERT ... ON CONFLICT DO UPDATE`` statements run as one executemany per table, built once
per store: no ORM session, no read before write. A submit waits for its write, so this is the hot path.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import (
    Engine,
    Insert,
    Row,
    Select,
    Table,
    and_,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from garrison.model.construct import constructor_without_init
from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState, Node, NodeState

from . import schema
from .engine import create_sqlite_reader, is_sqlite
from .errors import JobIdsTaken, outages_as_unavailable
from .interface import AttemptStop, JobQuery, LoadedState, StoreChanges, UsageRow
from .policy_tables import PolicyTables
from .schema import COUNTER_ROW_ID
from .serde import (
    allocation_from_json,
    allocation_to_json,
    inventory_from_json,
    inventory_to_json,
    spec_from_json,
    spec_key,
    spec_to_json,
    usage_from_json,
    usage_to_json,
)
from .step_tables import StepTables

log = logging.getLogger("garrison.controller.store")

# Ids per DELETE ... WHERE job_id IN (...): SQLite caps the bound parameters of one statement.
DELETE_BATCH = 500
# Specs remembered by object identity (their JSON text and key), so that saving the 100,000 tasks of an array,
# or one task again at each state change, encodes its spec once rather than once per save.
SPEC_CACHE_SIZE = 1024
# Allocations whose JSON text is remembered (_AllocationTexts): a few times the attempts running at once.
ALLOCATION_CACHE_SIZE = 4096
# Keys known to be stored, at most: past it the set starts again (which only costs re-sending some specs).
STORED_KEYS_LIMIT = 200_000


class _SpecCache:
    """Spec object -> its key, for the specs saved or loaded lately; and which keys are known to be stored.

    By identity: a JobSpec holds a dict (its environment), so it cannot be hashed, and every task of an array
    shares one spec object anyway. The cache holds each spec it names, so that an id is not reused meanwhile.
    Used under the store's write lock.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[JobSpec, str]] = {}
        self.stored: set[str] = set()  # keys committed to job_specs: saving them again can be skipped

    def key_of(self, spec: JobSpec) -> tuple[str, str | None]:
        """The spec's key, and its JSON text when the key is not known to be stored (None when it is)."""
        found = self._by_id.get(id(spec))
        if found is not None and found[0] is spec and found[1] in self.stored:
            return found[1], None
        text = spec_to_json(spec)
        key = spec_key(text)
        self.remember(spec, key)
        return key, None if key in self.stored else text

    def mark_stored(self, keys: Iterable[str]) -> None:
        if len(self.stored) > STORED_KEYS_LIMIT:
            self.stored.clear()
        self.stored.update(keys)

    def remember(self, spec: JobSpec, key: str) -> None:
        if len(self._by_id) >= SPEC_CACHE_SIZE:
            self._by_id.pop(next(iter(self._by_id)))  # the oldest entry
        self._by_id[id(spec)] = (spec, key)


class _AllocationTexts:
    """Allocation -> its JSON text, for the allocations saved lately, by identity: a job's attempt keeps its
    Allocation object from its start to its end, and is saved with the job at each of its changes (CONFIGURING,
    RUNNING, COMPLETED), so its text is made once rather than each time. Each entry holds its allocation, so that
    an id is not reused meanwhile. Used under the store's write lock."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Allocation, str]] = {}

    def text(self, allocation: Allocation) -> str:
        found = self._by_id.get(id(allocation))
        if found is not None and found[0] is allocation:
            return found[1]
        text = allocation_to_json(allocation)
        if len(self._by_id) >= ALLOCATION_CACHE_SIZE:
            self._by_id.pop(next(iter(self._by_id)))  # the oldest entry
        self._by_id[id(allocation)] = (allocation, text)
        return text


class SqlStore(PolicyTables, StepTables):
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
        self._upsert_stops = self._upsert(schema.attempt_stops)
        self._upsert_holds = self._upsert(schema.job_holds)
        specs_insert = self._insert(schema.job_specs)
        self._insert_specs = specs_insert.on_conflict_do_nothing(index_elements=["spec_key"])
        self._specs = _SpecCache()
        self._allocations = _AllocationTexts()
        # SQLite: one connection kept for the writes, and the hot path's statements sent as text compiled once
        # (below); see _write and _execute.
        self._writer: Connection | None = None
        self._texts: dict[int, tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]]] = {}
        if self._sqlite:
            self._compile_texts()
        # Held by the writers of job rows and by delete_jobs, which deletes the specs no job refers to any
        # more: a save that skips a spec it believes stored must not race that deletion (PostgreSQL).
        self._spec_lock = threading.Lock()
        self._reader: Engine | None = None  # for accounting reads on SQLite, made on first use
        self._reader_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        """The engine underneath, for diagnostics and tests; the controller goes through the methods."""
        return self._engine

    def _insert(self, table: Table) -> Any:
        """The dialect's INSERT, which can say ON CONFLICT. Only the dialect in use is imported: PostgreSQL's
        (with its drivers' modules) costs a SQLite controller ~50 ms of every start (issue 23's restart)."""
        if self._sqlite:
            from sqlalchemy.dialects import sqlite

            return sqlite.insert(table)
        from sqlalchemy.dialects import postgresql

        return postgresql.insert(table)

    def _upsert(self, table: Table) -> Insert:
        insert = self._insert(table)
        return insert.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={c.name: insert.excluded[c.name] for c in table.columns if not c.primary_key},
        )

    # Every transaction goes through one of these three: a database outage leaves each as StoreUnavailable.

    def _compile_texts(self) -> None:
        """The SQL text of the statements every job's save sends (SQLite only), compiled once, with what picks
        a row's values in the text's order (its ``?`` parameters), so that ``_execute`` hands the driver plain
        tuples. A Core statement costs ~50 us of SQLAlchemy's own work each time it runs (its cache key, the
        compiled form's lookup, the parameters' processing), a few times per job (issue 23); the text goes
        through the same connection, events and error handling. No column of these tables needs a bind
        processor under SQLite (integers, floats, text, and a Boolean the driver stores as 0/1 as SQLAlchemy
        would). Positional, not named: the driver looks a named parameter up in the row's dict one by one."""
        counters = schema.counters
        take_ids = (
            update(counters)
            .where(counters.c.id == bindparam("row"), counters.c.next_job_id == bindparam("first"))
            .values(next_job_id=bindparam("end"))
        )
        self._take_ids_statement = take_ids
        for statement in (self._upsert_jobs, self._upsert_attempts, self._insert_specs, self._upsert_stops,
                          self._upsert_holds, take_ids):
            compiled = statement.compile(dialect=self._engine.dialect)
            names = compiled.positiontup
            # Every one of them has several parameters: itemgetter of several names gives a tuple.
            assert names is not None and len(names) > 1, f"not a positional compilation: {compiled}"
            self._texts[id(statement)] = (str(compiled), itemgetter(*names))

    def _execute(self, connection: Connection, statement: Any, rows: Any) -> Any:
        """``connection.execute(statement, rows)`` (rows: a dict or a list of dicts), through its precompiled
        text where there is one."""
        compiled = self._texts.get(id(statement))
        if compiled is None:
            return connection.execute(statement, rows)
        text, values = compiled
        if isinstance(rows, dict):
            return connection.exec_driver_sql(text, values(rows))
        return connection.exec_driver_sql(text, [values(row) for row in rows])

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._serialise, outages_as_unavailable():
            if not self._sqlite:
                with self._engine.begin() as connection:
                    yield connection
                return
            # SQLite: one connection kept for every write (they queue on _serialise anyway), not one checked out
            # of the pool and returned (and reset with a ROLLBACK) per transaction: ~40 us of each of the few
            # transactions per job. A connection the driver found broken is invalidated by SQLAlchemy, and the
            # next transaction's first statement connects again.
            if self._writer is None:
                self._writer = self._engine.connect()
            with self._writer.begin():
                yield self._writer

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        with self._serialise, outages_as_unavailable(), self._engine.connect() as connection:
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
                with outages_as_unavailable(), self._reader.connect() as connection, connection.begin():
                    yield connection
                return
        with self._snapshot() as connection:
            yield connection

    # -- Store -----------------------------------------------------------------------------------------

    def load(self) -> LoadedState:
        self._discard_unfinished_submissions()
        with self._snapshot() as connection:
            next_job_id = connection.execute(
                select(schema.counters.c.next_job_id).where(schema.counters.c.id == COUNTER_ROW_ID)
            ).scalar_one()
            attempt_rows = connection.execute(
                select(schema.job_attempts).order_by(
                    schema.job_attempts.c.job_id, schema.job_attempts.c.attempt
                )
            ).all()
            spec_rows = connection.execute(select(schema.job_specs)).all()
            node_rows = connection.execute(select(schema.nodes).order_by(schema.nodes.c.name)).all()
            stop_rows = connection.execute(
                select(schema.attempt_stops)
                .join(schema.jobs, schema.jobs.c.job_id == schema.attempt_stops.c.job_id)
                .where(schema.jobs.c.state == JobState.COMPLETING.value)
            ).all()
            specs = self._specs_from_rows(spec_rows)
            # The jobs streamed from the cursor into Jobs, not fetched whole first: 50,000 rows held at once
            # left the restarted controller's heap (which does not shrink) ~25 MB larger.
            loaded_jobs = _jobs_from_rows(_raw_rows(connection, select(*_JOB_COLUMNS).order_by(schema.jobs.c.job_id)),
                                          attempt_rows, specs)

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
        stops = tuple(
            AttemptStop(row.job_id, row.attempt, JobState(row.outcome), JobState(row.requeue_as), row.reason,
                        row.terminate_at)
            for row in stop_rows
        )
        return LoadedState(jobs=loaded_jobs, nodes=loaded_nodes, next_job_id=next_job_id, stops=stops)

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

    def _take_job_ids(self, connection: Connection, first: int, end: int) -> None:
        """Move the counter from ``first`` to ``end`` in the caller's transaction, or raise JobIdsTaken (the
        transaction then rolls back). The WHERE makes it safe against another writer of the counter, as the
        row lock (PostgreSQL) or the write lock (SQLite) makes allocate_job_ids safe."""
        if not first < end:
            raise ValueError(f"cannot take job ids {first}..{end - 1}")
        if self._sqlite:
            moved = self._execute(connection, self._take_ids_statement, {"row": COUNTER_ROW_ID, "first": first, "end": end})
        else:
            counters = schema.counters
            moved = connection.execute(
                update(counters)
                .where(counters.c.id == COUNTER_ROW_ID, counters.c.next_job_id == first)
                .values(next_job_id=end)
            )
        if moved.rowcount != 1:
            raise JobIdsTaken(f"job ids from {first} were taken by another writer")

    def save_jobs(self, jobs: Sequence[Job]) -> None:
        if jobs:
            self.write(StoreChanges(jobs=jobs))

    def write(self, changes: StoreChanges) -> None:
        if not changes:
            return
        # Held by the writers of job rows and by delete_jobs (see __init__); a spec is marked stored only once
        # its transaction has committed.
        with self._spec_lock:
            with self._write() as connection:
                if changes.job_ids is not None:
                    self._take_job_ids(connection, *changes.job_ids)
                new_specs = self._write_jobs(connection, changes.jobs)
                for node in {node.name: node for node in changes.nodes}.values():
                    self._write_node(connection, node)
                if changes.stops:
                    stops = {(stop.job_id, stop.attempt): stop for stop in changes.stops}
                    self._execute(connection, self._upsert_stops, [_stop_row(stop) for stop in stops.values()])
                released = [job_id for job_id, by_admin in changes.holds.items() if by_admin is None]
                held = [{"job_id": job_id, "by_admin": by_admin}
                        for job_id, by_admin in changes.holds.items() if by_admin is not None]
                for start in range(0, len(released), DELETE_BATCH):
                    connection.execute(
                        delete(schema.job_holds).where(schema.job_holds.c.job_id.in_(released[start : start + DELETE_BATCH]))
                    )
                if held:
                    self._execute(connection, self._upsert_holds, held)
            self._specs.mark_stored(new_specs)

    def _write_jobs(self, connection: Connection, jobs: Sequence[Job]) -> dict[str, str]:
        """Write the jobs and their attempts (and their specs not stored yet, returned: key -> JSON text, to
        be marked stored once the transaction commits). The caller holds ``_spec_lock``."""
        # A job listed twice takes its last version: PostgreSQL refuses an upsert that touches a row twice.
        latest = {job.job_id: job for job in jobs}
        if not latest:
            return {}
        job_rows: list[dict[str, Any]] = []
        attempt_rows = list({key: row for job in latest.values() for key, row in _attempt_rows(job, self._allocations.text)}.values())
        new_specs = self._job_rows_with_specs(latest.values(), job_rows)
        if new_specs:
            self._execute(connection, self._insert_specs, [{"spec_key": k, "spec_json": v} for k, v in new_specs.items()])
        self._execute(connection, self._upsert_jobs, job_rows)
        if attempt_rows:
            self._execute(connection, self._upsert_attempts, attempt_rows)
        return new_specs

    def _job_rows_with_specs(self, jobs: Iterable[Job], job_rows: list[dict[str, Any]]) -> dict[str, str]:
        """Each job's row, naming its spec by key; returns the specs not known to be stored (key -> JSON)."""
        keys: dict[int, str] = {}  # id(spec) -> key, for this save: each distinct spec is encoded once
        new_specs: dict[str, str] = {}
        for job in jobs:
            key = keys.get(id(job.spec))
            if key is None:
                key, text = self._specs.key_of(job.spec)
                keys[id(job.spec)] = key
                if text is not None:
                    new_specs[key] = text
            job_rows.append(_job_row(job, key))
        return new_specs

    def begin_submission(self, first_job_id: int, count: int) -> None:
        with self._write() as connection:
            connection.execute(
                schema.unfinished_submissions.insert().values(first_job_id=first_job_id, job_count=count)
            )

    def end_submission(self, first_job_id: int) -> None:
        table = schema.unfinished_submissions
        with self._write() as connection:
            connection.execute(delete(table).where(table.c.first_job_id == first_job_id))

    def _discard_unfinished_submissions(self) -> None:
        table = schema.unfinished_submissions
        with self._snapshot() as connection:
            unfinished = connection.execute(select(table.c.first_job_id, table.c.job_count)).all()
        for first, count in unfinished:
            ids = list(range(first, first + count))
            self.delete_jobs(ids)
            self.end_submission(first)
            log.warning("deleted the %d jobs of the submission of job %d, which never finished", count, first)

    def save_node(self, node: Node) -> None:
        self.write(StoreChanges(nodes=(node,)))

    def _write_node(self, connection: Connection, node: Node) -> None:
        node_row = {
            "name": node.name,
            "state": node.state.value,
            "reason": node.reason,
            "last_heartbeat": node.last_heartbeat,
            "inventory_json": inventory_to_json(node.inventory),
        }
        gpu_indices = [gpu.index for gpu in node.inventory.gpus]
        connection.execute(self._upsert_node, node_row)
        # GPUs gone from the inventory (one fell off the bus, the node was rebuilt) must not linger.
        connection.execute(
            delete(schema.gpus).where(schema.gpus.c.node == node.name, schema.gpus.c.gpu_index.not_in(gpu_indices))
        )
        if gpu_indices:
            connection.execute(self._upsert_gpus, _gpu_rows(node))

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        unique_ids = list(dict.fromkeys(job_ids))
        if not unique_ids:
            return
        jobs_table, specs_table = schema.jobs, schema.job_specs
        with self._spec_lock, self._write() as connection:
            keys: set[str] = set()
            for start in range(0, len(unique_ids), DELETE_BATCH):
                batch = unique_ids[start : start + DELETE_BATCH]
                keys.update(connection.execute(
                    select(jobs_table.c.spec_key).where(jobs_table.c.job_id.in_(batch)).distinct()
                ).scalars())
                # Attempts first, explicitly: correct even where the foreign key's cascade is not enforced.
                connection.execute(delete(schema.attempt_stops).where(schema.attempt_stops.c.job_id.in_(batch)))
                connection.execute(delete(schema.job_attempts).where(schema.job_attempts.c.job_id.in_(batch)))
                connection.execute(delete(schema.job_steps).where(schema.job_steps.c.job_id.in_(batch)))
                connection.execute(delete(jobs_table).where(jobs_table.c.job_id.in_(batch)))
            # The specs that went with their last job.
            unused = list(keys)
            for start in range(0, len(unused), DELETE_BATCH):
                connection.execute(delete(specs_table).where(
                    specs_table.c.spec_key.in_(unused[start : start + DELETE_BATCH]),
                    ~exists().where(jobs_table.c.spec_key == specs_table.c.spec_key),
                ))
            self._specs.stored.difference_update(keys)  # some may still be stored: that costs a re-send

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
        statement = select(*_JOB_COLUMNS).where(*conditions).order_by(jobs_table.c.job_id)
        if query.limit is not None:
            statement = statement.limit(query.limit)
        attempts_table = schema.job_attempts
        with self._read_snapshot() as connection:
            job_rows = connection.execute(statement).all()
            ids = [row[0] for row in job_rows]  # _JOB_COLUMNS: the job id first
            attempt_rows: list[Row[Any]] = []
            for start in range(0, len(ids), DELETE_BATCH):
                attempt_rows += connection.execute(
                    select(attempts_table)
                    .where(attempts_table.c.job_id.in_(ids[start : start + DELETE_BATCH]))
                    .order_by(attempts_table.c.job_id, attempts_table.c.attempt)
                ).all()
            keys = list({row[1] for row in job_rows})  # then the spec's key
            spec_rows: list[Row[Any]] = []
            for start in range(0, len(keys), DELETE_BATCH):
                spec_rows += connection.execute(
                    select(schema.job_specs).where(schema.job_specs.c.spec_key.in_(keys[start : start + DELETE_BATCH]))
                ).all()
        specs = {row.spec_key: spec_from_json(row.spec_json) for row in spec_rows}
        return _jobs_from_rows(job_rows, attempt_rows, specs)

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

    def _specs_from_rows(self, spec_rows: Sequence[Row[Any]]) -> dict[str, JobSpec]:
        """Each stored spec decoded once, and shared by every job that refers to it (every task of an
        array), so a restarted controller holds one spec per array in memory, as before the restart."""
        specs = {row.spec_key: spec_from_json(row.spec_json) for row in spec_rows}
        with self._spec_lock:
            for key, spec in specs.items():
                self._specs.remember(spec, key)
            self._specs.mark_stored(specs)
        return specs

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
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
        usage=usage_from_json(row.usage_json),
        launch_failed=bool(row.launch_failed),
    )


# The jobs table's columns a Job is built from, in the order _jobs_from_rows unpacks them.
_JOB_COLUMNS = tuple(schema.jobs.c[name] for name in (
    "job_id", "spec_key", "user_name", "uid", "gid", "account", "partition", "time_limit_s", "submit_time", "state",
    "reason", "priority", "array_job_id", "array_task_id", "start_time", "end_time", "exit_code", "restart_count",
))
_JOB_STATES = {state.value: state for state in JobState}


def _raw_rows(connection: Connection, statement: Select[Any], batch: int = 2000) -> Iterator[tuple[Any, ...]]:
    """``statement``'s rows as the database driver gives them, streamed in batches, in the connection's
    transaction. For columns SQLAlchemy converts nothing in (integers, floats, text: the jobs table's), its
    per-row result machinery is pure overhead: ~0.1 s of a restart with 50,000 jobs."""
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(str(statement.compile(dialect=connection.dialect)))
        while rows := cursor.fetchmany(batch):
            yield from rows
    finally:
        cursor.close()


# Jobs built positionally without their frozen __init__: half of building them at a restart (issue 23).
_new_job = constructor_without_init(Job)


def _jobs_from_rows(
    job_rows: Iterable[Any], attempt_rows: Sequence[Row[Any]], specs: dict[str, JobSpec]
) -> list[Job]:
    """Jobs from their rows (``_JOB_COLUMNS``), each with its attempts (``attempt_rows`` in attempt order) and
    its spec (by key).

    The names that repeat over many rows (user, account, partition, a pending job's reason) are interned, so that 100,000 tasks of
    one user hold one copy of each, as they did before a restart. Rows are unpacked as tuples and Jobs built
    positionally: reading 18 attributes of a SQLAlchemy Row by name, and keywords, cost a restarted
    controller with 50,000 jobs seconds before it could serve (issue 23)."""
    attempts_by_job: defaultdict[int, list[Attempt]] = defaultdict(list)
    for row in attempt_rows:
        attempts_by_job[row.job_id].append(_attempt_from_row(row))
    intern, states, no_attempts, new_job = sys.intern, _JOB_STATES, (), _new_job
    return [
        new_job(job_id, specs[spec_key], intern(user), uid, gid, intern(account), intern(partition), time_limit_s,
            submit_time, states[state], intern(reason), priority, array_job_id, array_task_id, start_time, end_time,
            exit_code, tuple(attempts_by_job[job_id]) if job_id in attempts_by_job else no_attempts, restart_count)
        for (job_id, spec_key, user, uid, gid, account, partition, time_limit_s, submit_time, state, reason, priority,
             array_job_id, array_task_id, start_time, end_time, exit_code, restart_count) in job_rows
    ]


def _job_row(job: Job, spec_key: str) -> dict[str, Any]:
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
        "spec_key": spec_key,
    }


def _attempt_rows(
    job: Job, allocation_text: Callable[[Allocation], str] = allocation_to_json
) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    """Each attempt's row with its primary key (duplicates would make PostgreSQL refuse the upsert)."""
    for attempt in job.attempts:
        if attempt.job_id != job.job_id:
            raise ValueError(f"job {job.job_id} holds attempt {attempt.attempt} of job {attempt.job_id}")
        yield (
            (attempt.job_id, attempt.attempt),
            {
                "job_id": attempt.job_id,
                "attempt": attempt.attempt,
                "allocation_json": allocation_text(attempt.allocation),
                "start_time": attempt.start_time,
                "end_time": attempt.end_time,
                "state": attempt.state.value,
                "exit_code": attempt.exit_code,
                "reason": attempt.reason,
                "usage_json": usage_to_json(attempt.usage),
                "launch_failed": attempt.launch_failed,
            },
        )


def _stop_row(stop: AttemptStop) -> dict[str, Any]:
    return {
        "job_id": stop.job_id,
        "attempt": stop.attempt,
        "outcome": stop.outcome.value,
        "requeue_as": stop.requeue_as.value,
        "reason": stop.reason,
        "terminate_at": stop.terminate_at,
    }


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
