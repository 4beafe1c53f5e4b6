"""The one mutable object of a scheduling cycle, shared by its phases (phases/, wired in pipeline.py).

Like the Kubernetes framework's CycleState: built once per cycle from the snapshot, read and changed by each
phase in turn for each job, and turned into the Plan at the end. Nothing outside the cycle sees it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from garrison.controller.sched.backfill import Reservation, Timeline
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.feasibility import IdleCluster
from garrison.controller.sched.framework import Request
from garrison.controller.sched.placement import Placer
from garrison.controller.sched.plan import Preempt, Start
from garrison.controller.sched.quota import QuotaTally
from garrison.controller.sched.snapshot import FALLBACK_TIME_LIMIT_S, PendingJob, Snapshot
from garrison.model.accounts import PartitionDef
from garrison.model.domain import Allocation

if TYPE_CHECKING:
    from garrison.controller.sched.cycle import SchedulerConfig


def time_limit_of(job: PendingJob, partition: PartitionDef | None) -> int:
    if job.time_limit_s is not None:
        return job.time_limit_s
    if job.spec.time_limit_s is not None:
        return job.spec.time_limit_s
    return partition.default_time_s if partition is not None else FALLBACK_TIME_LIMIT_S


class Memo:
    """Answers that hold until the capacity next changes (a start or a reservation).

    A request that did not fit for a run ending at E does not fit for any run ending at E or later (a later
    end can use fewer reserved GPUs), so in a deep queue of look-alike jobs only the first of each request
    key (framework.placement_key: every field placement reads) pays for a placement until something changes.
    """

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.version = -1
        self.failed_end: dict[tuple[object, ...], float] = {}
        self.blocked: dict[tuple[object, ...], tuple[str, int | None]] = {}

    def sync(self) -> None:
        if self.version != self.capacity.version:
            self.version = self.capacity.version
            self.failed_end.clear()
            self.blocked.clear()

    def known_not_to_fit(self, key: tuple[object, ...], end: float) -> bool:
        self.sync()
        failed = self.failed_end.get(key)
        return failed is not None and end >= failed

    def did_not_fit(self, key: tuple[object, ...], end: float) -> None:
        self.sync()
        self.failed_end[key] = min(end, self.failed_end.get(key, end))


@dataclass(slots=True)
class Candidacy:
    """A job that passed the gates: what placement, preemption and reservation work on."""

    job: PendingJob
    limit: int  # its time limit this cycle
    request: Request
    key: tuple[object, ...]  # framework.placement_key(request)
    end: float  # now + limit: until when it would hold what it gets if it started now


@dataclass(slots=True)
class CycleState:
    snapshot: Snapshot
    now: float
    config: SchedulerConfig
    placer: Placer
    capacity: Capacity
    idle: IdleCluster
    memo: Memo
    quotas: QuotaTally
    default_qos: str
    array_running: Counter[int]
    partitions: Mapping[str, PartitionDef]
    singletons_started: set[tuple[str, str]] = field(default_factory=set)  # -d singleton: one per cycle
    # dependency_wait's answers this cycle, by the typed dependencies' identity (the object is kept, so its id is
    # not reused): the controller gives every task of an array one object, and 50,000 dependent tasks were
    # decided one by one (~60 ms of a cycle).
    dependency_waits: dict[int, tuple[object, str | None]] = field(default_factory=dict)
    starts: list[Start] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)
    blocked_by: dict[int, int] = field(default_factory=dict)  # job -> the job whose reservation is in its way
    estimated: dict[int, float] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    # Of those, the ones made for overdue jobs beyond config.reservations (SchedulerConfig.reserve_every_overdue)
    overdue_reservations: int = 0
    preempts: list[Preempt] = field(default_factory=list)
    victims_taken: set[tuple[int, int]] = field(default_factory=set)
    preempting_jobs: int = 0
    blocked_partitions: set[str] = field(default_factory=set)  # without backfill: a blocked job holds these
    failed: int = 0  # jobs that failed placement this cycle (bounded by config.max_job_test)
    timeline: Timeline | None = None  # built when the first reservation is planned
    started_now: list[tuple[Allocation, float]] = field(default_factory=list)  # before the timeline exists
    preempted_for: list[tuple[Allocation, float]] = field(default_factory=list)
    overdue_after: float | None = None  # a job pending longer than this is overdue (priority.py); None: no bound
    wake_at: float | None = None  # the earliest begin time or after:JOB+MIN delay a job waits for (Plan.wake_at)
    # (placement key, victims allowed) -> the earliest end of a run that found no victims (phases/preempt.py)
    no_victims: dict[tuple[object, ...], float] = field(default_factory=dict)
    priced_at: float = 0.0  # the moment the queue was priced as of (PriorityContext.now)

    def hold_on_timeline(self, allocation: Allocation, until: float, *, started: bool) -> None:
        """Record what a start (or a preemption's beneficiary) holds until ``until``, for later reservations."""
        if self.timeline is not None:
            self.timeline.hold(allocation, until)
        elif started:
            self.started_now.append((allocation, until))
        else:
            self.preempted_for.append((allocation, until))

    def ensure_timeline(self) -> Timeline:
        if self.timeline is None:
            self.timeline = Timeline(self.capacity, self.snapshot.running, self.now)
            for held, until in self.started_now:
                self.timeline.started(held, until)
            for held, until in self.preempted_for:
                self.timeline.hold(held, until)
        return self.timeline
