"""Could this job ever run here? Answered once, from the filters' UNRESOLVABLE status on the idle cluster.

Submission validation (controller/validate.py), the cycle (a job that can never run on the nodes that are
up waits with NodesUnavailable or NodesDrained and holds nobody back), ``gsub --test-only`` (which runs
both) and gsim (which refuses such a trace job before replaying) all ask this module, so they cannot
disagree.

Every node is looked at as if nothing ran on it: then no filter can fail "for now" (UNSCHEDULABLE), and
the first filter that fails says, for good, why the node cannot hold its share (NodeNotExcluded: the job
said -x; GpuCapacity: too few GPUs of the type...). The nodes every filter passes are counted the way the
placer fills them (how many of the job's GPUs each could take, given its CPUs and memory), which is
exactly what a placement on the idle nodes finds, without placing.

Nodes are handled in classes of equal static attributes (a cluster of 1,000 DGX nodes is one class), so
the answer costs a few filter calls per class; filters that look at a node's name (``reads_node_name``)
run on each node of a class that passes the rest. Whether a node is up, drained or down is the
readiness filter's question (``about_node_state``), answered per level: the verdict says whether the
job fits on the up nodes, with the drained ones back, or with every registered node up.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import is_not

from garrison.controller.sched.filters.node_selection import restricted_to_list
from garrison.controller.sched.framework import Candidate, Code, Filter, Request, placement_key
from garrison.controller.sched.placement import Placer, matching_gpus
from garrison.controller.sched.snapshot import NodeView


class Feasibility(enum.Enum):
    """How far from running a job is, with every node idle."""

    RUNS = "runs"  # on the nodes that are up
    NEEDS_DRAINED = "needs drained nodes"  # only if drained nodes came back
    NEEDS_DOWN = "needs down nodes"  # only if nodes that are down (or not connected) came back
    NEVER = "never"  # on no registered node of its partition, whatever their state


@dataclass(frozen=True, slots=True)
class NodeTally:
    """Nomad's AllocMetric for one question: nodes evaluated, and how many each filter ruled out for good."""

    evaluated: int = 0
    filtered: tuple[tuple[str, str, int], ...] = ()  # (filter name, its reason, nodes), in pipeline order
    passing: int = 0  # nodes every filter passes (in any state)
    largest: int = 0  # the most of the job's GPUs one passing node could take (idle)
    largest_any: int = 0  # the same over every node of the partition, filters or not (for "largest: 8")

    def count(self, filter_name: str) -> int:
        return sum(n for name, _, n in self.filtered if name == filter_name)


@dataclass(frozen=True, slots=True)
class Verdict:
    feasibility: Feasibility
    tally: NodeTally

    @property
    def runs(self) -> bool:
        return self.feasibility == Feasibility.RUNS


def _class_key(view: NodeView) -> tuple[object, ...]:
    """What the filters read of a node besides its name and what is free (frozensets cache their hash)."""
    return (view.schedulable, view.drained, view.partitions, view.features, view.gpu_names, view.gpu_memory_mib,
            view.cpus, view.memory_mb)


def idle_candidate(index: int, view: NodeView, match: frozenset[int]) -> Candidate:
    """What ``view`` would offer a job if nothing ran on it."""
    return Candidate(index=index, view=view, usable=sorted(match), capable=len(match),
                     free_cpus=frozenset(range(view.cpus)), free_memory_mb=view.memory_mb, idle=True,
                     held_exclusively=False)


