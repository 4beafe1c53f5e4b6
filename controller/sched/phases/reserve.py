"""Reserve (backfill): while reservations remain, the earliest time and GPUs the job could have
(backfill.py); without backfill the first blocked job holds back its whole partition (strict FIFO). A
blocked job past the reservations is told whether a reservation is in its way or plain priority."""

from __future__ import annotations

from collections.abc import Iterator

from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.placement import Placer
from garrison.controller.sched.plan import Reason, Reservation

OVERDUE_WINDOW_S = 365 * 86400.0


def reserve_later(state: CycleState, c: Candidacy) -> bool:
    config, job = state.config, c.job
    if not config.backfill:
        state.waiting[job.job_id] = Reason.RESOURCES
        state.blocked_partitions.update((job.partition, *job.other_partitions))
        return True
    overdue = state.overdue_after is not None and state.now - job.submit_time > state.overdue_after
    # With reserve_every_overdue, ``reservations`` counts only the jobs that are not overdue: EASY's one
    # reservation (say) for the queue's order, and one for every overdue job on top of it.
    extra = overdue and config.reserve_every_overdue
    if extra or len(state.reservations) - state.overdue_reservations < config.reservations:
        timeline = state.ensure_timeline()
        window = config.window_s
        if overdue:
            # The window bounds the work of reserving for the many; an overdue job (one of the longest
            # waiters) gets its reservation however far away its start is, or backfill could push it back
            # for ever. The sweep stays bounded by its placement attempts.
            window = max(window, OVERDUE_WINDOW_S)
        found = timeline.earliest_start(c.request, state.placer, config.resolution_s, window)
        if found is not None:
            begin, reserved = found
            state.reservations.append(Reservation(job.job_id, begin, begin + c.limit, reserved))
            state.capacity.reserve(reserved, begin, job.job_id, timeline.memory_room(reserved, begin))
            timeline.hold(reserved, begin + c.limit)
            state.estimated[job.job_id] = begin
            if extra:
                state.overdue_reservations += 1
        state.waiting[job.job_id] = Reason.RESOURCES
        return True
    memo = state.memo
    memo.sync()
    blocked = memo.blocked.get(c.key)
    if blocked is None:
        blocked = _blocked_reason(c.request, state.capacity, state.placer, state.reservations)
        memo.blocked[c.key] = blocked
    state.waiting[job.job_id] = blocked[0]
    if blocked[1] is not None:
        state.blocked_by[job.job_id] = blocked[1]
    return True


def _blocked_reason(request: Request, capacity: Capacity, placer: Placer,
                    reservations: list[Reservation]) -> tuple[str, int | None]:
    """A blocked job with no reservation of its own: is it a reservation in its way (and whose), or plain
    priority?"""
    if not reservations or not capacity.might_fit(request):
        return Reason.PRIORITY, None

    def ignoring_reservations(r: Request) -> Iterator[Candidate]:
        return capacity.stream(r, float("-inf"))  # an end before every reservation: reserved GPUs usable

    ignoring = placer.place(request, ignoring_reservations)
    if ignoring is None:
        return Reason.PRIORITY, None
    holder = capacity.reservation_on(ignoring)
    return (Reason.reserved_for(holder[1]), holder[1]) if holder is not None else (Reason.PRIORITY, None)
