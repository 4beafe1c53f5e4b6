"""Which running jobs to preempt so that a blocked high-priority job can start: a pure function.

``select_victims`` returns the smallest set of victims whose GPUs (and CPUs and host memory), added to
what is free, let the whole
job be placed (the same placement as any start, so the topology is valid), preferring among sets of that
size the one that loses the least work: each victim loses its GPUs times the time since its last
checkpoint (its attempt start when it never checkpointed).

- A job on one node: per node, every subset of the victims that touch it is tried in order of size, then
  of lost work (bounded: at most MAX_VICTIMS_PER_NODE victims per node are considered, the cheapest). The
  best node wins. Exact.
- A gang over several nodes: two searches, and the better answer wins (fewer victims, then less work
  lost). By job: victims are added cheapest first until the job fits. By node: nodes are cleared one
  after another, those that take the fewest victims first, until the job fits (cheap jobs spread over
  many nodes would otherwise win over a few big ones on the nodes the gang needs). Either way each victim
  is then dropped again, most expensive first, if the job still fits without it. The result is
  irreducible (no victim can be spared). Finding the global minimum is a set-cover problem, so it is
  searched for exactly only when few jobs could be victims (at most EXACT_SEARCH_POOL on the nodes the
  gang could use): every smaller set, smallest and cheapest first, within EXACT_SEARCH_PLACEMENTS trial
  placements. Beyond that the irreducible answer stands.

Carrying out a preemption (warning signal, grace, requeue) is the controller's job, not this module's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.framework import Candidate, Code, Request
from garrison.controller.sched.placement import Placer
from garrison.controller.sched.snapshot import RunningJob
from garrison.model.domain import Allocation

MAX_VICTIMS_PER_NODE = 10
# The exact search for a gang tries at most 2**EXACT_SEARCH_POOL sets, almost all rejected by counting GPUs,
# and at most EXACT_SEARCH_PLACEMENTS full placements, so that it stays a small part of a scheduling cycle.
EXACT_SEARCH_POOL = 10
EXACT_SEARCH_PLACEMENTS = 64


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: int
    attempt: int
    grace_s: int  # warning time before the job is stopped: preemption_grace(), decided here in the core


# How far a job's own --signal lead time may lengthen its QoS's preemption grace unless the admin says
# (scheduler setting preempt_max_grace): enough for the usual checkpoint-on-warning habits (Lightning's and
# submitit's USR1@90..120), far from the 18 hours --signal allows.
DEFAULT_MAX_GRACE_S = 300


def preemption_grace(qos_grace_s: int, warning_lead_s: int | None, max_grace_s: int) -> int:
    """The victim's warning time: its QoS's grace; a --signal lead time shorter than that shortens it (the job
    says it needs less), a longer one lengthens it only up to the admin's maximum (and never below the QoS's
    grace), so no user can make a job unpreemptable by asking for an 18-hour warning."""
    if warning_lead_s is None:
        return qos_grace_s
    if warning_lead_s <= qos_grace_s:
        return warning_lead_s
    return max(qos_grace_s, min(warning_lead_s, max_grace_s))


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
    answers = [
        _gang(request, capacity, placer, pool, freeing, useful, end_time),
        _gang_by_node(request, capacity, placer, pool, freeing, useful, end_time, now),
    ]
    best = min((a for a in answers if a is not None),
               key=lambda a: (len(a[0]), sum(lost_work(v, now) for v in a[0])), default=None)
    if best is not None and len(best[0]) > 1:
        best = _fewer_victims(request, capacity, placer, pool, freeing, useful, end_time, now, len(best[0])) or best
    return best


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
    # Most expensive (latest added) first.
    return _spare(request, capacity, placer, freeing, useful, end_time, chosen, chosen[::-1], allocation)


def _gang_by_node(
    request: Request, capacity: Capacity, placer: Placer, pool: Sequence[RunningJob],
    freeing: Sequence[RunningJob], useful: Sequence[int], end_time: float, now: float,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    on_node: dict[int, list[RunningJob]] = {i: [] for i in useful}
    for job in pool:  # cheapest first, as the pool is sorted
        for name in job.allocation.node_names:
            index = capacity.index_of.get(name)
            if index in on_node:
                on_node[index].append(job)
    order = sorted((i for i in useful if on_node[i]),
                   key=lambda i: (len(on_node[i]), sum(lost_work(j, now) for j in on_node[i]), i))
    chosen: list[RunningJob] = []
    taken: set[tuple[int, int]] = set()
    fit = _GpuCount(request, {i: len(capacity.free[i]) for i in useful})  # as if the chosen were gone
    for job in freeing:
        fit.free(job, capacity)
    allocation = None
    for index in order:
        for job in on_node[index]:
            if (job.job_id, job.attempt) not in taken:
                taken.add((job.job_id, job.attempt))
                chosen.append(job)
                fit.free(job, capacity)
        if fit.might_fit():
            allocation = _placement_with(request, capacity, placer, [*freeing, *chosen], end_time, nodes=useful)
            if allocation is not None:
                break
    if allocation is None:
        return None
    by_cost = sorted(chosen, key=lambda j: (-lost_work(j, now), j.job_id))
    return _spare(request, capacity, placer, freeing, useful, end_time, chosen, by_cost, allocation)


def _fewer_victims(
    request: Request, capacity: Capacity, placer: Placer, pool: Sequence[RunningJob],
    freeing: Sequence[RunningJob], useful: Sequence[int], end_time: float, now: float, found: int,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    """The fewest victims (then the least work lost) that let the gang start, if that is fewer than
    ``found`` and a small search can tell; None when the search is too large or finds nothing smaller."""
    names = {capacity.views[i].name for i in useful}
    candidates = [job for job in pool if names.intersection(job.allocation.node_names)]
    if len(candidates) > EXACT_SEARCH_POOL:
        return None
    base = _GpuCount(request, {i: len(capacity.free[i]) for i in useful})
    for job in freeing:
        base.free(job, capacity)
    placements = 0
    for size in range(1, found):
        for victims in sorted(combinations(candidates, size), key=lambda vs: sum(lost_work(v, now) for v in vs)):
            if not base.might_fit_without(victims, capacity):
                continue
            if placements == EXACT_SEARCH_PLACEMENTS:
                return None  # not searched to the end: a smaller set may exist, so claim nothing
            placements += 1
            allocation = _placement_with(request, capacity, placer, [*freeing, *victims], end_time, nodes=useful)
            if allocation is not None:
                return tuple(victims), allocation
    return None


class _GpuCount:
    """Free GPUs per node as victims are added, and Capacity.might_fit's test on them, kept up to date
    so that trying node after node costs no more than the nodes tried."""

    def __init__(self, request: Request, free: dict[int, int]) -> None:
        self.shape = request.shape
        self.per_node = self.shape.min_gpus_per_node
        self.gpus = free
        self.total = sum(free.values())
        self.big = sum(1 for c in free.values() if c >= self.per_node)

    def free(self, job: RunningJob, capacity: Capacity) -> None:
        for node_alloc in job.allocation.nodes:
            index = capacity.index_of.get(node_alloc.node)
            if index is None or index not in self.gpus:
                continue
            before = self.gpus[index]
            self.gpus[index] = before + len(node_alloc.gpus)
            self.total += len(node_alloc.gpus)
            if before < self.per_node <= self.gpus[index]:
                self.big += 1

    def might_fit(self) -> bool:
        if self.shape.node_count is None:
            return self.total >= self.shape.total_gpus
        return self.big >= self.shape.node_count

    def might_fit_without(self, victims: Sequence[RunningJob], capacity: Capacity) -> bool:
        """might_fit() as if ``victims`` were gone too, without changing the counts: a look at the nodes
        the victims touch, not at every node."""
        added: dict[int, int] = {}
        for job in victims:
            for node_alloc in job.allocation.nodes:
                index = capacity.index_of.get(node_alloc.node)
                if index is not None and index in self.gpus:
                    added[index] = added.get(index, 0) + len(node_alloc.gpus)
        if self.shape.node_count is None:
            return self.total + sum(added.values()) >= self.shape.total_gpus
        crossing = sum(1 for i, extra in added.items() if self.gpus[i] < self.per_node <= self.gpus[i] + extra)
        return self.big + crossing >= self.shape.node_count


def _spare(
    request: Request, capacity: Capacity, placer: Placer, freeing: Sequence[RunningJob], useful: Sequence[int],
    end_time: float, victims: Sequence[RunningJob], drop_order: Sequence[RunningJob], allocation: Allocation,
) -> tuple[tuple[RunningJob, ...], Allocation]:
    """Drop each victim, in ``drop_order``, whose GPUs the job turns out not to need."""
    chosen = list(victims)
    for job in drop_order:
        trial = [j for j in chosen if j is not job]
        smaller = _placement_with(request, capacity, placer, [*freeing, *trial], end_time, nodes=useful)
        if smaller is not None:
            chosen, allocation = trial, smaller
    return tuple(chosen), allocation