def idle_room(request: Request, view: NodeView, capable: int) -> int:
    """How many of the request's GPUs an idle node could take (placement.hostable on an idle node)."""
    room = capable
    if request.cpus_per_gpu:
        room = min(room, view.cpus // request.cpus_per_gpu)
    if request.mem_per_gpu_mb and not request.mem_mb:
        room = min(room, view.memory_mb // request.mem_per_gpu_mb)
    return room


def gang_fits(request: Request, rooms: Sequence[int]) -> bool:
    """Whether nodes that could take ``rooms`` of the request's GPUs each hold the whole gang (the placer's
    rules: a total over as few nodes as needed, or N nodes each with its share; largest shares first)."""
    shape = request.shape
    if shape.node_count is None:
        return sum(rooms) >= shape.total_gpus and bool(rooms)
    count = shape.node_count
    if len(rooms) < count:
        return False
    if shape.gpus_per_node is not None:
        needs = [shape.gpus_per_node] * count
    else:
        base, extra = divmod(shape.total_gpus, count)
        needs = [base + 1] * extra + [base] * (count - extra)
    ranked = sorted(rooms, reverse=True)
    return all(room >= need for room, need in zip(ranked, needs, strict=False))


# The verdicts of the last node set asked about, kept from one IdleCluster to the next (a module-level memo
# of a pure function, like cycle.py's requests): each cycle makes its own IdleCluster, but the verdicts
# depend only on what _class_key reads of each node, its name and order, and the filters, which change far
# more rarely than cycles run (a node added, drained or reconfigured). (signature, verdicts) or None.
_SHARED: tuple[tuple[object, ...], dict[tuple[object, ...], Verdict]] | None = None

NodeClasses = tuple[tuple[str, tuple[object, ...]], ...]
# The last node list a signature was made for, with its (name, _class_key) per node. Each cycle's
# IdleCluster is made from a new tuple of views, but of mostly the same view objects (capacity._NodeIndex
# replaces only the views of nodes whose free GPUs changed), and a view is frozen: its class key is a pure
# function of the object. The views are kept here, so that their ids are not reused while they are.
_LAST_CLASSES: tuple[tuple[NodeView, ...], NodeClasses] | None = None


def _node_classes_of(nodes: Sequence[NodeView]) -> NodeClasses:
    """``tuple((view.name, _class_key(view)) for view in nodes)``; the last answer itself (the same object)
    where every node's name and class key are what they were, so that comparing it with the shared
    verdicts' signature is an identity test per node, not a compare of every node's key. The views that
    are not the last list's own are found in C: usually one or two of 54, where making every key cost
    ~2% of a garrison replay."""
    global _LAST_CLASSES
    views = nodes if isinstance(nodes, tuple) else tuple(nodes)
    last = _LAST_CLASSES
    if last is not None and len(last[0]) == len(views):
        old_views, old_classes = last
        if old_views is views:
            return old_classes
        for index in compress(range(len(views)), map(is_not, views, old_views)):
            view = views[index]
            if old_classes[index] != (view.name, _class_key(view)):
                break
        else:
            _LAST_CLASSES = (views, old_classes)
            return old_classes
    classes = tuple((view.name, _class_key(view)) for view in views)
    _LAST_CLASSES = (views, classes)
    return classes


class IdleCluster:
    """The nodes of one cycle (or of a submission's partition) as if idle; answers are cached per request
    key, so a deep queue of look-alikes pays for one answer, and shared with the next IdleCluster of the
    same nodes (_SHARED)."""

    def __init__(self, nodes: Sequence[NodeView], placer: Placer, max_cached: int = 4096) -> None:
        self.nodes = nodes
        self.placer = placer
        self.max_cached = max_cached  # a long-lived one (submission checks) forgets its answers past this
        self._classes: list[list[int]] | None = None
        self._cache: dict[tuple[object, ...], Verdict] = {}
        self._signature: tuple[object, ...] | None = None
        self.static_filters = tuple(f for f in placer.pipeline.filters
                                    if not f.reads_node_name and not f.about_node_state)
        self.name_filters = tuple(f for f in placer.pipeline.filters if f.reads_node_name and not f.about_node_state)

    def _node_classes(self) -> list[list[int]]:
        if self._classes is None:
            groups: dict[tuple[object, ...], list[int]] = {}
            for index, view in enumerate(self.nodes):
                groups.setdefault(_class_key(view), []).append(index)
            self._classes = list(groups.values())
        return self._classes

    def verdict(self, request: Request, key: tuple[object, ...] | None = None) -> Verdict:
        """``key``: the request's placement_key, when the caller has it already (the cycle does)."""
        if key is None:
            key = placement_key(request)
        found = self._cache.get(key)
        if found is None:
            shared = self._shared()
            found = shared.get(key)
            if found is None:
                found = self._judge(request)
                if len(shared) >= self.max_cached:
                    shared.clear()
                shared[key] = found
            if len(self._cache) >= self.max_cached:
                self._cache.clear()
            self._cache[key] = found
        return found

    def _shared(self) -> dict[tuple[object, ...], Verdict]:
        """The verdicts cached for these very nodes and filters, by whichever IdleCluster asked first."""
        global _SHARED
        if self._signature is None:
            self._signature = (self.placer.pipeline, self.placer.score_limit, _node_classes_of(self.nodes))
        if _SHARED is None or _SHARED[0] != self._signature:
            _SHARED = (self._signature, {})
        return _SHARED[1]

    def _judge(self, request: Request) -> Verdict:
        filtered: Counter[tuple[str, str]] = Counter()
        order = {f.name: i for i, f in enumerate(self.placer.pipeline.filters)}
        # Passing nodes per readiness: (index, room) for up, drained, down nodes.
        up: list[tuple[int, int]] = []
        drained: list[tuple[int, int]] = []
        down: list[tuple[int, int]] = []
        evaluated = 0
        largest_any = 0
        for members in self._node_classes():
            first = self.nodes[members[0]]
            if request.partition not in first.partitions:
                continue  # not a node of the job's partition: not evaluated (Nomad counts the job's datacenter)
            evaluated += len(members)
            match = matching_gpus(first, request.gpu_type, request.gpu_mem_mib)
            room = idle_room(request, first, len(match))
            largest_any = max(largest_any, room)
            probe = idle_candidate(members[0], first, match)
            failed = self._first_failure(self.static_filters, request, probe)
            if failed is not None:
                filtered[failed] += len(members)
                continue
            level = up if first.schedulable and not first.drained else drained if first.schedulable else down
            for index in members:
                if self.name_filters and (request.exclude or request.nodelist):
                    bad = self._first_failure(self.name_filters, request, idle_candidate(index, self.nodes[index], match))
                    if bad is not None:
                        filtered[bad] += 1
                        continue
                level.append((index, room))
        passing = len(up) + len(drained) + len(down)
        if up or drained or down:
            filtered_by_state = len(drained) + len(down)
            if filtered_by_state:
                filtered[("NodeReady", "drained or down")] += filtered_by_state
        tally = NodeTally(
            evaluated=evaluated,
            filtered=tuple((name, reason, n) for (name, reason), n in sorted(filtered.items(),
                                                                             key=lambda item: order.get(item[0][0], 99))),
            passing=passing,
            largest=max((room for _, room in (*up, *drained, *down)), default=0),
            largest_any=largest_any,
        )
        if self._fits(request, up):
            return Verdict(Feasibility.RUNS, tally)
        if self._fits(request, up + drained):
            return Verdict(Feasibility.NEEDS_DRAINED, tally)
        if self._fits(request, up + drained + down):
            return Verdict(Feasibility.NEEDS_DOWN, tally)
        return Verdict(Feasibility.NEVER, tally)

    @staticmethod
    def _first_failure(steps: Sequence[Filter], request: Request, candidate: Candidate) -> tuple[str, str] | None:
        """(filter name, reason) of the first of ``steps`` that rules the idle node out, None if none does."""
        for step in steps:
            status = step.check(request, candidate)
            if not status.ok:
                assert status.code == Code.UNRESOLVABLE, "on an idle node a filter can fail only for good"
                return step.name, status.reason
        return None

    def _fits(self, request: Request, passing: list[tuple[int, int]]) -> bool:
        if not passing:
            return False
        if request.nodelist:
            # -w: the placer's own rules for listed nodes (every one of them, largest needs first).
            if restricted_to_list(request) and len({self.nodes[i].name for i, _ in passing}) < len(request.nodelist):
                return False
            idle = [idle_candidate(i, self.nodes[i], matching_gpus(self.nodes[i], request.gpu_type,
                                                                   request.gpu_mem_mib)) for i, _ in passing]
            return self.placer.place(request, lambda r: sorted(idle, key=lambda c: (len(c.usable), c.index))) is not None
        return gang_fits(request, [room for _, room in passing])


def submission_verdict(request: Request, nodes: Sequence[NodeView], placer: Placer) -> Verdict:
    """Could the job ever run on ``nodes`` (every registered node, whatever its state)? For validation and
    gsim, which ask before the job is queued."""
    return IdleCluster(nodes, placer).verdict(request)


__all__ = ["Feasibility", "IdleCluster", "NodeTally", "Verdict", "gang_fits", "submission_verdict"]
