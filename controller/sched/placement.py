"""Gang placement: where a whole job fits, all of it or nothing.

``Placer.place`` answers one question for one job: which nodes, which GPU indices (and CPUs) on each, given
candidate nodes that say what they can offer at one moment. It never returns a partial allocation.

- One node if the job fits on one: the candidates come in best-fit order (fewest free GPUs first, so small
  jobs pack and whole nodes stay free), the first few that pass every filter are scored (pipeline.py), and
  the best wins.
- A gang over several nodes stays under one switch if any switch can hold it, else under one rack, and so
  on up the configured topology levels; within that group the best-scored nodes are taken. Nodes are then
  numbered in topology order (rank 0 on the first), so consecutive node ranks share a switch, and a
  node's local ranks are consecutive.
- Inside a node, the best-connected GPU set (topology.py), and CPUs on the NUMA nodes of those GPUs first.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import product
from operator import itemgetter
from typing import TYPE_CHECKING

from garrison.controller.sched.filters.cpu_memory import cpus_needed, mem_needed
from garrison.controller.sched.filters.excluded import NodeNotExcluded
from garrison.controller.sched.filters.gpu_free import GpuFree
from garrison.controller.sched.filters.node_selection import NodeFeatures, NodeListed, restricted_to_list
from garrison.controller.sched.framework import OK, Candidate, Filter, GangShape, Request
from garrison.controller.sched.scorers.binpack import BinPack
from garrison.controller.sched.scorers.gpu_topology import GpuTopology, node_affinity
from garrison.controller.sched.scorers.numa import NumaLocality, local_cpus
from garrison.controller.sched.snapshot import NodeView
from garrison.controller.sched.topology import gpu_affinity, pick_connected_gpus
from garrison.model.domain import Allocation, JobSpec, NodeAllocation
from garrison.model.features import is_matching_or, parse_constraint
from garrison.model.gputype import gpu_matches
from garrison.model.hostlist import compress_hostlist, expand_hostlist, trailing_number

if TYPE_CHECKING:
    from garrison.controller.sched.pipeline import Pipeline

__all__ = [
    "GangShape",
    "Placer",
    "gang_shape",
    "gpu_matches",
    "matching_gpus",
    "pick_connected_gpus",
    "place",
    "request_for",
]

# How many passing nodes a single-node job scores before choosing (they arrive best fit first, so the
# best packing is among them; Kubernetes samples nodes for the same reason on big clusters).
DEFAULT_SCORE_LIMIT = 16


def gang_shape(spec: JobSpec) -> GangShape:
    total = spec.total_gpus()
    if spec.gpus_per_node is not None:
        return GangShape(spec.nodes or 1, spec.gpus_per_node, total)
    if spec.nodes is not None:
        if spec.gpus is None:
            return GangShape(spec.nodes, 0, 0)
        return GangShape(spec.nodes, None, total)
    if total == 0:
        return GangShape(1, 0, 0)
    return GangShape(None, None, total)


def matching_gpus(view: NodeView, gpu_type: str | None, gpu_mem_mib: int) -> frozenset[int]:
    """The node's GPUs of the requested type with at least the requested memory, busy or not."""
    out = set()
    for index, name in enumerate(view.gpu_names):
        if not gpu_matches(name, gpu_type):
            continue
        if gpu_mem_mib and (index >= len(view.gpu_memory_mib) or view.gpu_memory_mib[index] < gpu_mem_mib):
            continue
        out.add(index)
    return frozenset(out)


# The empty set most jobs' --exclude and --nodelist are: one object, not two new ones per pending job (the core
# keeps each pending job's request between cycles; 432 bytes a job at 50,000 pending).
_NONE: frozenset[str] = frozenset()


