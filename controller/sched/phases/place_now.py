"""Placement (Filter + Score + Bind): start the job now if its whole gang fits, never on GPUs reserved for
a higher-priority job unless it ends before that reservation starts (the backfill rule)."""

from __future__ import annotations

from collections.abc import Iterator

from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.plan import Start


def place_now(state: CycleState, c: Candidacy) -> bool:
    capacity, memo = state.capacity, state.memo
    allocation = None
    if capacity.might_fit(c.request) and not memo.known_not_to_fit(c.key, c.end):
        end = c.end

        def stream(request: Request, capacity: Capacity = capacity) -> Iterator[Candidate]:
            return capacity.stream(request, end)

        allocation = state.placer.place(c.request, stream)
        if allocation is None:
            memo.did_not_fit(c.key, c.end)
    if allocation is None:
        state.failed += 1
        return False
    job = c.job
    # A job that names several partitions starts in one of them (phases/place_elsewhere.py): say which.
    state.starts.append(Start(job.job_id, allocation, c.request.partition if job.other_partitions else None))
    state.estimated[job.job_id] = state.now
    capacity.take(allocation, c.end, exclusive=c.request.exclusive)
    state.quotas.started(job, job.spec.total_gpus(), c.limit)
    if job.array_job_id is not None:
        state.array_running[job.array_job_id] += 1
    if job.dependencies is not None and job.dependencies.singleton_key is not None:
        state.singletons_started.add(job.dependencies.singleton_key)
    state.hold_on_timeline(allocation, c.end, started=True)
    return True
