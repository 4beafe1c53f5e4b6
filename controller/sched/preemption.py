"""Which running jobs to preempt so that a blocked high-priority job can start: a pure function.

``select_victims`` returns the smallest set of victims whose GPUs (and CPUs and host memory), added to
what is free, let the whole
job be placed (the same placement as any start, so the topology is valid), preferring among sets of that
size the one that loses the least work: each victim loses its GPUs times the time since its last
checkpoint (its attempt start when it never checkpointed).

- A job on one node: per node, every subset of the victims that touch it is tried in order of size, then
  of lost work (bounded: at most MAX_VICTIMS_PER_NODE victims per node are considered, the cheapest). The
  best node wins. Exact.
- A gang over several nodes: victims are added cheapest first until the job fits, then each is dropped
  again (most expensive first) if the job still fits without it. The result is irreducible (no victim can
  be spared), not necessarily the global minimum, which is a set-cover problem.

Carrying out a preemption (warning signal, grace, requeue) is the controller's job, not this module's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from garrison.controller.domain import Allocation
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.framework import Candidate, Code, Request
from garrison.controller.sched.placement import Placer
from garrison.controller.sched.snapshot import RunningJob

MAX_VICTIMS_PER_NODE = 10


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: int
    attempt: int
    grace_s: int  # warning time before the job is stopped (the victim QoS's grace)


def lost_work(job: RunningJob, now: float) -> float:
    """GPU-seconds of work the victim loses: its GPUs times the time since its last checkpoint."""
    saved_at = job.checkpoint_time if job.checkpoint_time is not None else job.start_time
    return job.gpu_count() * max(0.0, now - saved_at)


@dataclass(slots=True)
class _Freed:
    """What the victims on one node give back: GPUs, CPUs, and memory (MB, with when each would have come
    free anyway, so a reservation's room on the node grows only by memory it had counted as held)."""

    gpus: set[int]
    cpus: set[int]
    memory: list[tuple[float, int]]


def _freed_by(victims: Sequence[RunningJob], capacity: Capacity) -> dict[int, _Freed]:
    freed: dict[int, _Freed] = {}
    for job in victims:
        for node_alloc in job.allocation.nodes:
            index = capacity.index_of.get(node_alloc.node)
            if index is not None:
                here = freed.setdefault(index, _Freed(set(), set(), []))
                here.gpus.update(node_alloc.gpus)
                here.cpus.update(node_alloc.cpus)
                if node_alloc.mem_mb:
                    here.memory.append((job.expected_end, node_alloc.mem_mb))
    return freed


def _placement_with(
    request: Request, capacity: Capacity, placer: Placer, victims: Sequence[RunningJob], end_time: float,
    nodes: Sequence[int] | None = None,
) -> Allocation | None:
    freed = _freed_by(victims, capacity)
    indices = nodes if nodes is not None else range(len(capacity.views))

    def source(r: Request) -> list[Candidate]:
        out = []
        for index in indices:
            base = capacity.candidate(r, index, end_time)
            extra = freed.get(index)
            if extra:
                match = capacity.matching(index, r.gpu_type, r.gpu_mem_mib)
                base.usable = sorted(set(base.usable) | (extra.gpus & match))
                base.free_cpus = base.free_cpus | extra.cpus
                base.free_memory_mb = capacity.memory_after_freeing(index, end_time, extra.memory)
            out.append(base)
        return sorted(out, key=lambda c: (len(c.usable), c.index))

    return placer.place(request, source)


def memory_room_after(victims: Sequence[RunningJob], capacity: Capacity, allocation: Allocation) -> dict[str, int]:
    """For the job the victims make room for: per node where it asks for memory, what is left beside it
    once they are gone (Capacity.reserve's ``memory_room``)."""
    freed = _freed_by(victims, capacity)
    room: dict[str, int] = {}
    for node_alloc in allocation.nodes:
        if node_alloc.mem_mb:
            index = capacity.index_of[node_alloc.node]
            given_back = sum(mb for _, mb in freed[index].memory) if index in freed else 0
            room[node_alloc.node] = capacity.free_memory[index] + given_back - node_alloc.mem_mb
    return room


def select_victims(
    request: Request,
    capacity: Capacity,
    placer: Placer,
    running: Sequence[RunningJob],
    may_preempt: Callable[[RunningJob], bool],
    now: float,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    """The victims to preempt and where the job would then run; None if no set of allowed victims helps.

    Jobs already being stopped (``stopping``) count as freed, never as victims: if they alone make room,
    the answer is no new victim at all, so a preemption in flight does not trigger another every cycle
    until it lands.
    """
    end_time = now + request.duration_s
    freeing = [j for j in running if j.stopping]
    if freeing:
        allocation = _placement_with(request, capacity, placer, freeing, end_time)
        if allocation is not None:
            return (), allocation
    pool = sorted(
        (j for j in running if not j.stopping and may_preempt(j)),
        key=lambda j: (lost_work(j, now), -j.gpu_count(), j.job_id),
    )
    if not pool:
        return None
    # Nodes that could never hold the job (wrong partition, drained, too small) cannot be helped.
    useful = [
        i for i in range(len(capacity.views))
        if placer.pipeline.check(request, capacity.candidate(request, i, end_time)).code != Code.UNRESOLVABLE
    ]
    if not useful:
        return None
    if request.shape.node_count == 1 or (
        request.shape.node_count is None and request.shape.total_gpus <= capacity.max_gpus
    ):
        found = _single_node(request, capacity, placer, pool, freeing, useful, end_time, now)
        if found is not None or request.shape.node_count == 1:
            return found
    return _gang(request, capacity, placer, pool, freeing, useful, end_time)


def _single_node(
    request: Request, capacity: Capacity, placer: Placer, pool: Sequence[RunningJob],
    freeing: Sequence[RunningJob], useful: Sequence[int], end_time: float, now: float,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    best: tuple[tuple[int, float, int], tuple[RunningJob, ...], Allocation] | None = None
    for index in useful:
        name = capacity.views[index].name
        here = [j for j in pool if name in j.allocation.node_names][:MAX_VICTIMS_PER_NODE]
        for size in range(1, len(here) + 1):
            if best is not None and size > best[0][0]:
                break
            options = sorted(combinations(here, size), key=lambda vs: sum(lost_work(v, now) for v in vs))
            for victims in options:
                cost = (size, sum(lost_work(v, now) for v in victims), index)
                if best is not None and cost >= best[0]:
                    break
                allocation = _placement_with(request, capacity, placer, [*freeing, *victims], end_time,
                                             nodes=[index])
                if allocation is not None:
                    best = (cost, tuple(victims), allocation)
                    break
            if best is not None and best[0][2] == index:
                break
    return (best[1], best[2]) if best is not None else None


def _gang(
    request: Request, capacity: Capacity, placer: Placer, pool: Sequence[RunningJob],
    freeing: Sequence[RunningJob], useful: Sequence[int], end_time: float,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    names = {capacity.views[i].name for i in useful}
    chosen: list[RunningJob] = []
    allocation = None
    for job in pool:
        if not names.intersection(job.allocation.node_names):
            continue
        chosen.append(job)
        allocation = _placement_with(request, capacity, placer, [*freeing, *chosen], end_time, nodes=useful)
        if allocation is not None:
            break
    if allocation is None:
        return None
    for job in sorted(chosen, key=lambda j: -chosen.index(j)):  # most expensive (latest added) first
        trial = [j for j in chosen if j is not job]
        smaller = _placement_with(request, capacity, placer, [*freeing, *trial], end_time, nodes=useful)
        if smaller is not None:
            chosen, allocation = trial, smaller
    return tuple(chosen), allocation
