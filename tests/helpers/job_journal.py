"""Runs counted from the jobs' side: each job appends its own start and end lines to one journal file.

A job's command (``journaled_command``) writes ``start JOB ATTEMPT TIME`` before its work and ``end JOB
ATTEMPT TIME`` after it (``stopped ...`` when SIGTERM ends it first), with O_APPEND writes far shorter than
PIPE_BUF, so concurrent jobs' lines never mix. ``read_journal`` turns the file into each job's runs, and ``check_runs`` asserts what a fault must
never break: every job ends exactly once, and no two attempts of one job overlap in time.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


def journaled_command(journal: Path, work_s: float) -> str:
    """A --wrap command that records its start and end in ``journal`` around ``sleep work_s``."""
    # bash's $EPOCHREALTIME rather than a `date` child, which a signal to the job's process group could kill
    # mid-line (leaving a line without its time).
    mark = 'mark() { echo "$1 $SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0} $EPOCHREALTIME" >> ' + str(journal) + "; }"
    body = f"{mark}; trap 'mark stopped; exit 143' TERM; mark start; sleep {work_s} & wait $!; mark end"
    return "exec /bin/bash -c " + shlex.quote(body)


@dataclass
class Run:
    attempt: int
    start: float
    end: float | None = None  # None: the run has not ended, or was killed without a SIGTERM
    completed: bool = False  # it reached its end (rather than being stopped by SIGTERM)


def read_journal(journal: Path) -> dict[int, list[Run]]:
    runs: dict[int, list[Run]] = defaultdict(list)
    for line in journal.read_text().splitlines():
        kind, job, attempt, when = line.split()
        if kind == "start":
            runs[int(job)].append(Run(int(attempt), float(when)))
        else:
            run = next(r for r in reversed(runs[int(job)]) if r.attempt == int(attempt) and r.end is None)
            run.end = float(when)
            run.completed = kind == "end"
    return dict(runs)


def check_runs(runs: dict[int, list[Run]], job_ids: set[int]) -> None:
    """Every job ran to its end exactly once; every run that did not was stopped with SIGTERM; no attempt
    started before the previous one had ended."""
    assert set(runs) == job_ids, f"jobs that never started: {sorted(job_ids - set(runs))[:20]}"
    completed = {job: len([r for r in job_runs if r.completed]) for job, job_runs in runs.items()}
    assert all(count == 1 for count in completed.values()), {j: c for j, c in completed.items() if c != 1}
    for job, job_runs in runs.items():
        ordered = sorted(job_runs, key=lambda r: r.start)
        for earlier, later in zip(ordered, ordered[1:], strict=False):
            assert earlier.end is not None and earlier.end <= later.start, f"job {job}: attempts overlap: {ordered}"
