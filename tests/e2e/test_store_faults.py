"""Fault injection on the controller's store (issue 19): nothing lost, nothing run twice.

Real clusters (a controller and two agents over gRPC), real databases, real faults:

- a private PostgreSQL instance (never the shared one) restarted, then stopped for 20 s, during a run of
  hundreds of jobs, with an agent restarted while it is down;
- the SQLite database on a small tmpfs that is filled up during a run, then freed;
- the controller killed with SIGKILL during a preemption's grace period.

Runs are counted from the jobs' side (tests/helpers/job_journal.py): every job ends exactly once, no two
attempts of one job overlap, no GPU stays allocated on the idle cluster, and the database's rows (and
SQLite's integrity check) agree with the jobs' own records. While the database is down, reads are served
from memory and changes are refused in one line, without effect.
"""

from __future__ import annotations

import errno
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers.job_journal import check_runs, journaled_command, read_journal
from helpers.polling import wait_until
from helpers.private_postgres import PrivatePostgres, postgres_bin

from .conftest import PREEMPTION_CONFIG, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

JOBS = 240
WORK_S = 0.3
REFUSAL = "the database is unavailable, retry"


def ended(journal: Path) -> int:
    """How many runs have written their end line."""
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if line.startswith("end "))


def allocated_gpus(c: Cluster) -> dict[str, str]:
    lines = c.run("ginfo").stdout.splitlines()[1:]
    return {line.split()[0]: line.split()[2] for line in lines if line.strip()}


def idle(c: Cluster) -> bool:
    return all(value.startswith("0/") for value in allocated_gpus(c).values())


def submit_run(c: Cluster, journal: Path) -> dict[str, int]:
    """An array of JOBS one-GPU jobs; returns each task's id as gqueue shows it (12_3) -> its own job id
    (SLURM_JOB_ID, which the journal records)."""
    first = int(c.submit("--array", f"0-{JOBS - 1}", "-G", "1", "-t", "10", "-o", "/dev/null",
                         "--wrap", journaled_command(journal, WORK_S)))
    return {f"{first}_{task}": first + task for task in range(JOBS)}


def refused_while_down(c: Cluster, job_ref: str) -> None:
    """The controller answers reads from memory, and refuses changes in one line, changing nothing."""
    assert c.job(job_ref)["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED")
    for command in (("gsub", "-G", "1", "-o", "/dev/null", "--wrap", "true"), ("gcancel", job_ref)):
        answer = c.run(*command, check=False)
        assert answer.returncode != 0, answer
        assert answer.stderr.count("\n") == 1 and REFUSAL in answer.stderr, answer.stderr


def attempts_that_ran(rows: list[tuple[int, str]]) -> dict[int, int]:
    """Attempt rows (job id, reason) per job, less those whose launch failed before any rank ran (a busy
    rendezvous port, say: the job is retried as a new attempt, and its command never started)."""
    counts: dict[int, int] = {}
    for job_id, reason in rows:
        if not reason.startswith("launch failed"):
            counts[job_id] = counts.get(job_id, 0) + 1
    return counts


def finish_and_check(c: Cluster, journal: Path, ids: dict[str, int], timeout: float = 600.0) -> None:
    wait_until(lambda: ended(journal) >= len(ids), timeout, what="every job to write its end line")
    runs = read_journal(journal)
    check_runs(runs, set(ids.values()))
    wait_until(lambda: [j["state"] for j in c.jobs() if j["job_id"] in ids] == ["COMPLETED"] * len(ids), 120,
               what="every job COMPLETED, each listed once")
    wait_until(lambda: idle(c), 60, what=f"no GPU allocated on the idle cluster: {allocated_gpus(c)}")
    log = (c.state_dir / "controller.log").read_text()
    assert "Traceback" not in log and "IndexError" not in log, log[-3000:]
    # The outage was seen: agents' reports waited for the database, and were written once it was back.
    assert "report waits for the database" in log and "queued reports written" in log


# -- PostgreSQL ------------------------------------------------------------------------------------------


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    if postgres_bin() is None:
        pytest.skip("no PostgreSQL server binaries to start a private instance with")
    pg = PrivatePostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()


