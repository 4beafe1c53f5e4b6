"""Figures of merit of a replay: completion times, queueing delays, utilisation, fairness, preemption cost.

Definitions (docs/gsim.md repeats them for users):

- JCT (job completion time) = end - submission; queueing delay (wait) = first start - submission.
- Makespan = last end - first submission. Utilisation = busy GPU-seconds / (cluster GPUs x makespan).
- Idle GPU-hours while jobs waited: free GPUs x time, over the intervals when some job was pending; "fitting"
  counts only the intervals when some pending job asked for no more GPUs than were free (it waited for a
  reservation, behind a strict queue, or for a placement), the rest are intervals when every waiting job
  was bigger than the free GPUs.
- Jain's fairness index across accounts under contention: whenever some job waits, each account with
  work (running or pending GPUs) is entitled to its max-min fair share of the cluster's GPUs (equal
  weights, water-filling over the accounts' demands); x_a = GPU-seconds account a actually held during
  those intervals / GPU-seconds it was entitled to, and the index is (sum x)^2 / (n sum x^2): 1.0 when every
  account received its share in proportion, 1/n when one account took everything.
- Estimated-start accuracy: for the jobs that waited (and, for the second figure, waited an hour or more), the
  median and p90 of |first start - estimate|, where the estimate is the cycle's estimated start (what
  gqueue --start shows) from the first cycle after the job's submission, and the last one given an hour or
  more before it started; coverage is the share of those jobs that had such an estimate (a job deep in the
  queue gets none: only the top blocked jobs have reservations).
- Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of already sorted values, linear interpolation; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def max_min_shares(demands: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Water-filling: each account gets min(demand, level), the level chosen so the shares fill capacity."""
    if sum(demands.values()) <= capacity:
        return dict(demands)
    shares: dict[str, float] = {}
    remaining = capacity
    ordered = sorted(demands.items(), key=lambda item: item[1])
    for position, (account, demand) in enumerate(ordered):
        level = remaining / (len(ordered) - position)
        share = min(demand, level)
        shares[account] = share
        remaining -= share
    return shares


def jain_index(values: Sequence[float]) -> float:
    """(sum x)^2 / (n sum x^2); 1.0 for no values or all zero (nothing to be unfair about)."""
    total_sq = sum(v * v for v in values)
    if not values or total_sq == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * total_sq)


@dataclass
class ContentionTracker:
    """Integrates, over the intervals when some job waits, what each account held and was entitled to."""

    capacity: int
    demand: dict[str, int] = field(default_factory=dict)  # GPUs of pending + running jobs, per account
    held: dict[str, int] = field(default_factory=dict)  # GPUs of running jobs, per account
    waiting: int = 0  # pending jobs
    received_gpu_s: dict[str, float] = field(default_factory=dict)
    entitled_gpu_s: dict[str, float] = field(default_factory=dict)
    contention_s: float = 0.0
    _last: float | None = None

    def advance(self, now: float) -> None:
        """Account for the interval since the last call, with the state as it was during it."""
        if self._last is not None and now > self._last and self.waiting > 0:
            span = now - self._last
            self.contention_s += span
            active = {a: d for a, d in self.demand.items() if d > 0}
            for account, share in max_min_shares(active, self.capacity).items():
                self.entitled_gpu_s[account] = self.entitled_gpu_s.get(account, 0.0) + share * span
                self.received_gpu_s[account] = self.received_gpu_s.get(account, 0.0) + self.held.get(account, 0) * span
        self._last = now

    def change(self, account: str, demand: int = 0, held: int = 0, waiting: int = 0) -> None:
        self.demand[account] = self.demand.get(account, 0) + demand
        self.held[account] = self.held.get(account, 0) + held
        self.waiting += waiting

    def fairness(self) -> float:
        ratios = [
            self.received_gpu_s.get(account, 0.0) / entitled
            for account, entitled in sorted(self.entitled_gpu_s.items())
            if entitled > 0
        ]
        return jain_index(ratios)

    def share_ratios(self) -> dict[str, float]:
        return {
            account: self.received_gpu_s.get(account, 0.0) / entitled
            for account, entitled in sorted(self.entitled_gpu_s.items())
            if entitled > 0
        }


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job_id: int
    trace_id: str
    account: str
    gpus: int
    submit: float
    first_start: float | None
    end: float | None
    preemptions: int
    timed_out: bool
    # The scheduler's estimated start (Plan.estimated_starts, what gqueue --start shows) from the first cycle
    # at or after its submission, and the last one given an hour or more before it started; None: none given.
    estimate_at_submit: float | None = None
    estimate_hour_before: float | None = None

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.submit

    @property
    def wait(self) -> float | None:
        return None if self.first_start is None else self.first_start - self.submit


