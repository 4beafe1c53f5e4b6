"""What a scheduling cycle decides: the Plan, its starts, and why each other pending job waits.

Kept apart from cycle.py so that the cycle's phases (phases/) and everything that reads a plan (the ledger,
the engine, gsim) share these types without importing the cycle itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from garrison.controller.sched.backfill import Reservation
from garrison.controller.sched.preemption import Preempt
from garrison.controller.sched.priority import PriorityContext
from garrison.model.domain import Allocation

__all__ = ["Plan", "Preempt", "Reason", "Reservation", "Start"]


class Reason:
    """Why a pending job waits (the strings users see in gqueue's NODES(REASON) column)."""

    RESOURCES = "Resources"  # the highest-priority blocked job(s): waiting for GPUs to come free
    PRIORITY = "Priority"  # higher-priority jobs wait for resources first
    HELD = "Held"
    BEGIN_TIME = "BeginTime"  # gsub --begin: not before its begin time
    DEPENDENCY = "Dependency"  # its -d dependency does not hold yet
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"  # and never will: its owner should cancel it
    ARRAY_LIMIT = "JobArrayTaskLimit"
    NODES_UNAVAILABLE = "NodesUnavailable"  # no up node in the partition could ever run it
    NODES_DRAINED = "NodesDrained"  # it could run only on drained nodes
    PARTITION_TIME_LIMIT = "PartitionTimeLimit"
    PARTITION_INVALID = "PartitionInvalid"  # the partition was deleted
    ACCOUNT_NOT_ALLOWED = "AccountNotAllowed"  # the partition no longer admits the job's account
    QOS_NOT_ALLOWED = "QOSNotAllowed"
    QOS_TIME_LIMIT = "QOSMaxWallDurationPerJobLimit"
    PREEMPTING = "WaitingForPreemption"  # victims are being stopped to make room

    @staticmethod
    def reserved_for(job_id: int) -> str:
        """It would fit now, but only on GPUs reserved for higher-priority job ``job_id``."""
        return f"ReservedForJob({job_id})"


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    allocation: Allocation
    # The partition it starts in, for a job that names several (sbatch -p a,b); None: the job's only one.
    partition: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    waiting: dict[int, str] = field(default_factory=dict)  # job id -> reason
    order: tuple[int, ...] = ()  # every pending job, in queue order (position = index + 1)
    priorities: dict[int, int] = field(default_factory=dict)  # job id -> priority this cycle
    estimated_starts: dict[int, float] = field(default_factory=dict)  # starts (now) and reservations
    reservations: tuple[Reservation, ...] = ()
    preempts: tuple[Preempt, ...] = ()  # only when the config enables preemption
    blocked_by: dict[int, int] = field(default_factory=dict)  # job id -> the job whose reservation is in its way
    # The earliest moment at which the clock alone would change this plan (a begin time a job waits for);
    # None: nothing but a change of the state or the slow drift of priorities would (controller/cycles.py).
    wake_at: float | None = None
    # What its priorities were computed as of (the moment, usage and fair-share factors): the next snapshot's
    # ``pricing``, and the factors gqueue --priority shows. None: a plan not made by ``schedule``.
    pricing: PriorityContext | None = field(default=None, compare=False)
    # When its priorities are due to be recomputed (SchedulerConfig.priority_interval_s; None: every cycle):
    # the clock alone changes the plan then too (controller/cycles.py).
    reprice_at: float | None = None
