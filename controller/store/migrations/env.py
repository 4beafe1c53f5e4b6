"""Alembic environment for the store's migrations.

The store runs it through ``garrison.controller.store.migrate`` with an open connection in
``config.attributes["connection"]``. A developer drafting a new migration runs the alembic command line
against a scratch database instead:

    alembic -c controller/store/alembic.ini -x url=sqlite:///scratch.db upgrade head
    alembic -c controller/store/alembic.ini -x url=sqlite:///scratch.db revision --autogenerate -m "..."
"""

from __future__ import annotations

# Absolute imports of the store's modules: Alembic loads this file by path, outside its package.
from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from garrison.controller.store.engine import create_store_engine
from garrison.controller.store.schema import metadata

# Key of the PostgreSQL advisory lock held while migrating (any constant; "garrison" in ASCII).
MIGRATION_LOCK_KEY = 0x6761727269736F6E


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two processes migrating at once (a controller starting while `garrison-controller migrate`
            # runs) must not both create the tables: the second waits here, then finds the schema at head.
            # SQLite needs nothing like it: the transaction began with BEGIN IMMEDIATE.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def _url_from_command_line() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("no database URL: pass -x url=sqlite:///path.db (or postgresql+psycopg://...)")
    return url


def run_migrations_offline() -> None:
    """Print the SQL instead of running it (``alembic upgrade head --sql``), for a DBA to apply."""
    context.configure(
        url=_url_from_command_line(),
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
        return
    engine = create_store_engine(_url_from_command_line())
    try:
        with engine.begin() as own_connection:
            _configure_and_run(own_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
