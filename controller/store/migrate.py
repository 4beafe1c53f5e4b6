"""Running the Alembic migrations in ``migrations/`` programmatically (no alembic.ini at run time)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from .engine import create_store_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# The newest migration's revision (tests/unit/test_store.py checks it is Alembic's head). A database already
# there is opened without importing Alembic, ~0.3 s of a controller's restart (issue 23: serving within 1 s).
HEAD_REVISION = "0004_typed_outcomes"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the store's migrations; env.py runs them on ``connection`` when given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def upgrade_engine(engine: Engine) -> None:
    """Migrate the database behind ``engine`` to the newest schema, in one transaction (nothing to do, and no
    Alembic, where it is at HEAD_REVISION already)."""
    with engine.begin() as connection:
        if _current_revision(connection) == HEAD_REVISION:
            return
        from alembic import command

        command.upgrade(alembic_config(connection), "head")


def _current_revision(connection: Connection) -> str | None:
    """alembic_version's one row, read directly; None where the table is missing (a new database)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    return rows[0][0] if len(rows) == 1 else None


def upgrade(url: str) -> None:
    """Migrate the database at ``url`` to the newest schema (``garrison-controller migrate``)."""
    engine = create_store_engine(url)
    try:
        upgrade_engine(engine)
    finally:
        engine.dispose()


def schema_revision(url: str) -> str | None:
    """The Alembic revision the database at ``url`` is at; None for a database never migrated."""
    engine = create_store_engine(url)
    try:
        with engine.connect() as connection:
            from alembic.runtime.migration import MigrationContext

            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision this version of Garrison knows."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations"
    return head
