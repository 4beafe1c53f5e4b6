#!/usr/bin/env python3
"""Database faults during a run, counted from the jobs' side. A script, not a test: prints `key: value`.

    python tests/benchmarks/faults_store.py [--jobs 600] [--outage-s 20] [--scenario postgresql|disk|both]

postgresql: a private PostgreSQL instance (initdb/pg_ctl as the postgres user, on a free port; never the
shared one) under a two-agent cluster; during a run of N one-GPU jobs it is restarted, then stopped for
--outage-s seconds, then started again. disk: the controller's SQLite database on a 24 MB tmpfs that is
filled up during the run for --outage-s seconds, then freed. Each job appends its own start/end lines to a
journal (tests/helpers/job_journal.py); the counts are read from it, from gqueue/ginfo and from the
database's rows. Every count named *_twice, *_overlapping, *_lost, *_leaked must be 0.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from e2e.conftest import Cluster, start_cluster, stop_cluster  # noqa: E402
from helpers.job_journal import journaled_command, read_journal  # noqa: E402
from helpers.polling import wait_until  # noqa: E402
from helpers.private_postgres import PrivatePostgres  # noqa: E402

WORK_S = 0.3


def ended(journal: Path) -> int:
    if not journal.exists():
        return 0
    return sum(1 for line in journal.read_text().splitlines() if line.startswith("end "))


def gpus_allocated(c: Cluster) -> int:
    lines = c.run("ginfo").stdout.splitlines()[1:]
    return sum(int(line.split()[2].split("/")[0]) for line in lines if line.strip())


def refused(c: Cluster) -> tuple[int, int]:
    """(changes refused, changes accepted) of a gsub tried while the database is down."""
    answer = c.run("gsub", "-G", "1", "-o", "/dev/null", "--wrap", "true", check=False)
    return (1, 0) if answer.returncode != 0 and "the database is unavailable, retry" in answer.stderr else (0, 1)


def report(name: str, c: Cluster, journal: Path, jobs: int, rows: dict[str, int], started: float,
           outage_s: float, recovered_s: float, refusals: tuple[int, int]) -> None:
    runs = read_journal(journal)
    completed = {job: sum(1 for r in job_runs if r.completed) for job, job_runs in runs.items()}
    overlapping = 0
    for job_runs in runs.values():
        ordered = sorted(job_runs, key=lambda r: r.start)
        overlapping += sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if a.end is None or a.end > b.start)
    states = [j["state"] for j in c.jobs()]
    log = (c.state_dir / "controller.log").read_text()
    print(f"{name}_jobs: {jobs}")
    print(f"{name}_runs_started: {sum(len(r) for r in runs.values())}")
    print(f"{name}_jobs_completed_once: {sum(1 for n in completed.values() if n == 1)}")
    print(f"{name}_jobs_run_twice: {sum(1 for n in completed.values() if n > 1)}")
    print(f"{name}_jobs_lost: {jobs - len(completed)}")
    print(f"{name}_attempts_overlapping: {overlapping}")
    print(f"{name}_jobs_not_completed_in_queue: {sum(1 for s in states if s != 'COMPLETED')}")
    print(f"{name}_gpus_leaked_when_idle: {gpus_allocated(c)}")
    print(f"{name}_rows_completed: {rows.get('COMPLETED', 0)}")
    print(f"{name}_rows_other: {sum(v for k, v in rows.items() if k != 'COMPLETED')}")
    print(f"{name}_changes_refused_during_outage: {refusals[0]}")
    print(f"{name}_changes_accepted_during_outage: {refusals[1]}")
    print(f"{name}_agent_backlogs: {log.count('report waits for the database')}")  # a node's reports began to wait
    print(f"{name}_tracebacks_in_log: {log.count('Traceback')}")
    print(f"{name}_outage_s: {outage_s:.1f}")
    print(f"{name}_recovery_to_last_job_s: {recovered_s:.1f}")
    print(f"{name}_wall_s: {time.monotonic() - started:.1f}")


def run_postgresql(jobs: int, outage_s: float) -> None:
    pg = PrivatePostgres()
    pg.start()
    c = start_cluster(["dgx-a100", "dgx1v"], ["--database", pg.url])
    try:
        started = time.monotonic()
        journal = c.work / "journal"
        c.submit("--array", f"0-{jobs - 1}", "-G", "1", "-t", "10", "-o", "/dev/null",
                 "--wrap", journaled_command(journal, WORK_S))
        wait_until(lambda: ended(journal) >= jobs // 6, 600, what="a sixth of the jobs")
        pg.restart()
        mark = ended(journal)
        wait_until(lambda: ended(journal) >= mark + jobs // 6, 600, what="jobs after the restart")
        pg.stop()
        down = time.monotonic()
        refusals = refused(c)
        time.sleep(max(0.0, outage_s - (time.monotonic() - down)))
        pg.start()
        back = time.monotonic()
        wait_until(lambda: ended(journal) >= jobs, 900, what="every job's end")
        wait_until(lambda: all(j["state"] == "COMPLETED" for j in c.jobs()), 120, what="every job COMPLETED")
        recovered = time.monotonic() - back
        import psycopg

        with psycopg.connect(pg.url.replace("postgresql+psycopg://", "postgresql://")) as db:
            rows = dict(db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
        report("postgresql", c, journal, jobs, rows, started, time.monotonic() - down - recovered, recovered, refusals)
    finally:
        stop_cluster(c)
        pg.destroy()


def run_disk(jobs: int, outage_s: float) -> None:
    mount = Path(tempfile.mkdtemp(prefix="gbench-tmpfs-", dir="/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mount)], check=True)
    database = mount / "controller.db"
    c = start_cluster(["dgx-a100", "dgx1v"], ["--database", f"sqlite:///{database}"])
    try:
        started = time.monotonic()
        journal = c.work / "journal"
        c.submit("--array", f"0-{jobs - 1}", "-G", "1", "-t", "10", "-o", "/dev/null",
                 "--wrap", journaled_command(journal, WORK_S))
        wait_until(lambda: ended(journal) >= jobs // 4, 600, what="a quarter of the jobs")
        filler = mount / "filler"
        with filler.open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
            except OSError:
                pass
        down = time.monotonic()
        refusals = (0, 0)
        while refusals[0] == 0 and time.monotonic() - down < outage_s:
            r = refused(c)
            refusals = (refusals[0] + r[0], refusals[1] + r[1])
        time.sleep(max(0.0, outage_s - (time.monotonic() - down)))
        filler.unlink()
        back = time.monotonic()
        total = jobs  # (submissions accepted before the disk's last free page went are not journaled)
        wait_until(lambda: ended(journal) >= total, 900, what="every job's end")
        wait_until(lambda: all(j["state"] == "COMPLETED" for j in c.jobs()), 120, what="every job COMPLETED")
        recovered = time.monotonic() - back
        with sqlite3.connect(database) as db:
            integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
            rows = dict(db.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall())
        report("disk", c, journal, total, rows, started, back - down, recovered, refusals)
        print(f"disk_integrity_check: {integrity}")
    finally:
        stop_cluster(c)
        subprocess.run(["umount", "-l", str(mount)], check=False)
        os.rmdir(mount)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--outage-s", type=float, default=20.0)
    parser.add_argument("--scenario", choices=("postgresql", "disk", "both"), default="both")
    args = parser.parse_args()
    if args.scenario in ("postgresql", "both"):
        run_postgresql(args.jobs, args.outage_s)
    if args.scenario in ("disk", "both"):
        run_disk(args.jobs, args.outage_s)


if __name__ == "__main__":
    main()
