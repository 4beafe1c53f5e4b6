"""What must hold before the controller serves: every path it trusts is its own (garrison/trusted_paths.py).

Its state directory and the directories of its keys are created private if missing; its key files, its
SQLite database and the directories of its sockets must belong to its user (or root) and be writable by
nobody else. A failure is a ConfigError: one line naming the setting, and the controller does not start.
Its database files are made private too (jobs' scripts and environments are in them).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from garrison.config import ConfigError, GarrisonConfig
from garrison.trusted_paths import UntrustedPath, check_trusted_file, ensure_trusted_dir

SQLITE_PREFIX = "sqlite:///"
SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")  # the database file and the files SQLite keeps beside it


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` database URL, None for any other database (or an in-memory one)."""
    if not url.startswith(SQLITE_PREFIX):
        return None
    path = url[len(SQLITE_PREFIX):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def check_controller_paths(config: GarrisonConfig) -> None:
    cfg = config.controller
    try:
        ensure_trusted_dir(Path(cfg.state_dir), "controller.state_dir")
        token_key = cfg.token_key_file or str(Path(cfg.state_dir) / "token.key")
        for setting, value in (("key_file", cfg.key_file), ("token_key_file", token_key)):
            ensure_trusted_dir(Path(value).parent, f"the directory of controller.{setting}")
            check_trusted_file(Path(value), f"controller.{setting}")
        for setting, value in (("credential_socket", cfg.credential_socket), ("local_socket", cfg.local_socket)):
            if value:
                # Any user must reach the socket (0755); nobody else may replace it.
                ensure_trusted_dir(Path(value).parent, f"the directory of controller.{setting}", mode=0o755)
        database = sqlite_path(cfg.database)
        if database is not None:
            ensure_trusted_dir(database.parent, "the directory of controller.database")
            for suffix in SQLITE_COMPANIONS:
                check_trusted_file(Path(f"{database}{suffix}"), "controller.database")
    except UntrustedPath as exc:
        raise ConfigError(f"{config.path}: {exc}") from None


def make_database_private(url: str) -> None:
    """SQLite files readable by their owner only (an older controller left them 0644). New ones are created
    so already: the controller runs with umask 077, and SQLite gives its WAL the database file's mode."""
    database = sqlite_path(url)
    if database is None:
        return
    for suffix in SQLITE_COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{database}{suffix}", 0o600)
