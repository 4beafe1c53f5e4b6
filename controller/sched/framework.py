"""The scheduling framework's vocabulary: status codes, the resolved request, and the small step protocols.

Modelled on the Kubernetes scheduling framework (kube-scheduler framework/interface.go): a node either
passes a filter (OK), fails it for now (UNSCHEDULABLE: GPUs busy, which jobs ending or preemption could
change) or fails it for good as things stand (UNRESOLVABLE: wrong partition, drained, too few GPUs of the
type even when idle; preemption cannot help). Each step has one method and one job:

- ``Filter.check(request, candidate) -> Status`` says whether a node can take the request;
- ``Scorer.score(request, candidate, gpus) -> 0..100`` ranks the nodes that passed, for the GPUs chosen;
- ``QueueOrder.key(job, priority)`` orders the pending queue.

Unlike Kubernetes, which places pods one at a time, the unit here is the whole job: placement (placement.py)
runs the filters on every candidate node of a gang and picks all of its nodes in one decision. The steps
are wired together in one place, pipeline.py.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Protocol

from garrison.controller.sched.snapshot import NodeView


class Code(enum.IntEnum):
    OK = 0
    UNSCHEDULABLE = 1  # not now: resources are in use (waiting, or preemption, could help)
    UNRESOLVABLE = 2  # not on this node whatever ends or is preempted


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code == Code.OK


OK = Status(Code.OK)


def unschedulable(reason: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reason)


def unresolvable(reason: str) -> Status:
    return Status(Code.UNRESOLVABLE, reason)


@dataclass(frozen=True, slots=True)
class GangShape:
    """How many nodes and how many GPUs on each, once the request is resolved against the cluster."""

    node_count: int | None  # None: the scheduler chooses the spread
    gpus_per_node: int | None  # None with node_count None: a total to spread
    total_gpus: int

    @property
    def min_gpus_per_node(self) -> int:
        """The fewest GPUs any node of the gang holds (a node with fewer is no candidate)."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        if self.node_count is not None:
            return self.total_gpus // self.node_count
        return 1 if self.total_gpus else 0


@dataclass(frozen=True, slots=True)
class Request:
    """What a pending job needs, resolved once per cycle: the input of every filter and scorer."""

    job_id: int
    shape: GangShape
    partition: str
    gpu_type: str | None = None
    gpu_mem_mib: int = 0  # the least memory each GPU must have
    cpus_per_gpu: int = 0
    cpus_per_node: int = 0  # for a job without GPUs
    mem_mb: int = 0  # host memory per node
    mem_per_gpu_mb: int = 0  # host memory per allocated GPU (--mem-per-gpu), when mem_mb is 0
    mem_whole_node: bool = False  # --mem=0: all of each node's memory, so none of it may be held by others
    duration_s: float = 0.0  # the job's time limit: how long it holds what it gets
    exclude: frozenset[str] = frozenset()  # nodes the job must not run on (gsub -x)
    # Node selection: -C as alternatives of feature sets (garrison.model.features), -w, --exclusive
    constraint: tuple[frozenset[str], ...] = ()  # () : any node
    constraint_matching: bool = False  # -C [a|b]: every node of the job has the same alternative
    nodelist: frozenset[str] = frozenset()  # nodes the job must include
    exclusive: bool = False  # whole idle nodes only, and the job takes all of each


# What a placement answer does not depend on: which job asks (its id) and for how long (an answer is kept
# per end time beside the key: cycle_state.Memo). Every other field of Request is in ``placement_key``, derived
# from the dataclass itself, so a field added to Request later is in the key without anyone remembering to
# put it there (a job must never be taken for a look-alike of one that differs in what placement reads).
NOT_IN_PLACEMENT_KEY = frozenset({"job_id", "duration_s"})
PLACEMENT_KEY_FIELDS = tuple(f.name for f in fields(Request) if f.name not in NOT_IN_PLACEMENT_KEY)
_placement_key = attrgetter(*PLACEMENT_KEY_FIELDS)


def placement_key(request: Request) -> tuple[object, ...]:
    """Everything about a request that placement, the filters and the scorers look at: two requests with
    equal keys fit (or not) on the same nodes at the same moment for the same end time."""
    key: tuple[object, ...] = _placement_key(request)
    return key


@dataclass(slots=True)
class Candidate:
    """What one node can offer one request at one moment (now, or a future time for a reservation)."""

    index: int  # the node's position in the cycle's node order
    view: NodeView
    usable: list[int]  # GPU indices free for the request's whole run, of its type and memory, ascending
    capable: int  # GPUs of the request's type and memory on the node, busy or not
    free_cpus: frozenset[int]
    free_memory_mb: int
    idle: bool = True  # no job holds anything on the node now (what an --exclusive job needs)
    held_exclusively: bool = False  # an --exclusive job holds the node: no other job may join it


class Filter(Protocol):
    name: str
    # What a filter reads beyond the node's static description (feasibility.py groups nodes by that):
    reads_node_name: bool  # its answer depends on the node's name (-x, -w): asked node by node
    about_node_state: bool  # it answers "is the node up?": feasibility asks that per level instead

    def check(self, request: Request, candidate: Candidate) -> Status:
        """OK if the node can hold its share of the request; otherwise why not, and whether waiting or
        preemption could change that (UNSCHEDULABLE) or not (UNRESOLVABLE). Must not look at other nodes."""
        ...


class Scorer(Protocol):
    name: str
    weight: int

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        """0 (worst) to 100 (best) for giving ``gpus`` of this node to the request. Called only on nodes
        that passed every filter; must not look at other nodes."""
        ...


class QueueOrder(Protocol):
    name: str

    def key(self, job_id: int, submit_time: float, priority: int) -> tuple[float, ...]:
        """Sort key: the pending queue runs in ascending key order. Must be a total order (end with the
        job id) so that equal inputs give equal plans."""
        ...

    def keys(
        self, job_ids: Iterable[int], submit_times: Iterable[float], priorities: Iterable[int]
    ) -> list[tuple[float, ...]]:
        """``key`` of many jobs at once (the three iterables in step), for pricing a whole queue."""
        ...
