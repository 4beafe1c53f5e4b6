"""One scheduling cycle: ``schedule(snapshot, now, config) -> Plan``.

Pure: no I/O, no clock of its own, no randomness. The controller applies the plan after re-checking it
against its current state (a plan computed on a snapshot may be stale); the simulator applies it to its
virtual cluster. Every pending job that does not start gets a reason, so users can see why it waits.

The cycle walks the queue once, in priority order (priority.py), and for each job:

1. cheap checks that need no placement: held, partition and QoS rules, array limits, quotas (quota.py).
   A job stopped here does not hold back the jobs behind it;
2. bounded work: once ``max_job_test`` jobs have failed to place, the rest wait with reason Priority
   (a deep queue costs a dict lookup per job, not a placement);
3. start now if the whole gang fits (placement.py), never on GPUs reserved for a higher-priority job
   unless it ends before that reservation starts (the backfill rule);
4. otherwise, if it can never run on the nodes that are up, say why and move on;
5. otherwise, with preemption enabled and a QoS that may preempt, pick victims (preemption.py);
6. otherwise, while reservations remain, reserve the earliest time and GPUs it could have (backfill.py);
   without backfill the first blocked job holds back its whole partition (strict FIFO).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial

from garrison.controller.sched.backfill import Reservation, Timeline
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.filters.node_selection import restricted_to_list
from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.pipeline import DEFAULT_SCORER_WEIGHTS, QUEUE_ORDER, Pipeline, build_pipeline
from garrison.controller.sched.placement import DEFAULT_SCORE_LIMIT, Placer, candidates_of, request_for
from garrison.controller.sched.preemption import Preempt, memory_room_after, select_victims
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityContext, PriorityWeights
from garrison.controller.sched.quota import QuotaTally
from garrison.controller.sched.snapshot import (
    FALLBACK_TIME_LIMIT_S,
    NodeView,
    PendingJob,
    RunningJob,
    Snapshot,
)
from garrison.model.accounts import Accounting, PartitionDef
from garrison.model.domain import Allocation
from garrison.model.features import satisfies

__all__ = ["Plan", "Preempt", "Reason", "Reservation", "SchedulerConfig", "Start", "schedule"]


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
class SchedulerConfig:
    """Every tunable of the policy, named and validated (ValueError names the bad one).

    ``SchedulerConfig()`` on its own is plain strict priority order with no backfill (what the core did
    before it had a policy, so existing callers keep their behaviour); the named policies, the daemon's
    default ``garrison`` among them, come from presets.policy_presets().
    """

    weights: PriorityWeights = field(default_factory=lambda: NO_WEIGHTS)
    backfill: bool = False
    reservations: int = 8  # blocked jobs that get a reservation per cycle (1 = EASY backfill)
    max_job_test: int = 500  # jobs per cycle that may fail placement before the rest just wait
    window_s: float = 2 * 86400  # how far ahead reservations look
    resolution_s: float = 60.0  # reservation start times are rounded up to this
    max_starts_per_cycle: int = 10_000
    preemption: bool = False  # off: the plan never asks for a preemption
    max_preemptions_per_cycle: int = 4  # jobs that may trigger preemption in one cycle
    scorer_weights: tuple[tuple[str, int], ...] = DEFAULT_SCORER_WEIGHTS
    score_limit: int = DEFAULT_SCORE_LIMIT  # passing nodes scored for a one-node job

    def __post_init__(self) -> None:
        for name in ("reservations", "max_job_test", "max_starts_per_cycle", "max_preemptions_per_cycle"):
            if getattr(self, name) < 0:
                raise ValueError(f"scheduler setting {name} must not be negative")
        if self.score_limit < 1:
            raise ValueError("scheduler setting score_limit must be at least 1")
        if self.window_s <= 0:
            raise ValueError("scheduler setting window_s must be positive")
        if self.resolution_s < 0:
            raise ValueError("scheduler setting resolution_s must not be negative")
        _pipeline(self.scorer_weights)  # unknown scorer names fail here, not in the first cycle


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    allocation: Allocation


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[Start, ...] = ()
    waiting: dict[int, str] = field(default_factory=dict)  # job id -> reason
    order: tuple[int, ...] = ()  # every pending job, in queue order (position = index + 1)
    priorities: dict[int, int] = field(default_factory=dict)  # job id -> priority this cycle
    estimated_starts: dict[int, float] = field(default_factory=dict)  # starts (now) and reservations
    reservations: tuple[Reservation, ...] = ()
    preempts: tuple[Preempt, ...] = ()  # only when the config enables preemption


@lru_cache(maxsize=16)
def _pipeline(scorer_weights: tuple[tuple[str, int], ...]) -> Pipeline:
    return build_pipeline(scorer_weights)


def time_limit_of(job: PendingJob, partition: PartitionDef | None) -> int:
    if job.time_limit_s is not None:
        return job.time_limit_s
    if job.spec.time_limit_s is not None:
        return job.spec.time_limit_s
    return partition.default_time_s if partition is not None else FALLBACK_TIME_LIMIT_S


class _IdleFit:
    """Could a request ever run in its partition, with every up (or every drained) node idle? Answered from
    counts (GPUs, CPUs per GPU, memory) unless it asks for a GPU type or GPU memory, by a real placement on
    the nodes made idle otherwise; cached per request shape."""

    def __init__(self, nodes: Sequence[NodeView], placer: Placer) -> None:
        self.nodes = nodes
        self.placer = placer
        self.cache: dict[tuple[object, ...], str | None] = {}
        self.idle_views: dict[tuple[str, ...], list[NodeView]] = {}  # the nodes as if idle, per node set

    def reason(self, request: Request) -> str | None:
        """None if it fits on idle up nodes; else NodesDrained or NodesUnavailable."""
        key = _signature(request)
        if key not in self.cache:
            listed_only = restricted_to_list(request)
            members = [
                n for n in self.nodes
                if request.partition in n.partitions and n.name not in request.exclude
                and satisfies(n.features, request.constraint) and (not listed_only or n.name in request.nodelist)
            ]
            up = [n for n in members if n.schedulable and not n.drained]
            if self._fits(request, up):
                self.cache[key] = None
            elif self._fits(request, [n for n in members if n.schedulable]):
                self.cache[key] = Reason.NODES_DRAINED
            else:
                self.cache[key] = Reason.NODES_UNAVAILABLE
        return self.cache[key]

    def _fits(self, request: Request, nodes: list[NodeView]) -> bool:
        shape = request.shape
        if not nodes:
            return False
        if request.gpu_type is None and not request.gpu_mem_mib and shape.min_gpus_per_node >= 1:
            # Counts answer it: how many of the job's GPUs each idle node could take, given its CPUs and memory.
            rooms = [
                0 if request.mem_mb > n.memory_mb
                else min(n.gpu_count, n.cpus // request.cpus_per_gpu if request.cpus_per_gpu else n.gpu_count,
                         n.memory_mb // request.mem_per_gpu_mb if request.mem_per_gpu_mb else n.gpu_count)
                for n in nodes
            ]
            if shape.node_count is None:
                return sum(rooms) >= shape.total_gpus
            per_node = -(-shape.total_gpus // shape.node_count) if shape.gpus_per_node is None else shape.gpus_per_node
            big = sum(1 for r in rooms if r >= shape.min_gpus_per_node)
            return big >= shape.node_count and sum(1 for r in rooms if r >= per_node) >= (
                shape.node_count if shape.gpus_per_node is not None else shape.total_gpus % shape.node_count
            )
        key = tuple(n.name for n in nodes)
        idle = self.idle_views.get(key)
        if idle is None:
            idle = [
                replace(n, schedulable=True, drained=False, free_gpus=frozenset(range(n.gpu_count)),
                        free_cpus=frozenset(range(n.cpus)), free_memory_mb=n.memory_mb, idle=True,
                        held_exclusively=False)
                for n in nodes
            ]
            idle.sort(key=lambda v: (v.switches, v.name))
            self.idle_views[key] = idle
        return self.placer.place(request, lambda r: candidates_of(idle, r)) is not None


def _signature(request: Request) -> tuple[object, ...]:
    """Everything about a request that placement looks at, except its duration and its job id."""
    return (request.partition, request.shape, request.gpu_type, request.gpu_mem_mib, request.cpus_per_gpu,
            request.cpus_per_node, request.mem_mb, request.mem_per_gpu_mb, request.mem_whole_node,
            request.exclude, request.constraint, request.nodelist, request.exclusive)


class _Memo:
    """Answers that hold until the capacity next changes (a start or a reservation).

    A request shape that did not fit for a run ending at E does not fit for any run ending at E or later
    (a later end can use fewer reserved GPUs), so in a deep queue of look-alike jobs only the first of each
    shape pays for a placement until something changes.
    """

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self.version = -1
        self.failed_end: dict[tuple[object, ...], float] = {}
        self.blocked: dict[tuple[object, ...], str] = {}

    def _sync(self) -> None:
        if self.version != self.capacity.version:
            self.version = self.capacity.version
            self.failed_end.clear()
            self.blocked.clear()

    def known_not_to_fit(self, key: tuple[object, ...], end: float) -> bool:
        self._sync()
        failed = self.failed_end.get(key)
        return failed is not None and end >= failed

    def did_not_fit(self, key: tuple[object, ...], end: float) -> None:
        self._sync()
        self.failed_end[key] = min(end, self.failed_end.get(key, end))


def _static_reason(
    job: PendingJob, accounting: Accounting, partition: PartitionDef | None, limit: int, default_qos: str
) -> str | None:
    """Reasons that need no placement: the job is held or breaks a partition or QoS rule."""
    if job.held:
        return Reason.HELD
    if job.dependency_reason:
        return job.dependency_reason
    if accounting.partitions:
        if partition is None:
            return Reason.PARTITION_INVALID
        if limit > partition.max_time_s:
            return Reason.PARTITION_TIME_LIMIT
        if partition.allowed_accounts and not accounting.partition_allows_account(partition, job.account_name):
            return Reason.ACCOUNT_NOT_ALLOWED
    qos_name = job.qos_name or default_qos
    if partition is not None and partition.allowed_qos and qos_name not in partition.allowed_qos:
        return Reason.QOS_NOT_ALLOWED
    qos = accounting.qos_map.get(qos_name)
    if qos is not None and qos.max_time_s is not None and limit > qos.max_time_s:
        return Reason.QOS_TIME_LIMIT
    return None


def schedule(snapshot: Snapshot, now: float, config: SchedulerConfig | None = None) -> Plan:
    config = config or SchedulerConfig()
    accounting = snapshot.accounting
    default_qos = accounting.default_qos
    placer = Placer(_pipeline(config.scorer_weights), config.score_limit)
    capacity = Capacity(snapshot.nodes)
    idle_fit = _IdleFit(capacity.views, placer)
    memo = _Memo(capacity)
    pricing = PriorityContext(snapshot, now, config.weights)
    quotas = QuotaTally(accounting, snapshot.running, snapshot.usage, now, default_qos)
    array_running = Counter(dict(snapshot.running_array_tasks))
    singletons_started: set[tuple[str, str]] = set()  # -d singleton: one of a user's namesakes per cycle
    for running in snapshot.running:
        if running.array_job_id is not None:
            array_running[running.array_job_id] += 1

    priorities = pricing.priorities(snapshot.pending)
    queue = sorted(snapshot.pending, key=lambda j: QUEUE_ORDER.key(j.job_id, j.submit_time, priorities[j.job_id]))

    starts: list[Start] = []
    waiting: dict[int, str] = {}
    estimated: dict[int, float] = {}
    reservations: list[Reservation] = []
    preempts: list[Preempt] = []
    victims_taken: set[tuple[int, int]] = set()
    preempting_jobs = 0
    blocked_partitions: set[str] = set()
    failed = 0
    timeline: Timeline | None = None
    started_now: list[tuple[Allocation, float]] = []
    preempted_for: list[tuple[Allocation, float]] = []
    partitions = accounting.partition_map

    for job in queue:
        partition = partitions.get(job.partition)
        limit = time_limit_of(job, partition)
        static = _static_reason(job, accounting, partition, limit, default_qos)
        if static is None and job.spec.begin_time is not None and job.spec.begin_time > now:
            static = Reason.BEGIN_TIME
        if static is not None:
            waiting[job.job_id] = static
            continue
        if job.singleton_key is not None and job.singleton_key in singletons_started:
            waiting[job.job_id] = Reason.DEPENDENCY
            continue
        array_limit = job.spec.array_max_running
        if job.array_job_id is not None and array_limit is not None and array_running[job.array_job_id] >= array_limit:
            waiting[job.job_id] = Reason.ARRAY_LIMIT
            continue
        gpus = job.spec.total_gpus()
        quota = quotas.blocked_by(job, gpus, limit)
        if quota is not None:
            waiting[job.job_id] = quota
            continue
        if (not config.backfill and job.partition in blocked_partitions) or failed >= config.max_job_test or (
            len(starts) >= config.max_starts_per_cycle
        ):
            waiting[job.job_id] = Reason.PRIORITY
            continue

        request = request_for(job.job_id, job.spec, job.partition, limit)
        signature = _signature(request)
        end = now + limit
        allocation = None
        if capacity.might_fit(request) and not memo.known_not_to_fit(signature, end):
            allocation = placer.place(request, partial(_stream, capacity, end_time=end))
            if allocation is None:
                memo.did_not_fit(signature, end)
        if allocation is not None:
            starts.append(Start(job.job_id, allocation))
            estimated[job.job_id] = now
            capacity.take(allocation, end, exclusive=request.exclusive)
            quotas.started(job, gpus, limit)
            if job.array_job_id is not None:
                array_running[job.array_job_id] += 1
            if job.singleton_key is not None:
                singletons_started.add(job.singleton_key)
            if timeline is not None:
                timeline.hold(allocation, end)
            else:
                started_now.append((allocation, end))
            continue

        failed += 1
        never = idle_fit.reason(request)
        if never is not None:
            waiting[job.job_id] = never  # nothing that ends will help: do not hold anyone back for it
            continue

        qos = accounting.qos_map.get(job.qos_name or default_qos)
        if config.preemption and qos is not None and qos.preempts and preempting_jobs < config.max_preemptions_per_cycle:
            chosen = _preempt_for(request, capacity, placer, snapshot.running, qos.preempts, victims_taken, now,
                                  default_qos)
            if chosen is not None:
                victims, allocation = chosen
                preempting_jobs += 1 if victims else 0
                grace = 0
                for victim in victims:
                    victims_taken.add((victim.job_id, victim.attempt))
                    victim_qos = accounting.qos_map.get(victim.qos or default_qos)
                    preempts.append(Preempt(victim.job_id, victim.attempt, victim_qos.grace_s if victim_qos else 0))
                    grace = max(grace, preempts[-1].grace_s)
                # Nobody else may take what is freed for it, and later reservations plan around it.
                stopping = [r for r in snapshot.running if r.stopping]
                capacity.reserve(allocation, now, job.job_id,
                                 memory_room_after([*victims, *stopping], capacity, allocation))
                held_until = now + grace + limit
                if timeline is not None:
                    timeline.hold(allocation, held_until)
                else:
                    preempted_for.append((allocation, held_until))
                waiting[job.job_id] = Reason.PREEMPTING
                continue

        if not config.backfill:
            waiting[job.job_id] = Reason.RESOURCES
            blocked_partitions.add(job.partition)
            continue
        if len(reservations) < config.reservations:
            if timeline is None:
                timeline = Timeline(capacity, snapshot.running, now)
                for held, until in started_now:
                    timeline.started(held, until)
                for held, until in preempted_for:
                    timeline.hold(held, until)
            found = timeline.earliest_start(request, placer, config.resolution_s, config.window_s)
            if found is not None:
                begin, reserved = found
                reservations.append(Reservation(job.job_id, begin, begin + limit, reserved))
                capacity.reserve(reserved, begin, job.job_id, timeline.memory_room(reserved, begin))
                timeline.hold(reserved, begin + limit)
                estimated[job.job_id] = begin
            waiting[job.job_id] = Reason.RESOURCES
            continue
        memo._sync()
        if signature not in memo.blocked:
            memo.blocked[signature] = _blocked_reason(request, capacity, placer, reservations)
        waiting[job.job_id] = memo.blocked[signature]

    return Plan(
        starts=tuple(starts),
        waiting=waiting,
        order=tuple(j.job_id for j in queue),
        priorities=priorities,
        estimated_starts=estimated,
        reservations=tuple(reservations),
        preempts=tuple(preempts),
    )


def _stream(capacity: Capacity, request: Request, end_time: float) -> Iterator[Candidate]:
    return capacity.stream(request, end_time)


def _blocked_reason(request: Request, capacity: Capacity, placer: Placer, reservations: list[Reservation]) -> str:
    """A blocked job with no reservation of its own: is it a reservation in its way, or plain priority?"""
    if not reservations or not capacity.might_fit(request):
        return Reason.PRIORITY
    def ignoring_reservations(r: Request) -> Iterator[Candidate]:
        return capacity.stream(r, float("-inf"))  # an end before every reservation: reserved GPUs usable

    ignoring = placer.place(request, ignoring_reservations)
    if ignoring is None:
        return Reason.PRIORITY
    holder = capacity.reservation_on(ignoring)
    return Reason.reserved_for(holder[1]) if holder is not None else Reason.PRIORITY


def _preempt_for(
    request: Request,
    capacity: Capacity,
    placer: Placer,
    running: Sequence[RunningJob],
    preemptable_qos: Sequence[str],
    victims_taken: set[tuple[int, int]],
    now: float,
    default_qos: str,
) -> tuple[tuple[RunningJob, ...], Allocation] | None:
    allowed = set(preemptable_qos)

    def may_preempt(job: RunningJob) -> bool:
        return (job.qos or default_qos) in allowed and (job.job_id, job.attempt) not in victims_taken

    return select_victims(request, capacity, placer, running, may_preempt, now)
