"""The one place where the scheduling steps are wired together, in order, with the reason for each position.

Filters run in order and stop at the first failure, so the order matters twice: cheap and selective checks
go first (most nodes are rejected in a few nanoseconds), and every check that can fail for good
(UNRESOLVABLE) runs before any check that fails only for now (UNSCHEDULABLE), so that the status a node
ends with tells preemption and the "why pending" reasons whether freeing GPUs could ever help.

The cycle itself is wired here too: GATES, then PHASES, for each job in QUEUE_ORDER (cycle.py runs them).

Scorers all run on every node that passed; their weighted sum (weights in the config) picks the node.
The registries let a configuration (or the simulator) name the steps it wants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.filters import (
    CpuMemoryFit,
    GpuCapacity,
    GpuFree,
    NodeExclusive,
    NodeFeatures,
    NodeListed,
    NodeNotExcluded,
    NodeReady,
    PartitionMember,
)
from garrison.controller.sched.framework import OK, Candidate, Filter, QueueOrder, Request, Scorer, Status
from garrison.controller.sched.phases.gates import gate
from garrison.controller.sched.phases.never_here import never_here
from garrison.controller.sched.phases.place_elsewhere import place_elsewhere
from garrison.controller.sched.phases.place_now import place_now
from garrison.controller.sched.phases.preempt import preempt_for
from garrison.controller.sched.phases.reserve import reserve_later
from garrison.controller.sched.priority import PriorityOrder
from garrison.controller.sched.scorers import BinPack, GpuTopology, NumaLocality

FILTERS: tuple[Filter, ...] = (
    # 1. Down or drained: the cheapest test, and such a node is out for every job.
    NodeReady(),
    # 2. Partition membership: a set lookup, and in a partitioned cluster most nodes fail here.
    PartitionMember(),
    # 2b. Nodes the job asked to stay off (gsub -x): a set lookup, usually in an empty set.
    NodeNotExcluded(),
    # 2c. The job's own node choice, -C features and -w names: set lookups that fail for good, and in a
    #     cluster of mixed nodes -C rejects many; both before any resource is counted.
    NodeFeatures(),
    NodeListed(),
    # 3. GPU type, GPU memory and GPU count of the node itself, busy or not: fails for good.
    GpuCapacity(),
    # 4. CPUs and host memory: checks the node's totals (for good) before what is free (for now).
    CpuMemoryFit(),
    # 4b. --exclusive: the node must be idle for such a job, and a node it holds takes no other job. Depends
    #     on what runs (fails only for now), so after every check that fails for good.
    NodeExclusive(),
    # 5. Free GPUs for the whole run: the only step that depends on the moment (now, or a reservation's
    #    start) and on other jobs' reservations, so it goes last.
    GpuFree(),
)

# The phases of a cycle (phases/), for each job of the queue in order: first the gates (held, dependency,
# begin time, partition/QoS rules, singleton, array limit, quota, bounded work), which need no placement;
# then each phase until one decides (returns True):
GATES = gate
PHASES: tuple[Callable[[CycleState, Candidacy], bool], ...] = (
    # 1. Start now if the whole gang fits, respecting reservations ahead (Filter, Score, Bind).
    place_now,
    # 1b. A job that names several partitions (-p a,b): start it now in the next one that can run it.
    place_elsewhere,
    # 2. Can never run on the up nodes (the filters' UNRESOLVABLE on the idle cluster): say so, hold no one.
    never_here,
    # 3. PostFilter: make room by preempting lower QoS, when enabled.
    preempt_for,
    # 4. Reserve its earliest start (backfill), or, without backfill, hold back its partition.
    reserve_later,
)

# The queue is walked once per cycle in this order; jobs are placed in it, so it is also the order in which
# they claim reservations.
QUEUE_ORDER: QueueOrder = PriorityOrder()

SCORER_TYPES: Mapping[str, type[BinPack] | type[GpuTopology] | type[NumaLocality]] = {
    "BinPack": BinPack,  # pack small jobs tight so whole nodes stay free for gangs (weighted highest)
    "GpuTopology": GpuTopology,  # then the best-connected GPU set
    "NumaLocality": NumaLocality,  # then CPUs next to the GPUs
}

DEFAULT_SCORER_WEIGHTS: tuple[tuple[str, int], ...] = (("BinPack", 3), ("GpuTopology", 2), ("NumaLocality", 1))


@dataclass(frozen=True)
class Pipeline:
    filters: tuple[Filter, ...]
    scorers: tuple[Scorer, ...]

    def check(self, request: Request, candidate: Candidate) -> Status:
        for step in self.filters:
            status = step.check(request, candidate)
            if not status.ok:
                return status
        return OK

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        total = sum(s.weight for s in self.scorers)
        if total == 0:
            return 0
        return sum(s.weight * s.score(request, candidate, gpus) for s in self.scorers) // total


def build_pipeline(scorer_weights: Sequence[tuple[str, int]] = DEFAULT_SCORER_WEIGHTS) -> Pipeline:
    """The filters above, and the named scorers with their weights (a weight of 0 leaves a scorer out)."""
    scorers: list[Scorer] = []
    for name, weight in scorer_weights:
        kind = SCORER_TYPES.get(name)
        if kind is None:
            raise ValueError(f"unknown scorer {name!r} (known: {', '.join(SCORER_TYPES)})")
        if weight > 0:
            scorers.append(kind(weight))
    return Pipeline(FILTERS, tuple(scorers))
