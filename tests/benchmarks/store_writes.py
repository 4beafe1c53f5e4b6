#!/usr/bin/env python3
"""How long the store takes to save jobs. A script, not a test: prints `key: value` lines.

    python tests/benchmarks/store_writes.py [--postgres URL] [--rounds 50]

For SQLite (a file in a temporary directory, the controller's settings: WAL, synchronous=NORMAL) and for
PostgreSQL (default: the developer machines' 127.0.0.1:5432, database `test`; a schema of its own, dropped
at the end): the median time of `save_jobs` for one running job (what the controller writes when a job
starts or ends) and for a batch of 1,000 (a large array submitted at once). The unit tests check the
number of statements a save sends; this script prints what they cost on the machine at hand.
"""

from __future__ import annotations

import argparse
import itertools
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sqlalchemy import create_engine, text

from garrison.controller.store import Store, open_store
from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState, NodeAllocation

POSTGRES_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def running_job(job_id: int) -> Job:
    start = 1_700_000_100.0 + job_id
    attempt = Attempt(
        job_id=job_id,
        attempt=0,
        allocation=Allocation(nodes=(NodeAllocation("node-1", (job_id % 8,)),)),
        start_time=start,
        state=JobState.RUNNING,
    )
    return Job(
        job_id=job_id,
        spec=JobSpec(name=f"job-{job_id}", command=("true",)),
        user="bob",
        uid=1000,
        gid=1000,
        account="default",
        partition="main",
        time_limit_s=3600,
        submit_time=start - 1.0,
        state=JobState.RUNNING,
        start_time=start,
        attempts=(attempt,),
    )


def median_ms(action: Callable[[], object], rounds: int) -> float:
    action()  # warm the statement cache and the connection pool
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def measure(label: str, store: Store, rounds: int) -> None:
    first = store.allocate_job_ids(1 + 1000 * (rounds + 1))
    one = running_job(first)
    # Alternately the job's start and its end, as the controller writes them.
    versions = itertools.cycle([one, replace(one, state=JobState.COMPLETED, end_time=(one.start_time or 0.0) + 1.0)])
    print(f"{label}_save_one_job_ms: {median_ms(lambda: store.save_jobs([next(versions)]), rounds):.2f}")

    batches = iter(range(rounds + 1))

    def save_a_batch() -> None:
        base = first + 1 + 1000 * next(batches)
        store.save_jobs([running_job(base + i) for i in range(1000)])

    print(f"{label}_save_1000_jobs_ms: {median_ms(save_a_batch, max(3, rounds // 10)):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=POSTGRES_DEFAULT, help="PostgreSQL URL ('' to skip)")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        store = open_store(f"sqlite:///{Path(directory) / 'controller.db'}")
        try:
            measure("sqlite", store, args.rounds)
        finally:
            store.close()

    if args.postgres:
        schema = f"bench_{secrets.token_hex(4)}"
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        try:
            url = f"{args.postgres}?options=-csearch_path%3D{schema}"
            store = open_store(url)
            try:
                measure("postgres", store, args.rounds)
            finally:
                store.close()
        finally:
            with admin.connect() as connection:
                connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
            admin.dispose()


if __name__ == "__main__":
    main()
