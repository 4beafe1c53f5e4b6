"""The cluster's free resources during one cycle, indexed so that a 1,000-node cluster costs little per job.

Built once per cycle from the snapshot's node views, then changed as the cycle decides: ``take`` removes
what a start uses, ``reserve`` marks what a blocked job will get at a future time: its GPUs and CPUs, and
the host memory the node can still lend past that time (memory is a quantity, not named units, so what is
protected is the room left beside the reservation, not particular megabytes). For every partition the
ready nodes are bucketed by their number of free GPUs, which gives two things cheaply:

- ``might_fit``: a necessary condition (enough nodes with enough free GPUs, enough free GPUs in all) that
  rejects most jobs of a deep queue in constant time, before any node is looked at;
- ``stream``: candidate nodes in best-fit order (fewest free GPUs first) for the placer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.placement import Graded, matching_gpus
from garrison.controller.sched.snapshot import NodeView
from garrison.model.domain import Allocation

INFINITY = float("inf")


class _NodeIndex:
    """What a cycle's capacity derives from its node views before any decision: their topology order, the
    per-node facts read once (GPU count, readiness, GPU type matches) and the ready nodes bucketed by free
    GPUs. Kept from one cycle to the next (a module-level memo, like cycle.py's requests) and updated for
    the views that changed, found by object identity: the simulator's snapshot hands the same view object
    for a node until its free GPUs change, so an event re-buckets one or two nodes instead of sorting and
    bucketing all of them. Any change besides free GPUs, CPUs, memory and idleness (a node added, drained,
    renamed, moved, repartitioned, or with other GPUs) rebuilds it."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        # The node list this describes, in its order (a copy unless a tuple: a list could change in place).
        self.nodes: tuple[NodeView, ...] = nodes if isinstance(nodes, tuple) else tuple(nodes)
        self.views: tuple[NodeView, ...] = tuple(sorted(nodes, key=lambda v: (v.switches, v.name)))
        self.names: tuple[str, ...] = tuple(v.name for v in self.views)
        self.index_of = {name: i for i, name in enumerate(self.names)}
        self.sorted_index = [self.index_of[v.name] for v in nodes]  # position in ``nodes`` -> index
        self.ready: list[bool] = [v.schedulable and not v.drained for v in self.views]
        self.gpu_counts: list[int] = [len(v.gpu_names) for v in self.views]  # NodeView.gpu_count, read once
        self.max_gpus = max(self.gpu_counts, default=0)
        # What each node has free, in index order: a cycle's Capacity starts from copies of these.
        self.free: list[frozenset[int]] = [v.free_gpus for v in self.views]
        self.free_cpus: list[frozenset[int]] = [v.free_cpus for v in self.views]
        self.free_memory: list[int] = [v.free_memory_mb for v in self.views]
        self.idle: list[bool] = [v.idle for v in self.views]
        self.exclusive: list[bool] = [v.held_exclusively for v in self.views]
        self.buckets: dict[str, list[set[int]]] = {}
        for i, view in enumerate(self.views):
            if self.ready[i]:
                for part in view.partitions:
                    self.bucket(part)[len(view.free_gpus)].add(i)
        # (index, GPU type, GPU memory) -> the node's matching GPUs: static facts of the node
        self.matching: dict[tuple[int, str | None, int], frozenset[int]] = {}
        # (GPU type, GPU memory) -> every node's matching GPUs, by index, or None for a node all of whose
        # GPUs match (most requests name no type): what the backfill sweep reads per node and attempt
        self.matching_all: dict[tuple[str | None, int], list[frozenset[int] | None]] = {}

    def bucket(self, partition: str) -> list[set[int]]:
        found = self.buckets.get(partition)
        if found is None:
            found = [set() for _ in range(self.max_gpus + 1)]
            self.buckets[partition] = found
        return found

    def follow(self, nodes: Sequence[NodeView]) -> bool:
        """Update for ``nodes``, the next cycle's list; False if only a rebuild can."""
        if nodes is self.nodes:
            return True
        if len(nodes) != len(self.nodes):
            return False
        views = list(self.views)
        moves: list[tuple[int, int, int]] = []
        for position, (new, old) in enumerate(zip(nodes, self.nodes, strict=True)):
            if new is old:
                continue
            if (new.name != old.name or new.switches != old.switches or new.schedulable != old.schedulable
                    or new.drained != old.drained or new.partitions != old.partitions
                    or new.gpu_names != old.gpu_names or new.gpu_memory_mib != old.gpu_memory_mib):
                return False
            index = self.sorted_index[position]
            views[index] = new
            self.free[index] = new.free_gpus
            self.free_cpus[index] = new.free_cpus
            self.free_memory[index] = new.free_memory_mb
            self.idle[index] = new.idle
            self.exclusive[index] = new.held_exclusively
            if self.ready[index] and len(new.free_gpus) != len(old.free_gpus):
                moves.append((index, len(old.free_gpus), len(new.free_gpus)))
        for index, before, after in moves:
            for part in views[index].partitions:
                bucket = self.buckets[part]
                bucket[before].discard(index)
                bucket[after].add(index)
        self.views = tuple(views)
        self.nodes = nodes if isinstance(nodes, tuple) else tuple(nodes)
        return True


_NODES: _NodeIndex | None = None


def _node_index(nodes: Sequence[NodeView]) -> _NodeIndex:
    global _NODES
    if _NODES is None or not _NODES.follow(nodes):
        _NODES = _NodeIndex(nodes)
    return _NODES


class Capacity:
    def __init__(self, nodes: Sequence[NodeView]) -> None:
        index = _node_index(nodes)
        # Topology order, then name: node indices double as rank order for gangs (placement.py).
        self.views: tuple[NodeView, ...] = index.views
        self.names: tuple[str, ...] = index.names
        self.index_of = index.index_of
        self.free: list[frozenset[int]] = list(index.free)
        self.free_cpus: list[frozenset[int]] = list(index.free_cpus)
        self.free_memory: list[int] = list(index.free_memory)
        self.ready: list[bool] = index.ready  # never changed by a cycle
        self.idle: list[bool] = list(index.idle)  # --exclusive: nothing runs there
        self.exclusive: list[bool] = list(index.exclusive)
        # node index -> GPU -> (start, job id) of the earliest reservation that holds it
        self.reserved: dict[int, dict[int, tuple[float, int]]] = {}
        # node index -> CPU -> (start, job id) of the earliest reservation that holds it
        self.reserved_cpus: dict[int, dict[int, tuple[float, int]]] = {}
        # node index -> (reservation start, host memory MB the node can lend to jobs still running then, job id)
        self.memory_room: dict[int, list[tuple[float, int, int]]] = {}
        self.gpu_counts: list[int] = index.gpu_counts  # never changed by a cycle
        self.max_gpus = index.max_gpus
        # The cycle changes its own copy of the buckets as it takes GPUs.
        self.buckets: dict[str, list[set[int]]] = {
            part: [set(members) for members in bucket] for part, bucket in index.buckets.items()
        }
        self._matching = index.matching
        self._matching_all = index.matching_all
        # partition -> (free GPUs on its ready nodes, nodes with at least k free GPUs for each k), for the
        # buckets' version it was counted at: might_fit asks it for every job of a deep queue, and the
        # buckets only change when something starts.
        self._fit_summary: dict[str, tuple[int, list[int]]] = {}
        self._fit_version = 0
        self.version = 0  # bumped by every take and reserve, so callers can cache answers between changes
        # Bumped by take alone: a reservation (most of a garrison cycle's changes, up to 8 of them) leaves
        # the buckets as they are, so the fit summaries counted before it still hold after it.
        self._buckets_version = 0

    def _bucket(self, partition: str) -> list[set[int]]:
        found = self.buckets.get(partition)
        if found is None:
            found = [set() for _ in range(self.max_gpus + 1)]
            self.buckets[partition] = found
        return found

    def matching(self, index: int, gpu_type: str | None, gpu_mem_mib: int) -> frozenset[int]:
        key = (index, gpu_type, gpu_mem_mib)
        found = self._matching.get(key)
        if found is None:
            found = matching_gpus(self.views[index], gpu_type, gpu_mem_mib)
            self._matching[key] = found
        return found

    def matching_all(self, gpu_type: str | None, gpu_mem_mib: int) -> list[frozenset[int] | None]:
        """``matching`` of every node, by index, with None for a node all of whose GPUs match."""
        key = (gpu_type, gpu_mem_mib)
        found = self._matching_all.get(key)
        if found is None:
            found = []
            for index, gpu_count in enumerate(self.gpu_counts):
                match = self.matching(index, gpu_type, gpu_mem_mib)
                found.append(None if len(match) == gpu_count else match)
            self._matching_all[key] = found
        return found

    # -- questions ------------------------------------------------------------------------------------

    def might_fit(self, request: Request) -> bool:
        """False only if the job cannot possibly start now (GPU counts alone); True means: look closer."""
        # _summary's cached answer, looked up here: might_fit is asked for nearly every job of the queue.
        summary = self._fit_summary.get(request.partition) if self._fit_version == self._buckets_version else None
        if summary is None:
            summary = self._summary(request.partition)
        if summary is None:
            return False
        free_gpus, nodes_with_at_least = summary
        shape = request.shape
        if shape.node_count is None:
            return free_gpus >= shape.total_gpus  # on one node or spread, the free GPUs must add up
        per_node = shape.min_gpus_per_node
        return per_node < len(nodes_with_at_least) and nodes_with_at_least[per_node] >= shape.node_count

    def _summary(self, partition: str) -> tuple[int, list[int]] | None:
        if self._fit_version != self._buckets_version:
            self._fit_summary.clear()
            self._fit_version = self._buckets_version
        found = self._fit_summary.get(partition)
        if found is None:
            buckets = self.buckets.get(partition)
            if buckets is None:
                return None
            at_least = [0] * len(buckets)
            running = 0
            for k in range(len(buckets) - 1, -1, -1):
                running += len(buckets[k])
                at_least[k] = running
            found = (sum(k * len(buckets[k]) for k in range(1, len(buckets))), at_least)
            self._fit_summary[partition] = found
        return found

    def candidate(self, request: Request, index: int, end_time: float) -> Candidate:
        """What node ``index`` offers a job that would run until ``end_time`` if it started now."""
        return self._candidate(request, index, end_time, self.matching_all(request.gpu_type, request.gpu_mem_mib)[index])

    def _candidate(self, request: Request, index: int, end_time: float, match: frozenset[int] | None) -> Candidate:
        """``candidate``, given the node's entry of ``matching_all``."""
        view = self.views[index]
        free = self.free[index]
        usable: frozenset[int] | set[int] = free if match is None else free & match
        reserved = self.reserved.get(index)
        if reserved:
            usable = {g for g in usable if g not in reserved or reserved[g][0] >= end_time}
        free_cpus = self.free_cpus[index]
        reserved_cpus = self.reserved_cpus.get(index)
        if reserved_cpus:
            free_cpus = frozenset(c for c in free_cpus if c not in reserved_cpus or reserved_cpus[c][0] >= end_time)
        free_memory = self.free_memory[index]
        for start, room, _ in self.memory_room.get(index, ()):
            if start < end_time:
                free_memory = min(free_memory, room)
        return Candidate(
            index=index,
            view=view,
            usable=sorted(usable),
            capable=self.gpu_counts[index] if match is None else len(match),
            free_cpus=free_cpus,
            free_memory_mb=free_memory,
            idle=self.idle[index],
            held_exclusively=self.exclusive[index],
        )

    def memory_after_freeing(self, index: int, end_time: float, freed: Sequence[tuple[float, int]]) -> int:
        """The memory a job running until ``end_time`` could use on node ``index`` if the jobs holding
        ``freed`` ((expected end, MB) each) were stopped now: what is free plus theirs, within the room of
        each reservation it would outlive, which grows by what those jobs would still have held then."""
        memory = self.free_memory[index] + sum(mb for _, mb in freed)
        for start, room, _ in self.memory_room.get(index, ()):
            if start < end_time:
                memory = min(memory, room + sum(mb for until, mb in freed if until > start))
        return memory

    def stream(self, request: Request, end_time: float) -> Iterator[Candidate]:
        """Ready nodes of the job's partition with enough free GPUs, fewest free first (best fit)."""
        return _Stream(self, request, end_time)

    def _stream(self, request: Request, end_time: float, least: int) -> Iterator[Candidate]:
        buckets = self.buckets.get(request.partition)
        if buckets is None:
            return
        matches = self.matching_all(request.gpu_type, request.gpu_mem_mib)
        for k in range(max(least, request.shape.min_gpus_per_node), len(buckets)):
            for index in sorted(buckets[k]):
                yield self._candidate(request, index, end_time, matches[index])

    # -- changes --------------------------------------------------------------------------------------

    def take(self, allocation: Allocation, end_time: float = INFINITY, exclusive: bool = False) -> None:
        """A job starts now on ``allocation`` and may run until ``end_time`` (``exclusive``: sharing none
        of its nodes)."""
        self.version += 1
        self._buckets_version += 1
        for node_alloc in allocation.nodes:
            index = self.index_of[node_alloc.node]
            self.idle[index] = False
            self.exclusive[index] = self.exclusive[index] or exclusive
            before = len(self.free[index])
            self.free[index] = self.free[index].difference(node_alloc.gpus)
            if node_alloc.cpus:
                self.free_cpus[index] = self.free_cpus[index] - set(node_alloc.cpus)
            self.free_memory[index] -= node_alloc.mem_mb
            rooms = self.memory_room.get(index)
            if rooms and node_alloc.mem_mb:
                # Still running when a reservation starts: it uses that reservation's room.
                self.memory_room[index] = [
                    (start, room - node_alloc.mem_mb if start < end_time else room, job)
                    for start, room, job in rooms
                ]
            after = len(self.free[index])
            if self.ready[index] and after != before:
                for part in self.views[index].partitions:
                    bucket = self._bucket(part)
                    bucket[before].discard(index)
                    bucket[after].add(index)

    def reserve(
        self, allocation: Allocation, start: float, job_id: int, memory_room: dict[str, int] | None = None
    ) -> None:
        """From ``start`` on, the GPUs and CPUs of ``allocation`` belong to job ``job_id``: a job started
        now may use them only if it ends by then. ``memory_room``: per node, the host memory still free at
        ``start`` beside the reservation's own (backfill.Timeline.memory_room); a job started now that runs
        past ``start`` may use no more than that."""
        self.version += 1
        for node_alloc in allocation.nodes:
            index = self.index_of[node_alloc.node]
            held = self.reserved.setdefault(index, {})
            for gpu in node_alloc.gpus:
                if gpu not in held or start < held[gpu][0]:
                    held[gpu] = (start, job_id)
            if node_alloc.cpus:
                held_cpus = self.reserved_cpus.setdefault(index, {})
                for cpu in node_alloc.cpus:
                    if cpu not in held_cpus or start < held_cpus[cpu][0]:
                        held_cpus[cpu] = (start, job_id)
            if memory_room is not None and node_alloc.node in memory_room:
                self.memory_room.setdefault(index, []).append((start, memory_room[node_alloc.node], job_id))

    def reservation_on(self, allocation: Allocation) -> tuple[float, int] | None:
        """(start, job id) of the earliest reservation on any GPU or CPU of ``allocation``, or on the memory
        of a node where it asks for some; None if none."""
        found: list[tuple[float, int]] = []
        for node_alloc in allocation.nodes:
            index = self.index_of[node_alloc.node]
            held = self.reserved.get(index, {})
            found.extend(held[gpu] for gpu in node_alloc.gpus if gpu in held)
            held_cpus = self.reserved_cpus.get(index, {})
            found.extend(held_cpus[cpu] for cpu in node_alloc.cpus if cpu in held_cpus)
            if node_alloc.mem_mb:
                found.extend((start, job) for start, _, job in self.memory_room.get(index, ()))
        return min(found, default=None)


class _Stream(Graded, Iterator[Candidate]):
    """Capacity.stream: its candidates made as they are reached. A node of the bucket of k free GPUs has at
    most k usable (fewer where reserved or of another type), so a search for ``least`` starts at bucket
    ``least`` (Graded)."""

    __slots__ = ("_capacity", "_request", "_end_time", "_all")

    def __init__(self, capacity: Capacity, request: Request, end_time: float) -> None:
        self._capacity, self._request, self._end_time = capacity, request, end_time
        self._all: Iterator[Candidate] | None = None

    def __next__(self) -> Candidate:
        if self._all is None:
            self._all = self._capacity._stream(self._request, self._end_time, 0)
        return next(self._all)

    def from_usable(self, least: int) -> Iterator[Candidate]:
        return self._capacity._stream(self._request, self._end_time, least)
