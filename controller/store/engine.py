"""Creating a SQLAlchemy engine for a store URL, with the per-backend settings the store relies on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.pool import StaticPool

# How long a writer waits for another process's write transaction (a `migrate` command, say) before it
# gives up with "database is locked". Writers inside one store queue on a Python lock instead.
SQLITE_BUSY_TIMEOUT_MS = 30_000


class UnsupportedDatabaseURL(ValueError):
    """A store URL that names neither SQLite nor PostgreSQL."""


@dataclass(frozen=True)
class PoolSettings:
    """The PostgreSQL connection pool (SQLAlchemy's QueuePool); SQLite does not pool.

    The controller writes from the event loop thread and reads for accounting from a few executor
    threads, so a handful of connections is plenty; ``max_overflow`` absorbs bursts of gacct queries.
    ``recycle_s`` replaces connections older than that, before a server-side or firewall idle timeout
    can cut them.
    """

    size: int = 5
    max_overflow: int = 10
    timeout_s: float = 30.0
    recycle_s: float = 3600.0


def create_store_engine(url: str | URL, pool: PoolSettings | None = None) -> Engine:
    """An engine for ``sqlite:///path.db`` or ``postgresql+psycopg://user@host:port/db``."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        if parsed.get_driver_name() != "psycopg":
            # A bare postgresql:// means psycopg2 to SQLAlchemy, which is not a dependency; psycopg 3 is.
            parsed = parsed.set(drivername="postgresql+psycopg")
        # pre_ping: a controller outlives database restarts and idle-connection reapers; a dead pooled
        # connection is replaced at checkout instead of failing the write that drew it.
        pool = pool or PoolSettings()
        return create_engine(
            parsed,
            pool_pre_ping=True,
            pool_size=pool.size,
            max_overflow=pool.max_overflow,
            pool_timeout=pool.timeout_s,
            pool_recycle=pool.recycle_s,
        )
    raise UnsupportedDatabaseURL(
        f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
        "expected sqlite:///path/to/file.db or postgresql+psycopg://user@host:port/database"
    )


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_engine(url: URL) -> Engine:
    database = url.database
    in_memory = database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if in_memory:
        # Every connection to :memory: is a separate empty database; share one connection (the store
        # serialises its use) so that the migrated schema is the one the store then writes to.
        kwargs["poolclass"] = StaticPool
    else:
        assert database is not None
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _configure_sqlite_connection)
    event.listen(engine, "begin", _begin_immediate)
    return engine


def create_sqlite_reader(engine: Engine) -> Engine | None:
    """A second engine on the same SQLite file for long reads (accounting), or None for an in-memory
    database, which has only the store's one connection.

    Its transactions begin DEFERRED: in WAL mode a reader sees one snapshot and never blocks the writer,
    where the store's own BEGIN IMMEDIATE would hold off every submit for as long as the read lasts."""
    database = engine.url.database
    if database in (None, "", ":memory:"):
        return None
    reader = create_engine(engine.url, connect_args={"check_same_thread": False})
    event.listen(reader, "connect", _configure_sqlite_connection)
    event.listen(reader, "begin", lambda connection: connection.exec_driver_sql("BEGIN"))
    return reader


def _configure_sqlite_connection(dbapi_connection: Any, _connection_record: object) -> None:
    # Take transaction control away from Python's sqlite3 module, which opens transactions only before
    # INSERT/UPDATE/DELETE and commits implicitly before DDL; the "begin" listener issues BEGIN itself, so
    # that reads are consistent and a migration's DDL commits or rolls back as a whole.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers do not block the writer, and a commit is an append to the log.
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode syncs at checkpoints, not at every commit: a commit survives the process being
        # killed (it is in the OS page cache) but the last few may be lost if the machine loses power.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def _begin_immediate(connection: Connection) -> None:
    # IMMEDIATE takes the write lock at BEGIN. With a plain (deferred) BEGIN, two transactions that read
    # first and write later can each hold a read lock the other's write waits on, and one fails at once
    # with SQLITE_BUSY, without the busy timeout helping.
    connection.exec_driver_sql("BEGIN IMMEDIATE")
