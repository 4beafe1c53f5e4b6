"""One scheduling cycle: ``schedule(snapshot, now, config) -> Plan``.

Pure: no I/O, no clock of its own, no randomness. The controller applies the plan after re-checking it
against its current state (a plan computed on a snapshot may be stale); the simulator applies it to its
virtual cluster. Every pending job that does not start gets a reason, so users can see why it waits.

The cycle walks the queue once, in priority order (priority.py), and for each job runs the phases wired in
pipeline.py, one small file each under phases/, sharing one CycleState (cycle_state.py):

1. gates (phases/gates.py): cheap checks that need no placement: held, dependency, begin time, partition
   and QoS rules, singleton, array limits, quotas (quota.py), and bounded work: once ``max_job_test`` jobs
   have failed to place, the rest wait with reason Priority (a deep queue costs a dict lookup per job, not
   a placement). A job stopped here does not hold back the jobs behind it;
2. place_now: start now if the whole gang fits (placement.py), never on GPUs reserved for a
   higher-priority job unless it ends before that reservation starts (the backfill rule);
3. never_here: otherwise, if it can never run on the nodes that are up (feasibility.py), say why and move on;
4. preempt_for: otherwise, with preemption enabled and a QoS that may preempt, pick victims (preemption.py);
5. reserve_later: otherwise, while reservations remain (with ``reserve_every_overdue``, for every overdue job
   besides), reserve the earliest time and GPUs it could have (backfill.py); without backfill the first
   blocked job holds back its whole partition (strict FIFO).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from garrison.controller.sched.backfill import Reservation
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle_state import Candidacy, CycleState, Memo, time_limit_of
from garrison.controller.sched.feasibility import IdleCluster
from garrison.controller.sched.framework import Request, placement_key
from garrison.controller.sched.phases.gates import is_plain, standing_reason
from garrison.controller.sched.phases.preempt import preemption_ruled_out
from garrison.controller.sched.pipeline import (
    DEFAULT_SCORER_WEIGHTS,
    GATES,
    PHASES,
    QUEUE_ORDER,
    Pipeline,
    build_pipeline,
)
from garrison.controller.sched.placement import DEFAULT_SCORE_LIMIT, Placer, request_for
from garrison.controller.sched.plan import Plan, Preempt, Reason, Start
from garrison.controller.sched.preemption import DEFAULT_MAX_GRACE_S
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityContext, PriorityWeights
from garrison.controller.sched.queue import RankedQueue, Shape, rank
from garrison.controller.sched.quota import QuotaTally
from garrison.controller.sched.snapshot import PendingJob, Snapshot
from garrison.model.accounts import Accounting, PartitionDef

__all__ = ["Plan", "Preempt", "Reason", "Reservation", "SchedulerConfig", "Start", "schedule", "time_limit_of"]


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
    max_grace_s: int = DEFAULT_MAX_GRACE_S  # how far a victim's --signal lead time may lengthen its QoS grace
    scorer_weights: tuple[tuple[str, int], ...] = DEFAULT_SCORER_WEIGHTS
    score_limit: int = DEFAULT_SCORE_LIMIT  # passing nodes scored for a one-node job
    # Priorities move with the clock (age, overdue) and with usage (fair share) by a point in minutes; with
    # an interval, a cycle prices its queue as of the last plan's PriorityContext (Snapshot.pricing) until
    # the interval has passed since that context's moment (Slurm's PriorityCalcPeriod), so that a cycle
    # places only the jobs that changed instead of pricing and sorting them all. 0: priced every cycle.
    priority_interval_s: float = 0.0
    # Attained service's preemption rule (attained.py): with preemption on, a blocked job in the high queue
    # may preempt running jobs in the low queue (those that have had the threshold of GPU time), as well as
    # those its QoS may preempt. Needs the attained_service weight, which defines the queues.
    preempt_attained: bool = False
    # With it, ``reservations`` counts only the blocked jobs that are not overdue (PriorityWeights.overdue),
    # and every blocked overdue job gets a reservation besides: EASY's one reservation for the queue's order
    # (reservations = 1) without holding GPUs idle for further jobs that have not waited long, and still the
    # bound on the longest waits. Without the overdue weight nothing is overdue and it changes nothing.
    reserve_every_overdue: bool = False

    def __post_init__(self) -> None:
        for name in ("reservations", "max_job_test", "max_starts_per_cycle", "max_preemptions_per_cycle",
                     "max_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"scheduler setting {name} must not be negative")
        if self.score_limit < 1:
            raise ValueError("scheduler setting score_limit must be at least 1")
        if self.window_s <= 0:
            raise ValueError("scheduler setting window_s must be positive")
        if self.resolution_s < 0:
            raise ValueError("scheduler setting resolution_s must not be negative")
        if self.priority_interval_s < 0:
            raise ValueError("scheduler setting priority_interval_s must not be negative")
        if self.preempt_attained and not (self.preemption and self.weights.attained_service):
            raise ValueError("scheduler setting preempt_attained needs preemption on and the attained_service "
                             "priority weight set")
        _pipeline(self.scorer_weights)  # unknown scorer names fail here, not in the first cycle


# Per job id: (the job view, partition and accounting they were derived from, its time limit, its Request,
# the Request's placement key, whether it is plain: phases/gates.is_plain). A memo of pure functions of
# those objects, so the core stays pure: used only for the very objects it was computed from. A pending
# job's view is the same object from one snapshot to the next until the job changes, so a deep queue does
# not rebuild its requests, nor rerun the gates that cannot change, every cycle.
_REQUESTS: dict[
    int, tuple[PendingJob, PartitionDef | None, Accounting, int, Request, tuple[object, ...], bool]
] = {}


class _Key(tuple):  # type: ignore[type-arg]
    """A placement key (framework.placement_key) that hashes by identity, in C: the cycle looks each job's
    key up in several dicts (memo, idle verdicts), and a tuple recomputes its hash, the GangShape's among
    it, in Python, at every lookup (a hash kept on the object still cost a Python call per lookup, ~1% of
    a garrison replay). Keys are interned (_interned), so equal keys are one object and a dict finds it
    by identity. Equal to the plain tuple, but not hashing like it: a dict that holds plain keys (the idle
    verdicts of a submission check) does not find them by a _Key, and answers again, as it would the
    first time (every answer keyed by a placement key is a pure function of it)."""

    __slots__ = ()
    __hash__ = object.__hash__


# One _Key per distinct placement key, so that lookups among equal keys compare by identity. Few: a key
# leaves out the job's id and duration.
_KEYS: dict[tuple[object, ...], _Key] = {}


def _interned(key: tuple[object, ...]) -> _Key:
    found = _KEYS.get(key)
    if found is None:
        found = _KEYS[key] = _Key(key)
    return found


def _bound_keys() -> None:
    """Forget the interned keys past 4,096, between cycles only, and the requests that hold them with them:
    within a cycle equal keys must stay one object (the look-alike memo finds them by identity), and a job
    remembered with a key made before would no longer share it with a look-alike interned after."""
    if len(_KEYS) >= 4096:
        _KEYS.clear()
        _REQUESTS.clear()


@lru_cache(maxsize=16)
def _pipeline(scorer_weights: tuple[tuple[str, int], ...]) -> Pipeline:
    return build_pipeline(scorer_weights)


@lru_cache(maxsize=16)
def _placer(scorer_weights: tuple[tuple[str, int], ...], score_limit: int) -> Placer:
    """One placer per configuration, not per cycle: it holds nothing but what it derives from the pipeline
    (the filters and scorers spelt out, the scores' ceilings), which costs more to derive than a cycle of a
    small queue spends placing."""
    return Placer(_pipeline(scorer_weights), score_limit)


def schedule(snapshot: Snapshot, now: float, config: SchedulerConfig | None = None) -> Plan:
    config = config or SchedulerConfig()
    _bound_keys()
    accounting = snapshot.accounting
    default_qos = accounting.default_qos
    placer = _placer(config.scorer_weights, config.score_limit)
    capacity = Capacity(snapshot.nodes)
    array_running = Counter(dict(snapshot.running_array_tasks))
    for running in snapshot.running:
        if running.array_job_id is not None:
            array_running[running.array_job_id] += 1
    state = CycleState(
        snapshot=snapshot, now=now, config=config, placer=placer, capacity=capacity,
        idle=IdleCluster(capacity.views, placer), memo=Memo(capacity),
        quotas=QuotaTally(accounting, snapshot.running, snapshot.usage, now, default_qos),
        default_qos=default_qos, array_running=array_running, partitions=accounting.partition_map,
    )
    pricing = _pricing(snapshot, now, config)
    ranked = rank(snapshot.pending, pricing, QUEUE_ORDER)
    if config.weights.overdue:
        state.overdue_after = pricing.overdue_after
    state.priced_at = pricing.now
    views, queue = ranked.views, ranked.ids

    waiting = state.waiting
    starts = state.starts  # the phases append to it
    partitions = state.partitions
    requests = _REQUESTS
    quotas, memo = state.quotas, state.memo
    quotas_enabled = quotas.enabled
    # The memo's dicts are cleared in place when the capacity changes (Memo.sync), never replaced.
    memo_blocked, memo_failed_end = memo.blocked, memo.failed_end
    settled, reservations = config.backfill and not config.preemption, config.reservations
    preempting = config.backfill and config.preemption
    max_job_test, max_starts, backfill = config.max_job_test, config.max_starts_per_cycle, config.backfill
    # With reserve_every_overdue an overdue job still gets a reservation past the others' (phases/reserve.py),
    # so it never takes the look-alike shortcut below.
    overdue_after = state.overdue_after
    every_overdue = config.reserve_every_overdue and overdue_after is not None
    overdue_after = overdue_after if overdue_after is not None else float("inf")
    for job_id in queue:
        if state.failed >= max_job_test or len(starts) >= max_starts:
            # The cycle's bounded work is done: the rest get their gates' reasons, once per shape of job.
            _bounded_tail(state, ranked)
            break
        job = views[job_id]
        if job.held or job.dependencies is not None:
            standing = standing_reason(state, job)
            if standing is not None:
                waiting[job_id] = standing
                continue
        partition = partitions.get(job.partition)
        known = requests.get(job_id)
        if known is not None and known[0] is job and known[1] is partition and known[2] is accounting:
            _, _, _, limit, request, key, plain = known
        else:
            limit = time_limit_of(job, partition)
            request = request_for(job_id, job.spec, job.partition, limit)
            key = placement_key(request)
            if job.other_partitions:
                # -p a,b: a look-alike must name the same partitions, since it is tried in each of them
                key = (*key, job.other_partitions)
            key = _interned(key)
            plain = is_plain(state, job, partition, limit)
            requests[job_id] = (job, partition, accounting, limit, request, key, plain)
        if plain:
            # The gates that can stop a plain job (gates.py, in the same order): quotas, then, without
            # backfill, a blocked partition (the bounded work is checked at the top of the loop).
            gated = quotas.blocked_by(job, job.spec.total_gpus(), limit) if quotas_enabled else None
            if gated is None and not backfill and job.partition in state.blocked_partitions:
                gated = Reason.PRIORITY
        else:
            gated = GATES(state, job, partition, limit)
        if gated is not None:
            waiting[job_id] = gated
            continue
        end = now + limit
        if (len(state.reservations) - state.overdue_reservations >= reservations
                and not (every_overdue and now - job.submit_time > overdue_after)
                and (settled or (preempting and preemption_ruled_out(state, job, key, end)))):
            # Past the reservations, with preemption off (or unable to act for this job), a job whose look-alike (same placement key) already
            # failed to start for a run ending no later, and was told why it waits, fails the same way and
            # waits for the same reason: its phases would each answer as they did for the look-alike
            # (place_now: does not fit; never_here: the idle verdict of the same key; reserve_later: the
            # same memo). A deep queue of look-alikes then costs a few lookups per job. (Memo.sync and
            # Memo.known_not_to_fit, spelt out.)
            if memo.version != capacity.version:
                memo.sync()
            blocked = memo_blocked.get(key)
            if blocked is not None:
                failed_end = memo_failed_end.get(key)
                if (failed_end is not None and end >= failed_end) or not capacity.might_fit(request):
                    state.failed += 1
                    waiting[job_id] = blocked[0]
                    if blocked[1] is not None:
                        state.blocked_by[job_id] = blocked[1]
                    continue
        candidacy = Candidacy(job, limit, request, key, end)
        for phase in PHASES:
            if phase(state, candidacy):
                break
    if len(requests) > 2 * len(queue) + 1024:
        # Jobs that left the queue: keep only the ones pending now.
        for job_id in [job_id for job_id in requests if job_id not in views]:
            del requests[job_id]

    return Plan(
        starts=tuple(state.starts),
        waiting=state.waiting,
        order=tuple(queue),
        priorities=dict(ranked.priorities),
        estimated_starts=state.estimated,
        reservations=tuple(state.reservations),
        preempts=tuple(state.preempts),
        blocked_by=state.blocked_by,
        wake_at=state.wake_at,
        pricing=pricing,
        reprice_at=pricing.now + config.priority_interval_s if config.priority_interval_s else None,
    )


def _pricing(snapshot: Snapshot, now: float, config: SchedulerConfig) -> PriorityContext:
    """The context the queue is priced as of: the last plan's (``snapshot.pricing``) while it is younger than
    ``priority_interval_s`` and was computed for the same weights, accounting and cluster size; else one as
    of ``now``."""
    last = snapshot.pricing
    interval = config.priority_interval_s
    if (last is None or not interval or not last.now <= now < last.now + interval
            or last.accounting is not snapshot.accounting
            or (last.weights is not config.weights and last.weights != config.weights)
            or last.total_gpus != (sum(node.gpu_count for node in snapshot.nodes) or 1)):
        return PriorityContext(snapshot, now, config.weights)
    return last


def _bounded_tail(state: CycleState, ranked: RankedQueue) -> None:
    """The gates' reasons for the jobs the cycle did not reach, once the cycle's bounded work is done
    (``max_job_test`` placements failed, or ``max_starts_per_cycle`` jobs started): the gates place none of
    them (at the least, Reason.PRIORITY), so nothing the gates read changes any more, and a job's reason
    depends only on what the gates read of it, its shape (``_tail_shape``), save for its own hold,
    dependency, begin time and array limit (each such job is a shape of its own). The gates run once per
    shape in the queue, on any of its jobs (they all answer alike); the ranked queue keeps each job's shape
    from one cycle to the next, so a deep queue costs two dict lookups per job, in C."""
    accounting = state.snapshot.accounting
    quotas = state.quotas.enabled
    partitions = state.partitions
    # Without quotas the gates read a time limit only to compare it with partitions' and QoS's maximums, so
    # what counts of it is which of those it exceeds (with quotas, GPU-hours, all of it).
    maximums = sorted({p.max_time_s for p in accounting.partitions}
                      | {q.max_time_s for q in accounting.qos if q.max_time_s is not None})

    def shape_of(job: PendingJob) -> Shape:
        return _tail_shape(job, partitions, maximums, quotas)

    def reason_for(job: PendingJob) -> str:
        partition = partitions.get(job.partition)
        return GATES(state, job, partition, time_limit_of(job, partition)) or Reason.PRIORITY

    # Every job's reason by its shape, then the reasons of the jobs the cycle walked (or started) over them.
    reasons = dict(ranked.reasons_by_shape(accounting, quotas, shape_of, reason_for))
    reasons.update(state.waiting)
    for start in state.starts:
        reasons.pop(start.job_id, None)
    state.waiting = reasons


HELD_SHAPE: Shape = ("held",)


def _tail_shape(job: PendingJob, partitions: Mapping[str, PartitionDef], maximums: Sequence[int],
                quotas: bool) -> Shape:
    """What the gates read of a job: partition, account, QoS, which time-limit maximums it exceeds (with
    quotas: its time limit, user and GPUs), its typed dependencies, its begin time and its array's limit.
    Every held job is one shape: a hold is the gates' first answer, whatever else the job is (50,000 held
    jobs were 50,000 shapes, each with its own members dict). An array's dependent or limited tasks share
    their shape too (each was a shape of its own: a gate check per task per cycle): the dependency gate reads
    only the typed dependencies (equal ones answer alike), the begin-time gate the begin time, and the array
    gate the array's running count against its limit."""
    if job.held:
        return HELD_SHAPE
    spec = job.spec
    limit = job.time_limit_s
    if limit is None:
        limit = time_limit_of(job, partitions.get(job.partition))
    array_limit = spec.array_max_running
    gates = (job.dependencies, spec.begin_time,
             job.array_job_id if array_limit is not None else None, array_limit)
    if quotas:
        return (job.partition, job.account, spec.account, job.qos, spec.qos, limit, job.user, spec.total_gpus(),
                *gates)
    return (job.partition, job.account, spec.account, job.qos, spec.qos, bisect_left(maximums, limit), *gates)