def _names(names: tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    return frozenset(names) if names else _NONE


def request_for(job_id: int, spec: JobSpec, partition: str, duration_s: float) -> Request:
    return Request(
        job_id=job_id,
        shape=gang_shape(spec),
        partition=partition,
        gpu_type=spec.gpu_type,
        gpu_mem_mib=spec.gpu_mem_mb,
        cpus_per_gpu=spec.cpus_per_gpu,
        cpus_per_node=spec.cpus_per_node,
        mem_mb=spec.mem_mb,
        mem_per_gpu_mb=spec.mem_per_gpu_mb,
        mem_whole_node=spec.mem_whole_node,
        duration_s=duration_s,
        exclude=_names(spec.exclude),
        constraint=parse_constraint(spec.constraint) if spec.constraint else (),
        constraint_matching=bool(spec.constraint) and is_matching_or(spec.constraint or ""),
        nodelist=_names(spec.nodelist),
        exclusive=spec.exclusive,
    )


def _choose_cpus(request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> tuple[int, ...]:
    need = cpus_needed(request, len(gpus))
    if need == 0:
        return ()
    local = sorted(local_cpus(candidate, gpus))
    if len(local) >= need:
        return tuple(local[:need])
    rest = sorted(candidate.free_cpus - set(local))
    return tuple(sorted(local + rest[: need - len(local)]))


def hostable(request: Request, candidate: Candidate) -> int:
    """How many of the request's GPUs the node can take: its usable GPUs, fewer if its free CPUs cannot
    give each of them ``cpus_per_gpu`` (the filters only check the smallest share a node may get)."""
    usable = len(candidate.usable)
    if request.cpus_per_gpu:
        usable = min(usable, len(candidate.free_cpus) // request.cpus_per_gpu)
    if request.mem_per_gpu_mb and not request.mem_mb:
        usable = min(usable, candidate.free_memory_mb // request.mem_per_gpu_mb)
    return usable


def _node_gpus(request: Request, candidate: Candidate, count: int) -> tuple[int, ...]:
    """The GPUs the job would get on the node (what the scorers judge, before any CPU is chosen)."""
    view = candidate.view
    if request.exclusive:
        every = list(range(view.gpu_count))
        return pick_connected_gpus(every, len(every), gpu_affinity(view.nvlink, view.topo))
    usable = candidate.usable
    if 1 < count < len(usable):
        return pick_connected_gpus(usable, count, node_affinity(view)[0])
    # pick_connected_gpus' own answer without a choice to make (one GPU, or all of them), without the
    # node's affinity matrix (a cache lookup that hashes the whole matrix, per candidate scored).
    return tuple(usable[:count]) if count > 0 else ()


def _node_allocation(
    request: Request, candidate: Candidate, count: int, gpus: tuple[int, ...] | None = None
) -> NodeAllocation:
    """``gpus``: _node_gpus' answer for the same arguments, when already known."""
    view = candidate.view
    if gpus is None:
        gpus = _node_gpus(request, candidate, count)
    if request.exclusive:
        # The whole node (the NodeExclusive filter saw it idle): every GPU, CPU and MB, as Slurm's --exclusive.
        return NodeAllocation(node=view.name, gpus=gpus, cpus=tuple(sorted(candidate.free_cpus)), mem_mb=view.memory_mb)
    cpus = _choose_cpus(request, candidate, gpus)
    mem = mem_needed(request, len(gpus), view.memory_mb)
    if cpus or mem:
        return NodeAllocation(node=view.name, gpus=gpus, cpus=cpus, mem_mb=mem)
    return NodeAllocation(node=view.name, gpus=gpus)


# A source of candidates in best-fit order: called again when a job needs every candidate at once.
CandidateSource = Callable[[Request], Iterable[Candidate]]


class Graded:
    """Candidates in best-fit order that can start at the first with a given number of usable GPUs (a
    CandidateSource may return one): the one-node search passes over every candidate with fewer GPUs than
    the job wants on its node, so those need not be made at all.

    A plain class, not an ABC: every placement asks ``isinstance(candidates, Graded)``, which an ABC answers
    through ABCMeta.__instancecheck__ (~150 ns more a call, ~1% of a garrison replay)."""

    __slots__ = ()

    def from_usable(self, least: int) -> Iterator[Candidate]:
        """Every candidate with at least ``least`` usable GPUs, in the order iterating would give, and
        perhaps a few with fewer (a search still checks each)."""
        raise NotImplementedError


class BestFit(Graded):
    """Candidates in best-fit order (fewest usable GPUs first, ties in index order), each made on first use.
    A search that needs ``k`` usable GPUs on one node starts at the first candidate with ``k``
    (``from_usable``): those before it, which it would pass over, are never made (the backfill sweep's
    candidates, made for every ready node of the partition at each attempt, cost more than the search).
    Iterated again, it gives the same objects."""

    __slots__ = ("_entries", "_made", "_make")

    def __init__(self, entries: list[tuple[int, int, list[int], int]],
                 make: Callable[[int, list[int], int], Candidate]) -> None:
        """``entries``: (usable count, node index, usable GPUs, capable GPUs) per node, sorted (so by
        count, then index); ``make(index, usable, capable)`` the candidate of one."""
        self._entries = entries
        self._made: list[Candidate | None] = [None] * len(entries)
        self._make = make

    def __iter__(self) -> Iterator[Candidate]:
        return self.from_usable(0)

    def from_usable(self, least: int) -> Iterator[Candidate]:
        """The candidates with at least ``least`` usable GPUs, in order."""
        entries, made, make = self._entries, self._made, self._make
        # (least,) sorts before every entry of count ``least`` (a tuple's prefix sorts first) and after
        # those of fewer: the first entry with ``least`` usable GPUs or more, found comparing counts only.
        for at in range(bisect_left(entries, (least,)), len(entries)):
            candidate = made[at]
            if candidate is None:
                _, index, usable, capable = entries[at]
                candidate = made[at] = make(index, usable, capable)
            yield candidate


class Placer:
    def __init__(self, pipeline: Pipeline, score_limit: int = DEFAULT_SCORE_LIMIT) -> None:
        self.pipeline = pipeline
        self.score_limit = score_limit
        # Pipeline.check and Pipeline.score, spelt out below for the one-node search (it checks and scores
        # several candidates for every job a cycle tries to place): same filters, same arithmetic.
        self._filters = pipeline.filters
        self._scorers = tuple((s.weight, s) for s in pipeline.scorers)
        self._weight = sum(weight for weight, _ in self._scorers)
        self._ceilings = (self._ceiling(one_gpu=False), self._ceiling(one_gpu=True))  # by count < 2
        # GpuFree passes no node with fewer usable GPUs than the request's smallest share per node: with it
        # among the filters, a BestFit source's candidates below that need no check.
        self._gpu_free = any(isinstance(step, GpuFree) for step in self._filters)
        # The last request's filters that can fail a node for it (_steps): a request is placed against
        # several candidates, often more than once (a sweep's attempts, a spread after the one-node search).
        # One tuple, replaced whole: a placer shared by several callers never pairs one request's filters
        # with another request.
        self._last_steps: tuple[Request | None, tuple[Filter, ...]] = (None, ())
        self._steps_by_choices: dict[Choices, tuple[Filter, ...]] = {
            (x, c, w): tuple(step for step in self._filters if not _passes_every_node(step, (x, c, w)))
            for x, c, w in product((False, True), repeat=3)
        }

    def passing(self, request: Request, source: CandidateSource) -> list[Candidate]:
        candidates = source(request)
        if self._gpu_free and isinstance(candidates, Graded):
            candidates = candidates.from_usable(request.shape.min_gpus_per_node)
        steps = self._steps_for(request)
        return [c for c in candidates if self._passes(request, c, steps)]

    def _steps_for(self, request: Request) -> tuple[Filter, ...]:
        """The filters that can fail a node for ``request``: those that pass every node for it whatever the
        node (no -x, no -C, no -w that names every node it gets: most jobs) are left out, which the boolean
        of _passes does not notice (filters only answer, and every one must pass)."""
        last = self._last_steps
        if last[0] is request:
            return last[1]
        steps = self._steps_by_choices[_choices(request)]
        self._last_steps = (request, steps)
        return steps

    def _passes(self, request: Request, candidate: Candidate, steps: tuple[Filter, ...] | None = None) -> bool:
        """``pipeline.check(request, candidate).ok``; a filter that passes answers with the OK singleton, so
        most statuses need no look inside. ``steps``: ``_steps_for(request)``, when known."""
        for step in self._steps_for(request) if steps is None else steps:
            status = step.check(request, candidate)
            if status is not OK and not status.ok:
                return False
        return True

    def _score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        """``pipeline.score(request, candidate, gpus)``."""
        total = self._weight
        if total == 0:
            return 0
        value = 0
        for weight, scorer in self._scorers:
            value += weight * scorer.score(request, candidate, gpus)
        return value // total

    def place(self, request: Request, source: CandidateSource) -> Allocation | None:
        shape = request.shape
        if request.constraint_matching and len(request.constraint) > 1 and shape.node_count != 1:
            # -C [a|b] on a job that may take several nodes: all of them with a, or all with b, tried in the
            # order given (a one-node job's nodes share its alternative whatever it is: the plain OR below).
            for alternative in request.constraint:
                one = replace(request, constraint=(alternative,), constraint_matching=False)
                found = self.place(one, source)
                if found is not None:
                    return found
            return None
        if shape.node_count == 1 or (shape.node_count is None and shape.total_gpus > 0):
            count = shape.gpus_per_node if shape.gpus_per_node is not None else shape.total_gpus
            single = self._one_node(request, source, count)
            if single is not None or shape.node_count == 1:
                return single
            return self._spread(request, self.passing(request, source))
        passing = self.passing(request, source)
        assert shape.node_count is not None
        if len(passing) < shape.node_count:
            return None
        if shape.gpus_per_node is not None:
            needs = [shape.gpus_per_node] * shape.node_count
        else:
            base, extra = divmod(shape.total_gpus, shape.node_count)
            needs = [base + 1] * extra + [base] * (shape.node_count - extra)
        return self._fixed_nodes(request, passing, needs)

    def _one_node(self, request: Request, source: CandidateSource, count: int) -> Allocation | None:
        best: tuple[int, int, Candidate, tuple[int, ...]] | None = None
        scored = 0
        # hostable() is the usable count itself unless the job asks for CPUs or memory per GPU.
        per_gpu = request.cpus_per_gpu or (request.mem_per_gpu_mb and not request.mem_mb)
        # The highest score any node could get (None: no bound known). Once the best so far has it, a node
        # further on with a higher index cannot win (a tie goes to the lower index), so it is only counted
        # among the scored (which bounds the search), not scored: the answer is the same.
        ceiling = self._ceilings[count < 2]
        candidates = source(request)
        if isinstance(candidates, Graded):
            candidates = candidates.from_usable(count)  # the others are passed over just below
        steps = self._steps_for(request)
        for candidate in candidates:
            if (len(candidate.usable) < count or (per_gpu and hostable(request, candidate) < count)
                    or not self._passes(request, candidate, steps)):
                continue
            scored += 1
            if best is None or best[0] != ceiling or candidate.index < best[1]:
                gpus = _node_gpus(request, candidate, count)
                score = self._score(request, candidate, gpus)
                if best is None or (score, -candidate.index) > (best[0], -best[1]):
                    best = (score, candidate.index, candidate, gpus)
            if scored >= self.score_limit:
                break
        return Allocation((_node_allocation(request, best[2], count, best[3]),)) if best is not None else None

    def _ceiling(self, one_gpu: bool) -> int | None:
        """The highest score ``_score`` can give a node (one GPU of it, or several), where every scorer
        bounds its own: framework.Scorer's 0-100 is a convention; BinPack and NumaLocality keep to it, and
        GpuTopology does for one GPU (for several it compares with a greedy best set, which a set could beat
        on an unusual topology)."""
        if self._weight == 0:
            return 0
        for weight, scorer in self._scorers:
            if weight < 0 or not (isinstance(scorer, (BinPack, NumaLocality))
                                  or (one_gpu and isinstance(scorer, GpuTopology))):
                return None
        return 100 * self._weight // self._weight

    def _fixed_nodes(self, request: Request, passing: list[Candidate], needs: list[int]) -> Allocation | None:
        """``len(needs)`` nodes, the i-th largest need on a node that has it, inside the tightest
        topology group that can hold them all."""
        needs = sorted(needs, reverse=True)
        if request.nodelist:
            return self._with_listed(request, passing, needs)

        def pick(group: Sequence[Candidate]) -> list[tuple[Candidate, int]] | None:
            # Best-scored nodes first; each need (largest first) takes the best node that can hold it.
            ranked = sorted(group, key=lambda c: (-self._score(request, c, tuple(c.usable[: needs[-1]])),
                                                  c.index))
            chosen: list[tuple[Candidate, int]] = []
            taken: set[int] = set()
            for need in needs:
                found = next((c for c in ranked if c.index not in taken and hostable(request, c) >= need), None)
                if found is None:
                    return None
                taken.add(found.index)
                chosen.append((found, need))
            return chosen

        for group in _groups_tightest_first(passing, lambda g: len(g) >= len(needs)):
            chosen = pick(group)
            if chosen is not None:
                return Allocation(tuple(_node_allocation(request, c, n) for c, n in _in_node_list_order(chosen)))
        return None

    def _with_listed(self, request: Request, passing: list[Candidate], needs: list[int]) -> Allocation | None:
        """-w with -N larger than the list: every listed node, largest needs first, then the best-scored of
        the others (Slurm adds nodes to a -w list the same way); topology groups are not tried."""
        listed = sorted((c for c in passing if c.view.name in request.nodelist), key=lambda c: (-hostable(request, c),
                                                                                                c.index))
        if len(listed) < len(request.nodelist) or len(needs) < len(listed):
            return None
        chosen = list(zip(listed, needs, strict=False))
        if any(hostable(request, c) < need for c, need in chosen):
            return None
        others = sorted((c for c in passing if c.view.name not in request.nodelist),
                        key=lambda c: (-self._score(request, c, tuple(c.usable[: needs[-1]])), c.index))
        taken: set[int] = set()
        for need in needs[len(listed):]:
            found = next((c for c in others if c.index not in taken and hostable(request, c) >= need), None)
            if found is None:
                return None
            taken.add(found.index)
            chosen.append((found, need))
        return Allocation(tuple(_node_allocation(request, c, n) for c, n in _in_node_list_order(chosen)))

    def _spread(self, request: Request, passing: list[Candidate]) -> Allocation | None:
        """A total GPU count over as few nodes as possible, inside the tightest group that has them."""
        total = request.shape.total_gpus
        room = {c.index: hostable(request, c) for c in passing}
        for group in _groups_tightest_first(passing, lambda g: sum(room[c.index] for c in g) >= total):
            remaining = total
            chosen: list[tuple[Candidate, int]] = []
            for candidate in sorted(group, key=lambda c: (-room[c.index], c.index)):
                take = min(room[candidate.index], remaining)
                if take == 0:
                    break
                chosen.append((candidate, take))
                remaining -= take
                if remaining == 0:
                    break
            if remaining == 0:
                return Allocation(tuple(_node_allocation(request, c, n) for c, n in _in_node_list_order(chosen)))
        return None


Choices = tuple[bool, bool, bool]


def _in_node_list_order(chosen: list[tuple[Candidate, int]]) -> list[tuple[Candidate, int]]:
    """A gang's nodes in the order its node list (SLURM_JOB_NODELIST) names them, which is their rank order, as
    in Slurm: rank 0 and the batch script run on the list's first host, where scripts, submitit and
    Lightning take the head node from (``scontrol show hostnames $SLURM_JOB_NODELIST | head -n1``)."""
    if len(chosen) < 2:
        return chosen
    numbered = _numbered_alike(chosen)
    if numbered is not None:  # one prefix and padding (node1..node54): the list's order is the numbers'
        return [item for _, item in sorted(zip(numbered, chosen, strict=True), key=itemgetter(0))]
    position = {name: i for i, name in enumerate(expand_hostlist(compress_hostlist(c.view.name for c, _ in chosen)))}
    return sorted(chosen, key=lambda item: position[item[0].view.name])


def _numbered_alike(chosen: list[tuple[Candidate, int]]) -> list[int] | None:
    """The nodes' numbers where every name is one prefix and padding with a number (compress_hostlist's one
    group, listed in number order); None otherwise (the general rule then orders them)."""
    group: tuple[str, int] | None = None
    numbers = []
    for candidate, _ in chosen:
        split = trailing_number(candidate.view.name)
        if split is None:
            return None
        prefix, digits = split
        key = (prefix, len(digits) if digits.startswith("0") and len(digits) > 1 else 0)
        if group is None:
            group = key
        elif key != group:
            return None
        numbers.append(int(digits))
    return numbers


def _choices(request: Request) -> Choices:
    """Which of its own node choices a request made: -x, -C, and -w naming every node it gets."""
    return bool(request.exclude), bool(request.constraint), restricted_to_list(request)


def _passes_every_node(step: Filter, choices: Choices) -> bool:
    """Whether ``step`` answers OK on any node whatever for a request that made ``choices``: a filter of
    the job's own node choice (-x, -C, -w) when the job made none. Exact types: a subclass may check more."""
    kind = type(step)
    if kind is NodeNotExcluded:
        return not choices[0]  # nothing excluded
    if kind is NodeFeatures:
        return not choices[1]  # satisfies(): an empty expression matches every node
    if kind is NodeListed:
        return not choices[2]
    return False


def _groups_tightest_first(
    passing: Sequence[Candidate], enough: Callable[[Sequence[Candidate]], bool]
) -> Iterable[list[Candidate]]:
    """Topology groups that could hold the job, from the deepest level (a leaf switch) up to the whole
    cluster; at each level the group with the fewest free GPUs first (best fit among switches)."""
    depth = max((len(c.view.switches) for c in passing), default=0)
    for level in range(depth, -1, -1):
        groups: dict[tuple[str, ...], list[Candidate]] = defaultdict(list)
        for candidate in passing:
            groups[candidate.view.switches[:level]].append(candidate)
        fitting = [(sum(len(c.usable) for c in g), key, g) for key, g in groups.items() if enough(g)]
        for _, _, group in sorted(fitting, key=lambda t: (t[0], t[1])):
            yield group


def candidates_of(nodes: Sequence[NodeView], request: Request) -> list[Candidate]:
    """Candidates straight from node views, best fit first (for a handful of nodes: tests, validation)."""
    out = []
    for index, view in enumerate(nodes):
        match = matching_gpus(view, request.gpu_type, request.gpu_mem_mib)
        out.append(
            Candidate(
                index=index,
                view=view,
                usable=sorted(view.free_gpus & match),
                capable=len(match),
                free_cpus=view.free_cpus,
                free_memory_mb=view.free_memory_mb,
            )
        )
    return sorted(out, key=lambda c: (len(c.usable), c.index))


def place(spec: JobSpec, nodes: Sequence[NodeView], partition: str | None = None) -> Allocation | None:
    """Where ``spec`` fits on ``nodes`` as they are now (any partition unless one is named)."""
    views = [v if partition is not None else replace(v, partitions=frozenset({""})) for v in nodes]
    views.sort(key=lambda v: (v.switches, v.name))
    from garrison.controller.sched.pipeline import build_pipeline  # the pipeline wires placement in: no cycle

    request = request_for(0, spec, partition if partition is not None else "", 0.0)
    return Placer(build_pipeline()).place(request, lambda r: candidates_of(views, r))
