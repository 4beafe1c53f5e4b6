"""Waiting for a job to end (gsub --wait, gjob --wait), as sbatch --wait does: the status on one live line
while stderr is a terminal, and through a controller restart (an unreachable controller is asked again
until the deadline, not given up on).

The exit status follows sbatch --wait: the job's exit code, for an array the highest of its tasks'; a job
that ended without one (cancelled before it ran, lost with its node) exits 1.
"""

from __future__ import annotations

import sys
import time

from garrison.cli.client import Client, CliError
from garrison.cli.render import format_duration

TYPE_CHECKING = False  # not typing's: importing typing costs a CLI call ~5 ms
if TYPE_CHECKING:
    from typing import Any, TextIO

TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 0.5


def status_line(job_ref: str, jobs: list[Any]) -> str:
    """``job 12: RUNNING 0:42 on node1`` / ``job 12: PENDING (Resources) 0:00`` / for an array, the count of
    its tasks in each state."""
    if not jobs:
        return f"job {job_ref}: not known yet"
    if len(jobs) == 1:
        job = jobs[0]
        reason = f" ({job.reason})" if job.state == "PENDING" and job.reason else ""
        run = job.end_time or job.now
        elapsed = format_duration(run - job.start_time) if job.start_time else "0:00"
        where = f" on {','.join(job.node_list)}" if job.node_list and job.state not in ("PENDING",) else ""
        return f"job {job_ref}: {job.state}{reason} {elapsed}{where}"
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    return f"job {job_ref}: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def exit_status(jobs: list[Any]) -> int:
    """sbatch --wait's exit status for these ended jobs."""
    # A job whose script died of a signal (exit code -N) makes sbatch --wait exit 1, as Slurm 22.05's does.
    codes = [(job.exit_code if job.exit_code >= 0 else 1) if job.HasField("exit_code")
             else (0 if job.state == "COMPLETED" else 1) for job in jobs]
    highest = max(codes, default=1)
    if highest == 0 and any(job.state != "COMPLETED" for job in jobs):
        return 1  # cancelled or timed out with a code of 0 still did not complete
    return min(max(highest, 0), 255)


def wait_for_job(job_ref: str, *, timeout_s: float | None = None, stream: TextIO | None = None) -> list[Any]:
    """Poll the controller until every task of ``job_ref`` has ended; return their final records.

    A live status line goes to ``stream`` (stderr by default) only when it is a terminal. Raises CliError
    when the job is unknown, on a non-transient error, or at the deadline."""
    stream = sys.stderr if stream is None else stream
    live = stream.isatty()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    delay = FIRST_DELAY_S
    shown = ""
    seen_once = False
    try:
        while True:
            try:
                with Client() as client:
                    jobs = list(client.call_plain("ListJobs", {"job_ids": [job_ref]}).jobs)
                line = status_line(job_ref, jobs)
            except CliError as err:
                if not err.retryable:
                    raise
                jobs, line = [], f"job {job_ref}: {err} (retrying)"
            else:
                if not jobs and seen_once:
                    raise CliError(f"job {job_ref} is no longer known to the controller")
                if not jobs:
                    raise CliError(f"no such job {job_ref}")
                seen_once = True
                if all(job.state in TERMINAL_STATES for job in jobs):
                    if live:
                        stream.write("\r" + line + "\x1b[K\n")
                        stream.flush()
                    return jobs
            if live and line != shown:
                stream.write("\r" + line + "\x1b[K")
                stream.flush()
                shown = line
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"job {job_ref} has not ended after {timeout_s:g}s")
            time.sleep(delay)  # polling the controller for the job's state, bounded by the deadline
            delay = min(delay * 1.5, MAX_DELAY_S)
    except BaseException:
        if live and shown:
            stream.write("\n")
        raise
