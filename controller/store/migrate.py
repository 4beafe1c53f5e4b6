"""Running the Alembic migrations in ``migrations/`` programmatically (no alembic.ini at run time)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import Connection

from .engine import create_store_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for the store's migrations; env.py runs them on ``connection`` when given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def upgrade_engine(engine: Engine) -> None:
    """Migrate the database behind ``engine`` to the newest schema, in one transaction."""
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "head")


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
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision this version of Garrison knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations"
    return head