@dataclass
class ReplayResult:
    """Everything a replay produced: per-job outcomes, the time series for plots, and counters."""

    policy: str
    total_gpus: int
    jobs: list[JobOutcome]
    start_order: list[int]  # job ids in the order they (first) started, for comparisons with the daemon
    times: list[float]  # event times; queue/busy hold from times[i] until times[i + 1]
    queue_length: list[int]
    busy_gpus: list[int]
    busy_gpu_s: float
    fairness: float
    account_share_ratios: dict[str, float]
    preemptions: int
    gpu_hours_lost: float
    cycles: int
    rejected_starts: int = 0  # starts the controller's re-check would refuse (an inconsistent plan)
    idle_waiting_gpu_s: float = 0.0  # GPU-seconds free while some job waited
    idle_fitting_gpu_s: float = 0.0  # ... of which some waiting job asked for no more GPUs than were free
    wall_s: float = 0.0


ESTIMATE_LEAD_S = 3600.0  # "an hour before its start"


def estimate_errors(jobs: Sequence[JobOutcome], which: str) -> tuple[list[float], int]:
    """Sorted |real first start - estimate| of the jobs that waited (started after their submission) and had
    an estimate (``which``: "submit" or "hour"), and how many jobs could have had one."""
    errors: list[float] = []
    eligible = 0
    for job in jobs:
        if job.first_start is None or job.first_start <= job.submit:
            continue  # never started, or started at once: an estimate of "now" is right by construction
        if which == "hour" and job.first_start - job.submit < ESTIMATE_LEAD_S:
            continue  # it did not wait an hour: there was no "hour before"
        eligible += 1
        estimate = job.estimate_at_submit if which == "submit" else job.estimate_hour_before
        if estimate is not None:
            errors.append(abs(job.first_start - estimate))
    return sorted(errors), eligible


def summarize(result: ReplayResult) -> dict[str, float | int | str]:
    """The figures of one replay, with the keys of ``gsim --json``."""
    done = [j for j in result.jobs if j.end is not None]
    jcts = sorted(j.jct for j in done if j.jct is not None)
    waits = sorted(j.wait for j in result.jobs if j.wait is not None)
    first_submit = min((j.submit for j in result.jobs), default=0.0)
    last_end = max((j.end for j in done if j.end is not None), default=first_submit)
    makespan = last_end - first_submit
    capacity = result.total_gpus * makespan
    at_submit, submit_eligible = estimate_errors(result.jobs, "submit")
    hour_before, hour_eligible = estimate_errors(result.jobs, "hour")
    return {
        "policy": result.policy,
        "jobs": len(result.jobs),
        "completed": len(done),
        "unfinished": len(result.jobs) - len(done),
        "avg_jct_s": sum(jcts) / len(jcts) if jcts else 0.0,
        "p50_jct_s": percentile(jcts, 50),
        "p95_jct_s": percentile(jcts, 95),
        "p99_jct_s": percentile(jcts, 99),
        "avg_wait_s": sum(waits) / len(waits) if waits else 0.0,
        "p50_wait_s": percentile(waits, 50),
        "p95_wait_s": percentile(waits, 95),
        "p99_wait_s": percentile(waits, 99),
        "max_wait_s": waits[-1] if waits else 0.0,
        "makespan_s": makespan,
        "utilization": result.busy_gpu_s / capacity if capacity > 0 else 0.0,
        "idle_gpu_hours_waiting": result.idle_waiting_gpu_s / 3600.0,
        "idle_gpu_hours_fitting": result.idle_fitting_gpu_s / 3600.0,
        "jain_fairness": result.fairness,
        "preemptions": result.preemptions,
        "gpu_hours_lost": result.gpu_hours_lost,
        "timeouts": sum(1 for j in result.jobs if j.timed_out),
        "estimate_submit_p50_error_s": percentile(at_submit, 50),
        "estimate_submit_p90_error_s": percentile(at_submit, 90),
        "estimate_submit_coverage": len(at_submit) / submit_eligible if submit_eligible else 0.0,
        "estimate_hour_p50_error_s": percentile(hour_before, 50),
        "estimate_hour_p90_error_s": percentile(hour_before, 90),
        "estimate_hour_coverage": len(hour_before) / hour_eligible if hour_eligible else 0.0,
        "cycles": result.cycles,
        "rejected_starts": result.rejected_starts,
        "wall_s": result.wall_s,
    }
