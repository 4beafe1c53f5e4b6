"""A private PostgreSQL instance a test can restart and stop at will, never the shared one.

initdb and pg_ctl refuse to run as root, so both run as the postgres user (runuser); the instance listens
on 127.0.0.1 at a free port with trust authentication, its data and socket in a directory of its own.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from pathlib import Path

from helpers.ports import free_port


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found and shutil.which("runuser") else None


class PrivatePostgres:
    def __init__(self) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="gtest-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        shutil.chown(self.root, "postgres", "postgres")
        self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, tool: str, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bindir / tool), *args], check=True,
                       capture_output=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", *args)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._ctl("-o", options, "start")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def restart(self) -> None:
        self._ctl("-m", "fast", "restart")

    def destroy(self) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", str(self.bindir / "pg_ctl"), "-D", str(self.data),
                        "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
