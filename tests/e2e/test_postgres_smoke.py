"""The end-to-end smoke subset on PostgreSQL: a local cluster whose controller uses a fresh PostgreSQL
database (`garrison up --database`), a gang job, a failure, a cancel, a controller killed and restarted,
and the accounting records read back from the database.

The whole end-to-end suite runs on SQLite; this subset proves the same daemons on PostgreSQL without
doubling `make test`'s time. It needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth): skipped
without it, except under CI=true, where it fails.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from garrison.config import load_config

from .conftest import Cluster, start_cluster, stop_cluster

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True)
    except psycopg.OperationalError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is unreachable under CI=true: {error}")
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 is unreachable: {error}")
    name = f"garrison_e2e_{secrets.token_hex(6)}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def pg_cluster(database: str) -> Iterator[Cluster]:
    cluster = start_cluster(["dgx-a100", "dgx1v"], ["--database", database])
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def count_rows(database: str, table: str) -> int:
    with psycopg.connect(database.replace("postgresql+psycopg://", "postgresql://")) as connection:
        row = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def test_the_cluster_runs_on_postgresql(pg_cluster: Cluster, database: str) -> None:
    assert load_config(pg_cluster.state_dir / "garrison.toml").controller.database == database
    gang = pg_cluster.submit("-N", "2", "--gpus-per-node", "2", "--wrap", "echo rank $RANK of $WORLD_SIZE")
    failing = pg_cluster.submit("-G", "1", "--wrap", "exit 3")
    long = pg_cluster.submit("-G", "1", "--wrap", "sleep 300")
    assert pg_cluster.wait_done(gang)["state"] == "COMPLETED"
    assert pg_cluster.wait_done(failing)["state"] == "FAILED"
    pg_cluster.wait_state(long, {"RUNNING"})
    pg_cluster.run("gcancel", long)
    assert pg_cluster.wait_done(long)["state"] == "CANCELLED"
    # (a launch refused on a node, say for a busy rendezvous port, is retried as another attempt)
    assert count_rows(database, "jobs") == 3 and count_rows(database, "job_attempts") >= 3
    assert count_rows(database, "nodes") == 2


def test_a_killed_controller_comes_back_from_postgresql(pg_cluster: Cluster, database: str) -> None:
    before = {job["job_id"]: job["state"] for job in pg_cluster.jobs()}
    running = pg_cluster.submit("-G", "2", "--wrap", "sleep 2")
    pg_cluster.wait_state(running, {"RUNNING"})
    os.kill(pg_cluster.pid("controller"), signal.SIGKILL)
    try:
        pg_cluster.up()  # restarts the dead controller, same address, same database
    except AssertionError as failure:
        log = (pg_cluster.state_dir / "controller.log").read_text()[-4000:]
        raise AssertionError(f"{failure}\n--- controller.log ---\n{log}") from None
    after = {job["job_id"]: job["state"] for job in pg_cluster.jobs()}
    assert {k: v for k, v in after.items() if k in before} == before
    assert pg_cluster.wait_done(running)["state"] == "COMPLETED"  # the agents reconcile with the new controller
    newer = pg_cluster.submit("-G", "1", "--wrap", "true")
    assert int(newer) == int(running) + 1  # ids continue from the database, none reused
    assert pg_cluster.wait_done(newer)["state"] == "COMPLETED"


def test_gacct_reads_the_records_from_postgresql(pg_cluster: Cluster) -> None:
    records = json.loads(pg_cluster.run("gacct", "--json", "-a").stdout)["jobs"]
    states = [job["state"] for job in records]
    assert states[:3] == ["COMPLETED", "FAILED", "CANCELLED"] and len(records) >= 5
    gang = records[0]
    assert gang["attempts"][-1]["state"] == "COMPLETED"
    assert sorted(n["node"] for n in gang["attempts"][-1]["allocation"]) == ["node1", "node2"]
    usage = json.loads(pg_cluster.run("gacct", "--usage", "--json").stdout)["usage"]
    assert [row["account"] for row in usage] == ["default"] and usage[0]["jobs"] == len(
        [job for job in records if job["attempts"]])
