"""Attained service (Tiresias' discretised two-queue LAS): how much GPU time a job has had, and which queue that
puts it in. Pure functions of a job's earlier attempts, the moment and the weights.

A job's attained service is the GPU-seconds its attempts held GPUs (GPUs x wall time), counted from its
latest *promotion*: Tiresias' starvation guard sends a job that waited longer than ``starvation`` times its
last attempt's run back to the high queue with its count reset. Whether an attempt began with a promotion is
read from the history itself (the wait before it against the run before that wait), so the core needs no
state: the snapshot gives each job its earlier attempts as ``(start, end, gpus)``.

- high queue: attained service below ``threshold_gpu_s``, or starving now (waited longer than
  ``starvation`` times its last run since that run ended). A job never started is in it (attained 0);
- low queue: the others. A running attempt's service grows as it runs, so a running job drops into the low
  queue once it has had the threshold; with the preemption rule on (SchedulerConfig.preempt_attained), a
  blocked high-queue job may preempt running low-queue jobs (phases/preempt.py).

Without preemption the factor only moves jobs that ran before (requeued, or preempted by QoS).
"""

from __future__ import annotations

# (start, end, GPUs) of each earlier attempt of a job, oldest first.
Service = tuple[tuple[float, float, int], ...]


def attained_gpu_s(service: Service, starvation: float, running_since: float | None = None, running_gpus: int = 0, now: float = 0.0) -> float:
    """GPU-seconds attained since the job's latest promotion, with the running attempt's share up to ``now``
    when it runs (``running_since``: that attempt's start)."""
    attained = 0.0
    waited_from = 0.0  # (the first attempt is never a promotion: no run before it)
    last_run = 0.0
    for start, end, gpus in service:
        if starvation and last_run > 0 and start - waited_from > starvation * last_run:
            attained = 0.0  # it started as a promoted job: its count began again then
        run = max(0.0, end - start)
        attained += gpus * run
        last_run, waited_from = run, end
    if running_since is not None:
        if starvation and last_run > 0 and running_since - waited_from > starvation * last_run:
            attained = 0.0
        attained += running_gpus * max(0.0, now - running_since)
    return attained


def starving(service: Service, starvation: float, now: float) -> bool:
    """Pending longer than ``starvation`` times its last run since that run ended (never for a job that has
    not run, nor with no guard)."""
    if not starvation or not service:
        return False
    start, end, _ = service[-1]
    run = max(0.0, end - start)
    return run > 0 and now - end > starvation * run


def in_high_queue(service: Service, threshold_gpu_s: float, starvation: float, now: float) -> bool:
    """Whether a pending job is in the high queue as of ``now``."""
    if not service:
        return True
    return (starving(service, starvation, now)
            or attained_gpu_s(service, starvation) < threshold_gpu_s)
