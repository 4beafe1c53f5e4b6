"""Reservations: when could a blocked job start, and which GPUs will it take then?

The timeline knows when each busy GPU comes free: a running job's GPUs at its start plus its time limit
(limits are enforced, so that is the latest they can be busy), a job started in this cycle's GPUs at now
plus its limit. A reservation found here holds its GPUs from its start to its end, and later reservations
treat them as busy until that end (conservative: they never slip in before an earlier reservation). GPUs
busy for a reason the snapshot does not explain (a job the snapshot does not list) never come free.

``earliest_start`` sweeps the release events in time order, rounded up to the resolution, and at each step
first asks a cheap necessary question (enough nodes with enough GPUs free by then) before running the real
placement, which is bounded in attempts; the sweep stops at the window's end. These are Slurm's
bf_resolution, bf_window and (for the number of jobs tested, in cycle.py) bf_max_job_test, as named and
validated settings rather than file-level globals.

CPUs and host memory are tracked the same way: a running job's CPUs and memory come free at its end, a
reservation's are held until its end, and the sweep also stops where only CPUs or memory come free (a
CPU-only job ending). Memory is a quantity: a node's memory at a time is its total less the holds still
running then (and less what the snapshot cannot explain, held for good).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from garrison.controller.sched.capacity import INFINITY, Capacity
from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.placement import BestFit, Placer
from garrison.controller.sched.snapshot import RunningJob
from garrison.model.domain import Allocation, NodeAllocation

# Real placements tried per reservation once the cheap test passes (each costs a scan of the partition).
MAX_PLACEMENT_ATTEMPTS = 24


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: int
    start: float
    end: float
    allocation: Allocation


class _NodeHost:
    """One node's CPUs and host memory over time for the timeline. Jobs' holds are only recorded until a
    reservation first asks about the node, and applied then: most nodes are never asked about, and
    building every node's CPU table up front cost more than the rest of the timeline (1,000 nodes of 128
    CPUs)."""

    __slots__ = ("cpus", "memory_mb", "free_cpus_now", "free_memory_now", "now", "ops", "cpu_free_at",
                 "memory_holds", "memory_unexplained")

    def __init__(self, cpus: int, memory_mb: int, free_cpus: frozenset[int], free_memory_mb: int, now: float) -> None:
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.free_cpus_now = free_cpus
        self.free_memory_now = free_memory_mb
        self.now = now
        self.ops: list[tuple[bool, tuple[int, ...], int, float]] | None = []  # None once applied
        self.cpu_free_at: dict[int, float] = {}  # busy CPU -> when it comes free (INFINITY: unknown)
        self.memory_holds: list[tuple[float, int]] = []  # (until, MB)
        self.memory_unexplained = 0  # MB busy for a reason the snapshot does not give: held for good

    def explain(self, cpus: tuple[int, ...], mem_mb: int, until: float) -> None:
        """CPUs and memory counted busy with no known end belong to a job that ends at ``until``."""
        self._record(False, cpus, mem_mb, until)

    def hold(self, cpus: tuple[int, ...], mem_mb: int, until: float) -> None:
        """These CPUs and this memory are busy until ``until`` at least (a start now, or a reservation)."""
        self._record(True, cpus, mem_mb, until)

    def _record(self, hold: bool, cpus: tuple[int, ...], mem_mb: int, until: float) -> None:
        if not cpus and not mem_mb:
            return
        if self.ops is not None:
            self.ops.append((hold, cpus, mem_mb, until))
        else:
            self._apply(hold, cpus, mem_mb, until)

    def _build(self) -> None:
        if self.ops is None:
            return
        ops, self.ops = self.ops, None
        free = self.free_cpus_now
        if len(free) < self.cpus:
            self.cpu_free_at = {c: INFINITY for c in range(self.cpus) if c not in free}
        self.memory_unexplained = max(0, self.memory_mb - self.free_memory_now)
        for op in ops:
            self._apply(*op)

    def _apply(self, hold: bool, cpus: tuple[int, ...], mem_mb: int, until: float) -> None:
        busy = self.cpu_free_at
        if hold:
            for cpu in cpus:
                busy[cpu] = max(busy.get(cpu, self.now), until)
            if mem_mb:
                self.memory_holds.append((until, mem_mb))
            return
        for cpu in cpus:
            if busy.get(cpu) == INFINITY:
                busy[cpu] = until
        explained = min(mem_mb, self.memory_unexplained)
        if explained:
            self.memory_unexplained -= explained
            self.memory_holds.append((until, explained))

    def cpus_at(self, when: float) -> frozenset[int] | None:
        """CPUs free from ``when`` on; None: every CPU of the node."""
        self._build()
        busy = self.cpu_free_at
        if not busy:
            return None
        return frozenset(c for c in range(self.cpus) if busy.get(c, self.now) <= when)

    def memory_at(self, when: float) -> int:
        self._build()
        held = self.memory_unexplained + sum(mb for until, mb in self.memory_holds if until > when)
        return max(0, self.memory_mb - held)


class _RunningHolds:
    """What the running jobs of a snapshot hold, per node: each busy GPU's end, and the release events in
    time order. Kept from one cycle to the next (a module-level memo, like cycle.py's requests) and updated
    by the jobs that started and ended since, found by object identity: snapshots are built incrementally,
    so a job's view is the same object from one snapshot to the next until it changes, and most events
    change one job of hundreds. Building this from every running job was a quarter of a replay's cycle.

    A stopping job's GPUs count as free from now on: its end is recorded as -inf, which every question of
    the timeline (all asked at or after ``now``) answers as it would ``now``; for the same reason a job past
    its expected end needs no clamping to ``now``. Only the plain case is kept: jobs holding CPUs or memory
    (``host_jobs``) or two jobs claiming one GPU make the timeline fall back to its full build.
    """

    __slots__ = ("running", "names", "by_id", "ids", "until", "events", "host_jobs", "conflict", "derived")

    def __init__(self) -> None:
        self.running: tuple[RunningJob, ...] | None = None  # the snapshot's tuple this describes (never a list,
        # which could change in place and still be the same object)
        self.names: tuple[str, ...] = ()  # node order the indices refer to
        self.by_id: dict[int, RunningJob] = {}  # id(view) -> view: keeps the views alive, so ids stay unique
        self.ids: list[int] = []  # id() of each view of the snapshot described, in its order
        self.until: list[dict[int, float]] = []  # node index -> GPU -> when it comes free
        self.events: list[tuple[float, int, tuple[int, ...]]] = []  # (end, node index, GPUs), one per job and node
        self.host_jobs = 0  # running jobs that hold CPUs or host memory
        self.conflict = False  # two jobs claimed one GPU: the full build decides, as it always did
        # node index -> what Timeline._from_holds derived for it from the holds and the node's free GPUs:
        # (free GPUs, GPU count, free_at dict); None once a job that started or ended there changed the
        # holds. Most nodes change in no cycle, and the free GPUs are the same object until they change
        # (capacity._NodeIndex), so the derivation is one identity test per node, not set arithmetic.
        self.derived: list[tuple[frozenset[int], int, dict[int, float]] | None] = []

    def sync(self, running: Sequence[RunningJob], names: tuple[str, ...], index_of: dict[str, int]) -> None:
        if running is self.running and names == self.names:
            return
        ids = list(map(id, running))
        if ids == self.ids and names == self.names and not self.conflict:
            # The same views in the same order (another tuple of them: a cycle on an arrival, when nothing
            # started or ended): nothing to update. A list compare in C, where the set and the two
            # differences below cost several times as much for hundreds of running jobs.
            self.running = running if isinstance(running, tuple) else None
            return
        fresh = set(ids)
        by_id = self.by_id
        if names != self.names or self.conflict or len(by_id) > 2 * len(fresh) + 64:
            self.names, self.by_id, self.host_jobs, self.conflict = names, {}, 0, False
            self.until = [{} for _ in names]
            self.derived = [None] * len(names)
            self.events = []
            by_id = self.by_id
        # by_id is kept up to date job by job rather than rebuilt: the two differences are in C, and the jobs
        # that came are found from the end of the snapshot's order (where a start appends them), usually
        # after a step or two.
        gone = by_id.keys() - fresh
        came = fresh - by_id.keys()
        for key in gone:
            self._drop(by_id.pop(key), index_of)
        if came:
            for job in reversed(running):
                key = id(job)
                if key in came and key not in by_id:
                    by_id[key] = job
                    self._add(job, index_of)
                    if len(came) == 1:
                        break
                    came.discard(key)
        self.ids = ids
        self.running = running if isinstance(running, tuple) else None

    @staticmethod
    def _end_of(job: RunningJob) -> float:
        return -INFINITY if job.stopping else job.expected_end

    @staticmethod
    def _on_indexed_nodes(job: RunningJob, index_of: dict[str, int]) -> Iterator[tuple[int, NodeAllocation]]:
        """The job's node allocations on nodes of the index, with each node's index: what _add records and
        _drop takes back."""
        for node_alloc in job.allocation.nodes:
            index = index_of.get(node_alloc.node)
            if index is not None:
                yield index, node_alloc

    def _add(self, job: RunningJob, index_of: dict[str, int]) -> None:
        end = self._end_of(job)
        host = False
        for index, node_alloc in self._on_indexed_nodes(job, index_of):
            self.derived[index] = None
            held = self.until[index]
            for gpu in node_alloc.gpus:
                if gpu in held:
                    self.conflict = True
                held[gpu] = end
            bisect.insort(self.events, (end, index, tuple(sorted(node_alloc.gpus))))
            host = host or bool(node_alloc.cpus or node_alloc.mem_mb)
        self.host_jobs += host

    def _drop(self, job: RunningJob, index_of: dict[str, int]) -> None:
        end = self._end_of(job)
        host = False
        for index, node_alloc in self._on_indexed_nodes(job, index_of):
            self.derived[index] = None
            held = self.until[index]
            for gpu in node_alloc.gpus:
                held.pop(gpu, None)
            event = (end, index, tuple(sorted(node_alloc.gpus)))
            position = bisect.bisect_left(self.events, event)
            if position < len(self.events) and self.events[position] == event:
                del self.events[position]
            host = host or bool(node_alloc.cpus or node_alloc.mem_mb)
        self.host_jobs -= host


_HOLDS = _RunningHolds()


class Timeline:
    def __init__(self, capacity: Capacity, running: Sequence[RunningJob], now: float) -> None:
        self.capacity = capacity
        self.now = now
        self.free_at: list[dict[int, float]] = []  # node index -> busy GPU -> when it comes free (INFINITY: unknown)
        self.events: list[tuple[float, int, tuple[int, ...]]] = []
        # Nodes whose free_at dict is the timeline's own; the others' are shared with the running holds
        # (_RunningHolds.until and .derived, kept across cycles) instead of copied: most nodes are never held
        # nor started on in a cycle. Copied before the first change (_own). The full build owns every one.
        self._owned: set[int] = set()
        self._owns_all = False
        self._all_cpus: dict[int, frozenset[int]] = {}
        self._partition_members: dict[str, tuple[list[int], set[int]]] = {}
        # node index -> its CPUs and host memory over time, made on first use: a node none of whose jobs
        # holds CPUs or memory, and that no reservation asks about, never needs one.
        self._hosts: dict[int, _NodeHost] = {}
        # What was free when the timeline was made, which is what a node's host starts from, however late it
        # is made (starts after this take CPUs and memory from the capacity, and hold them here).
        self._free_cpus_then = list(capacity.free_cpus)
        self._free_memory_then = list(capacity.free_memory)
        # GPUs usable from now on, per node (free now and not held by a start or reservation): every GPU
        # but those busy past now (a GPU busy for a reason the snapshot does not give stays INFINITY).
        gpu_counts = capacity.gpu_counts
        if self._from_holds(running):
            # Each busy GPU is in free_at, and a running job's in exactly one event, with its end: those
            # ending by now are the events up to now, in time order (usually none: stopping jobs, overruns).
            free_at = self.free_at
            usable = [gpu_counts[i] - len(free_at[i]) for i in range(len(gpu_counts))]
            for when, index, gpus in self.events:
                if when > now:
                    break
                usable[index] += len(gpus)
            self.usable_now = usable
        else:
            self._build(running)
            free_at = self.free_at
            self.usable_now = [
                gpu_counts[i] - sum(1 for until in free_at[i].values() if until > now) if free_at[i] else gpu_counts[i]
                for i in range(len(gpu_counts))
            ]

    def _from_holds(self, running: Sequence[RunningJob]) -> bool:
        """The timeline from the running holds kept across cycles (_RunningHolds); False where only the
        full build gives the same answer."""
        capacity = self.capacity
        holds = _HOLDS
        holds.sync(running, capacity.names, capacity.index_of)
        if holds.conflict or holds.host_jobs:
            return False
        free_at: list[dict[int, float]] = []
        gpu_counts, until, derived = capacity.gpu_counts, holds.until, holds.derived
        for index, free in enumerate(capacity.free):
            gpu_count = gpu_counts[index]
            known = derived[index]
            if known is not None and known[0] is free and known[1] == gpu_count:
                free_at.append(known[2])
                continue
            held = until[index]
            if len(free) >= gpu_count:
                if held:
                    return False  # a running job holds a GPU the node calls free
                busy: dict[int, float] = {}
            elif not free.isdisjoint(held):
                return False
            elif len(held) + len(free) == gpu_count:
                busy = held  # every busy GPU is a running job's
            else:
                busy = {g: held.get(g, INFINITY) for g in range(gpu_count) if g not in free}
            derived[index] = (free, gpu_count, busy)
            free_at.append(busy)
        self.free_at = free_at
        self.events = list(holds.events)
        return True

    def _build(self, running: Sequence[RunningJob]) -> None:
        """The timeline from every running job of the snapshot."""
        capacity, now = self.capacity, self.now
        self._owns_all = True  # _from_holds may have shared some before it gave up: none is shared now
        free_at: list[dict[int, float]] = [{} for _ in capacity.views]
        gpu_counts = capacity.gpu_counts
        self.free_at = free_at
        for index, free in enumerate(capacity.free):
            gpu_count = gpu_counts[index]
            if len(free) < gpu_count:
                free_at[index] = dict.fromkeys((g for g in range(gpu_count) if g not in free), INFINITY)
        by_time: dict[tuple[float, int], list[int]] = defaultdict(list)
        index_of = capacity.index_of
        for job in running:
            end = now if job.stopping else max(now, job.expected_end)
            for node_alloc in job.allocation.nodes:
                found = index_of.get(node_alloc.node)
                if found is None:
                    continue
                releases = by_time[(end, found)]  # an event even when only CPUs or memory come free
                busy = free_at[found]
                for gpu in node_alloc.gpus:
                    if busy.get(gpu) == INFINITY:
                        busy[gpu] = end
                        releases.append(gpu)
                if node_alloc.cpus or node_alloc.mem_mb:
                    self._host(found).explain(node_alloc.cpus, node_alloc.mem_mb, end)
        self.events = sorted((t, i, tuple(sorted(g))) for (t, i), g in by_time.items())

    def _host(self, index: int) -> _NodeHost:
        found = self._hosts.get(index)
        if found is None:
            view = self.capacity.views[index]
            found = _NodeHost(view.cpus, view.memory_mb, self._free_cpus_then[index], self._free_memory_then[index],
                              self.now)
            self._hosts[index] = found
        return found

    def started(self, allocation: Allocation, until: float) -> None:
        """A job of this cycle started on ``allocation`` now (its GPUs are already out of the capacity's free
        sets, so the timeline took them for busy with no known end): they come free at ``until``."""
        for node_alloc in allocation.nodes:
            index = self.capacity.index_of[node_alloc.node]
            busy = self._own(index)
            for gpu in node_alloc.gpus:
                busy[gpu] = until
            self._host(index).explain(node_alloc.cpus, node_alloc.mem_mb, until)
            bisect.insort(self.events, (until, index, tuple(node_alloc.gpus)))

    def hold(self, allocation: Allocation, until: float) -> None:
        """The GPUs of ``allocation`` are busy until ``until`` at least (a start now, or a reservation)."""
        for node_alloc in allocation.nodes:
            index = self.capacity.index_of[node_alloc.node]
            busy = self._own(index)
            for gpu in node_alloc.gpus:
                before = busy.get(gpu, self.now)
                if before <= self.now < until:
                    self.usable_now[index] -= 1
                busy[gpu] = max(before, until)
            self._host(index).hold(node_alloc.cpus, node_alloc.mem_mb, until)
            bisect.insort(self.events, (until, index, tuple(node_alloc.gpus)))

    def _own(self, index: int) -> dict[int, float]:
        """The node's free_at dict, the timeline's own (a copy of the running holds' one it shared)."""
        if not self._owns_all and index not in self._owned:
            self._owned.add(index)
            self.free_at[index] = dict(self.free_at[index])
        return self.free_at[index]

    def cpus_at(self, index: int, when: float) -> frozenset[int]:
        """The node's CPUs free from ``when`` on (as far as the timeline knows)."""
        free = self._host(index).cpus_at(when)
        return self._every_cpu(index) if free is None else free

    def memory_at(self, index: int, when: float) -> int:
        """The node's host memory (MB) free at ``when``."""
        return self._host(index).memory_at(when)

    def memory_room(self, allocation: Allocation, start: float) -> dict[str, int]:
        """For a reservation about to be held on ``allocation`` from ``start``: per node where it asks for
        memory, what is still free beside it then (Capacity.reserve's ``memory_room``)."""
        return {
            n.node: self.memory_at(self.capacity.index_of[n.node], start) - n.mem_mb
            for n in allocation.nodes if n.mem_mb
        }

    def _best_fit_at(self, request: Request, when: float, counts: list[int]) -> BestFit:
        """The candidates of the partition's ready nodes at ``when``, best fit first (fewest usable GPUs,
        ties in index order), each made when a search first reaches it."""
        capacity = self.capacity
        per_node = request.shape.min_gpus_per_node
        gpu_counts, free_at, now = capacity.gpu_counts, self.free_at, self.now
        matches = capacity.matching_all(request.gpu_type, request.gpu_mem_mib)
        entries = []
        # The partition's ready nodes, in index order: the nodes a walk of every view would keep.
        for index in self._members(request.partition)[0]:
            if counts[index] < per_node:
                continue
            match = matches[index]  # None: every GPU of the node
            busy = free_at[index]
            gpu_count = gpu_counts[index]
            # ascending: the matching GPUs not busy past ``when``
            if match is None:
                if busy or when < now:
                    usable = [g for g in range(gpu_count) if busy.get(g, now) <= when]
                else:
                    usable = list(range(gpu_count))
                entries.append((len(usable), index, usable, gpu_count))
                continue
            if busy or when < now:
                usable = [g for g in range(gpu_count) if busy.get(g, now) <= when and g in match]
            else:
                usable = sorted(match)
            entries.append((len(usable), index, usable, len(match)))
        entries.sort()  # by count, then index (unique): the order a stable sort by count of index order gives
        wants_cpus = request.cpus_per_gpu or request.cpus_per_node
        wants_memory = request.mem_mb or request.mem_per_gpu_mb or request.mem_whole_node
        views = capacity.views

        def make(index: int, usable: list[int], capable: int) -> Candidate:
            view = views[index]
            return Candidate(
                index=index,
                view=view,
                usable=usable,
                capable=capable,
                free_cpus=self.cpus_at(index, when) if wants_cpus else self._every_cpu(index),
                free_memory_mb=self.memory_at(index, when) if wants_memory else view.memory_mb,
            )

        return BestFit(entries, make)

    def _every_cpu(self, index: int) -> frozenset[int]:
        found = self._all_cpus.get(index)
        if found is None:
            found = self._all_cpus[index] = frozenset(range(self.capacity.views[index].cpus))
        return found

    def _members(self, partition: str) -> tuple[list[int], set[int]]:
        """The ready nodes of the partition (as a list and a set): asked once per reservation."""
        found = self._partition_members.get(partition)
        if found is None:
            capacity = self.capacity
            members = [i for i, view in enumerate(capacity.views) if capacity.ready[i] and partition in view.partitions]
            found = self._partition_members[partition] = (members, set(members))
        return found

    def earliest_start(
        self, request: Request, placer: Placer, resolution_s: float, window_s: float
    ) -> tuple[float, Allocation] | None:
        """The first moment (rounded up to the resolution, within the window) at which the whole job fits,
        with the allocation it would get then; None if not within the window."""
        capacity = self.capacity
        counts = list(self.usable_now)
        members, member_set = self._members(request.partition)
        if not members:
            return None
        shape = request.shape
        per_node = shape.min_gpus_per_node
        # The cheap necessary test, kept as GPUs come free instead of recounted at each step: enough of the
        # partition's nodes with per_node usable GPUs (a gang of so many nodes), or enough usable GPUs in
        # all (a total to spread).
        by_nodes = shape.node_count is not None
        if shape.node_count is not None:
            need = shape.node_count
            have = sum(1 for i in members if counts[i] >= per_node)
        else:
            need = shape.total_gpus
            # every node of the cluster (one partition, all ready): a sum in C
            have = sum(counts) if len(members) == len(counts) else sum(counts[i] for i in members)

        horizon = self.now + window_s
        attempts = 0

        def try_at(step: float) -> Allocation | None:
            nonlocal attempts
            attempts += 1
            candidates = self._best_fit_at(request, step, counts)
            return placer.place(request, lambda _r: candidates)

        # Now first: GPUs of jobs being stopped count as free from now on, so the job may fit as soon as
        # they are (it could not start yet because they are still held).
        if have >= need:
            allocation = try_at(self.now)
            if allocation is not None:
                return self.now, allocation
        events, free_at, gpu_counts, now = self.events, self.free_at, capacity.gpu_counts, self.now
        position = bisect.bisect_right(events, (now, math.inf, ()))
        while position < len(events) and attempts < MAX_PLACEMENT_ATTEMPTS:
            # Every release up to the next resolution step counts at that step.
            first = events[position][0]
            step = now + math.ceil((first - now) / resolution_s) * resolution_s if resolution_s > 0 else first
            if step > horizon:
                return None
            while position < len(events) and events[position][0] <= step:
                when, index, gpus = events[position]
                position += 1
                if index not in member_set:
                    continue
                busy = free_at[index]
                released = 0
                for g in gpus:
                    if busy.get(g) == when:
                        released += 1
                if released:
                    before = counts[index]
                    after = before + released
                    if after > gpu_counts[index]:
                        after = gpu_counts[index]
                    counts[index] = after
                    if by_nodes:
                        have += (after >= per_node) - (before >= per_node)
                    else:
                        have += after - before
            if have >= need:
                allocation = try_at(step)
                if allocation is not None:
                    return step, allocation
        return None
