"""The controller's durable store: SQLite (embedded, the default) or PostgreSQL, behind one interface.

    store = open_store("sqlite:////var/lib/garrison/controller.db")  # migrates to the newest schema first
    state = store.load()
    first_id = store.allocate_job_ids(1)
    store.save_jobs([job])

See ``interface.Store`` for the contract, ``schema.py`` for the tables and ``migrations/`` for their history.
"""

from __future__ import annotations

from .engine import PoolSettings, UnsupportedDatabaseURL, create_store_engine
from .errors import StoreUnavailable
from .interface import AttemptStop, JobQuery, LoadedState, Store, StoreChanges, UsageRow
from .migrate import upgrade, upgrade_engine
from .sql_store import SqlStore

__all__ = [
    "AttemptStop",
    "JobQuery",
    "LoadedState",
    "PoolSettings",
    "SqlStore",
    "Store",
    "StoreChanges",
    "StoreUnavailable",
    "UnsupportedDatabaseURL",
    "UsageRow",
    "create_store_engine",
    "open_store",
    "upgrade",
]


def open_store(url: str, pool: PoolSettings | None = None) -> Store:
    """Open the store at ``url`` (``sqlite:///path.db`` or ``postgresql+psycopg://user@host:port/db``),
    migrating its schema to the newest version first."""
    engine = create_store_engine(url, pool)
    try:
        upgrade_engine(engine)
    except BaseException:
        engine.dispose()
        raise
    return SqlStore(engine)