def test_postgresql_restarted_then_stopped_for_20s_during_a_run(private_postgres: PrivatePostgres) -> None:
    pg = private_postgres
    c = start_cluster(["dgx-a100", "dgx1v"], ["--database", pg.url])
    try:
        journal = c.work / "journal"
        ids = submit_run(c, journal)
        wait_until(lambda: ended(journal) >= JOBS // 6, 300, what="a sixth of the jobs to end")
        pg.restart()
        restarted_at = ended(journal)
        wait_until(lambda: ended(journal) >= restarted_at + JOBS // 6, 300, what="jobs to go on after the restart")
        pg.stop()
        stopped = time.monotonic()
        last = max(ids, key=ids.__getitem__)
        refused_while_down(c, last)
        if c.job(last)["state"] == "PENDING":  # a hold refused is not taken later (it must run, not stay held)
            held = c.run("gcontrol", "hold", last, check=False)
            assert held.returncode != 0 and REFUSAL in held.stderr, held
        # An agent restarted while the database is down registers again (registering needs no write), and
        # its node stays UP; the ranks its supervisors still run are reconciled once the database is back.
        log = c.state_dir / "controller.log"
        registered = log.read_text().count("node node1 registered")
        os.kill(c.pid("agent-1"), signal.SIGKILL)
        c.up()
        wait_until(lambda: log.read_text().count("node node1 registered") > registered, 60,
                   what="agent-1 to register again while the database is down")
        assert c.run("ginfo").stdout.split("\n", 2)[1].split()[:2] != ["node1", "DOWN"]
        time.sleep(max(0.0, 20.0 - (time.monotonic() - stopped)))  # the fault itself: 20 s without a database
        pg.start()
        finish_and_check(c, journal, ids)
        runs = read_journal(journal)
        with psycopg.connect(pg.url.replace("postgresql+psycopg://", "postgresql://")) as db:
            states = dict(db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
            rows = db.execute("SELECT job_id, reason FROM job_attempts").fetchall()
        assert states == {"COMPLETED": JOBS}
        assert attempts_that_ran(rows) == {job: len(job_runs) for job, job_runs in runs.items()}, rows
    finally:
        stop_cluster(c)


# -- SQLite on a full disk -------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = Path(tempfile.mkdtemp(prefix="gtest-tmpfs-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def fill(path: Path) -> None:
    """Write to ``path`` until the file system is full."""
    chunk = b"\0" * (1 << 16)
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


def test_state_disk_full_then_freed_during_a_run(small_tmpfs: Path) -> None:
    database = small_tmpfs / "controller.db"
    c = start_cluster(["dgx-a100", "dgx1v"], ["--database", f"sqlite:///{database}"])
    try:
        journal = c.work / "journal"
        ids = submit_run(c, journal)
        wait_until(lambda: ended(journal) >= JOBS // 4, 300, what="a quarter of the jobs to end")
        filler = small_tmpfs / "filler"
        fill(filler)
        # The first write that needs a page the disk no longer has is refused; until then writes go on
        # (SQLite reuses its log's pages). Submissions are changes: one of them finds the disk full.
        refused = None
        for _ in range(200):
            answer = c.run("gsub", "--parsable", "-G", "1", "-o", "/dev/null", "--wrap",
                           journaled_command(journal, WORK_S), check=False)
            if answer.returncode != 0:
                refused = answer
                break
            ids[answer.stdout.strip()] = int(answer.stdout.strip())
        assert refused is not None and REFUSAL in refused.stderr, refused
        refused_while_down(c, max(ids, key=ids.__getitem__))
        time.sleep(10.0)  # the fault itself: jobs end while nothing can be written
        filler.unlink()
        finish_and_check(c, journal, ids)
        runs = read_journal(journal)
        with sqlite3.connect(database) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            states = dict(db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
            rows = db.execute("SELECT job_id, reason FROM job_attempts").fetchall()
        assert states == {"COMPLETED": len(ids)}
        assert attempts_that_ran(rows) == {job: len(job_runs) for job, job_runs in runs.items()}, rows
    finally:
        stop_cluster(c)


# -- A controller killed during a preemption's grace --------------------------------------------------------

GRACE_S = 15


@pytest.fixture
def long_grace_cluster(tmp_path: Path) -> Iterator[Cluster]:
    config = tmp_path / "preemption.toml"
    config.write_text(PREEMPTION_CONFIG.read_text().replace("grace_time = 5", f"grace_time = {GRACE_S}"))
    c = start_cluster(["dgx-a100"], ["--agents", "1", "--extra-config", str(config)])
    try:
        yield c
    finally:
        stop_cluster(c)


def test_a_controller_killed_during_a_preemptions_grace_keeps_it(long_grace_cluster: Cluster) -> None:
    c = long_grace_cluster
    signals = c.work / "signals"
    victim = c.submit(
        "-q", "low", "-G", "8", "-t", "10", "-o", "/dev/null", "--wrap",
        # The times from /proc/uptime with the shell's own read: a $(date) child started inside the trap can be
        # killed by a second SIGTERM to the job's processes (the agent's and a restarted controller's), leaving
        # the line without its time.
        f"trap 'read t _ < /proc/uptime; echo USR1 $t >> {signals}' USR1; "
        f"trap 'read t _ < /proc/uptime; echo TERM ${{SLURM_RESTART_COUNT:-0}} $t >> {signals}; exit 143' TERM; "
        f"echo START ${{SLURM_RESTART_COUNT:-0}} >> {signals}; "
        "while [ ${SLURM_RESTART_COUNT:-0} -eq 0 ]; do sleep 0.1; done",
    )
    wait_until(lambda: signals.exists() and "START 0" in signals.read_text(), 120, what="the victim to start")
    urgent = c.submit("-q", "urgent", "-G", "8", "-o", "/dev/null", "--wrap", "true")
    wait_until(lambda: "USR1" in signals.read_text(), 120, what="the victim's SIGUSR1")
    warned = float(next(line for line in signals.read_text().splitlines() if line.startswith("USR1")).split()[1])
    os.kill(c.pid("controller"), signal.SIGKILL)
    c.up()  # the controller alone, at the same address, from the same database
    wait_until(lambda: "TERM 0" in signals.read_text(), 120, what="the victim's SIGTERM")
    terminated = float(next(line for line in signals.read_text().splitlines() if line.startswith("TERM")).split()[2])
    assert terminated - warned >= GRACE_S - 1.0, signals.read_text()  # its grace kept, not restarted from zero
    assert c.wait_done(urgent, timeout=120)["state"] == "COMPLETED"
    assert c.wait_done(victim, timeout=120)["state"] == "COMPLETED"
    detail = c.run("gjob", victim).stdout
    assert "Attempt 0: PREEMPTED" in detail and "preempted" in detail.split("Attempt 0:")[1].splitlines()[0], detail
