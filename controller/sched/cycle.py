"""One scheduling cycle: ``schedule(snapshot, now, config) -> Plan``.

Pure: no I/O, no clock of its own, no randomness. The controller applies the plan after re-checking it
against its current state (a plan computed on a snapshot may be stale), the simulator applies it to its
virtual cluster. Every pending job that does not start gets a reason, so users can see why it waits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from garrison.controller.domain import Allocation
from garrison.controller.sched.placement import place
from garrison.controller.sched.snapshot import NodeView, PendingJob, Snapshot


class Reason:
    """Why a pending job waits (the strings users see in gqueue's NODES(REASON) column)."""

    RESOURCES = "Resources"  # not enough free GPUs right now
    PRIORITY = "Priority"  # a higher-priority job in the same partition waits for resources first
    HELD = "Held"
    ARRAY_LIMIT = "JobArrayTaskLimit"
    NODES_UNAVAILABLE = "NodesUnavailable"  # no up node in the partition could ever run it


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_starts_per_cycle: int = 10_000


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    waiting: dict[int, str] = field(default_factory=dict)  # job id -> reason


def queue_order(job: PendingJob) -> tuple[int, float, int]:
    """Highest priority first, then oldest, then lowest id (a total order, so plans are deterministic)."""
    return (-job.priority, job.submit_time, job.job_id)


def _could_ever_fit(job: PendingJob, nodes: list[NodeView]) -> bool:
    """Whether the partition's up nodes could hold the job if they were all idle."""
    idle = [replace(n, free_gpus=frozenset(range(n.gpu_count))) for n in nodes]
    return place(job.spec, idle) is not None


def schedule(snapshot: Snapshot, now: float, config: SchedulerConfig | None = None) -> Plan:
    """Start what fits, in queue order; a blocked job blocks lower-priority jobs in its partition."""
    del now  # first-fit needs no clock; age-based priority and backfill (the scheduling issue) will
    config = config or SchedulerConfig()
    free: dict[str, frozenset[int]] = {n.name: n.free_gpus for n in snapshot.nodes}
    running_tasks = Counter(dict(snapshot.running_array_tasks))
    blocked_partitions: set[str] = set()
    starts: list[Start] = []
    waiting: dict[int, str] = {}

    for job in sorted(snapshot.pending, key=queue_order):
        if job.held:
            waiting[job.job_id] = Reason.HELD
            continue
        limit = job.spec.array_max_running
        if job.array_job_id is not None and limit is not None and running_tasks[job.array_job_id] >= limit:
            waiting[job.job_id] = Reason.ARRAY_LIMIT
            continue
        if job.partition in blocked_partitions or len(starts) >= config.max_starts_per_cycle:
            waiting[job.job_id] = Reason.PRIORITY
            continue
        eligible = [
            replace(n, free_gpus=free[n.name])
            for n in snapshot.nodes
            if n.schedulable and not n.drained and job.partition in n.partitions
        ]
        allocation = place(job.spec, eligible)
        if allocation is None:
            if _could_ever_fit(job, eligible):
                waiting[job.job_id] = Reason.RESOURCES
                blocked_partitions.add(job.partition)
            else:
                # Nothing up could run it now even on idle nodes (nodes down or drained): do not let it
                # hold back jobs that can run.
                waiting[job.job_id] = Reason.NODES_UNAVAILABLE
            continue
        for node_alloc in allocation.nodes:
            free[node_alloc.node] = free[node_alloc.node] - set(node_alloc.gpus)
        if job.array_job_id is not None:
            running_tasks[job.array_job_id] += 1
        starts.append(Start(job.job_id, allocation))
    return Plan(starts=tuple(starts), waiting=waiting)
