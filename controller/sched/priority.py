"""Multifactor priority, like Slurm's priority/multifactor: a weighted sum of factors in [0, 1].

    priority = w_age * age + w_fairshare * fairshare + w_qos * qos + w_size * size + w_partition * partition
               + w_time_limit * time_limit + w_small_job * small_job + w_overdue * overdue
               + w_attained_service * attained_service
               + the admin's adjustment (gcontrol update JOB --priority) - the owner's nice value (gsub --nice)

- age: time pending over ``max_age_s``, capped at 1;
- fairshare: fairshare.py's classic factor for the job's (account, user);
- qos: the job's QoS priority over the highest QoS priority;
- size: the job's GPUs over the cluster's GPUs (large jobs first, so they are not starved by small ones);
- partition: the partition's priority over the highest partition priority;
- time_limit: how short the job's time limit is, on a log scale: 1 at or below ``short_limit_s``, 0 at or
  above ``long_limit_s`` (1 h and 7 days by default; a 4 h limit scores 0.73, 24 h 0.38, 72 h 0.17).
  Slurm has no such factor; Maui and Moab favour short wall-time requests (their expansion factor) for the
  same reason: moving a short job ahead of a long one saves the short job more than it costs the long one,
  so the average completion time falls. The age factor bounds the cost: a long job is overtaken only by
  jobs submitted less than ``w_time_limit / w_age * max_age_s`` after it (30 days with the garrison
  weights), plus what fair share and QoS add to theirs, as with any multifactor priority. Only the limit
  counts, which users choose, never the true run time.

- small_job: how few GPUs the job asks for, on a log scale: 1 for one GPU, 0 for the whole cluster
  (log(cluster GPUs / job GPUs) / log(cluster GPUs); on 96 GPUs 8 GPUs score 0.54, 16 score 0.39, 64 score
  0.09). The opposite of ``size``: with the time-limit factor at a like weight the sum ranks jobs by
  the log of the GPU-time they ask for (GPUs x limit), so a one-GPU job no longer ranks alike with a
  16-GPU job of the same limit. Like the time-limit factor it reads only what the user asked for.

- overdue: 0 until the job has waited ``overdue_after_s`` (or ``overdue_share`` of the longest wait in the
  queue now, if later), then 1 plus one more per further ``overdue_after_s``, without a cap: the bound on
  any job's wait, which no other factor can outrun. Computed from the snapshot and ``now`` alone, like age.

- attained_service: Tiresias' discretised two-queue LAS (attained.py): 1 in the high queue (less than
  ``attained_threshold_gpu_s`` GPU-seconds of service over the job's earlier attempts, or starving: waited
  longer than ``attained_starvation`` times its last run), 0 in the low queue. Priced like age, as of the
  pricing context's moment (the starvation guard moves with the clock). A job that never ran is in the high
  queue, so on its own the factor only moves requeued jobs down; with SchedulerConfig.preempt_attained a
  blocked high-queue job may also preempt running low-queue jobs (phases/preempt.py).

With every weight 0 the queue is plain arrival order (FIFO).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter, neg

from garrison.controller.sched.attained import in_high_queue
from garrison.controller.sched.fairshare import fair_share_factors
from garrison.controller.sched.snapshot import FALLBACK_TIME_LIMIT_S, NodeView, PendingJob, Snapshot
from garrison.model.accounts import Accounting


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    age: int = 1000
    fair_share: int = 10000
    qos: int = 2000
    job_size: int = 1000
    partition: int = 1000
    time_limit: int = 0
    small_job: int = 0
    max_age_s: float = 7 * 86400
    short_limit_s: float = 3600  # a time limit this short or shorter: time-limit factor 1
    long_limit_s: float = 7 * 86400  # this long or longer: time-limit factor 0
    # The bound on any job's wait (0: none). A job pending longer than overdue_after_s gains ``overdue``
    # points per further overdue_after_s of waiting, without a cap, on top of its other factors: the age
    # factor saturates at max_age_s and can be outrun by the time-limit factor of every newer short job;
    # this cannot, so an overdue job rises above every job that is not, and overdue jobs among themselves
    # go mostly by how long they have waited.
    overdue: int = 0
    overdue_after_s: float = 0.0
    # ... and not before it has waited this share of the longest wait in the queue now (0: the fixed bound
    # alone). A fixed bound is either below the waits of a saturated cluster (then nearly every job is
    # overdue, and the queue is FIFO) or above those of a lighter one (then it bounds nothing); a share of
    # the current longest wait follows the load: only the longest waiters go first, in the order they came.
    overdue_share: float = 0.0
    # Attained service (attained.py): the high queue's weight (0: off), the GPU-seconds of service below which
    # a job is in it, and the starvation guard's multiple of a job's last run (0: no guard).
    attained_service: int = 0
    attained_threshold_gpu_s: float = 0.0
    attained_starvation: float = 0.0

    def __post_init__(self) -> None:
        for name in ("age", "fair_share", "qos", "job_size", "partition", "time_limit", "small_job", "overdue",
                     "attained_service"):
            if getattr(self, name) < 0:
                raise ValueError(f"priority weight {name} must not be negative")
        if self.max_age_s <= 0:
            raise ValueError("priority max age must be positive")
        if not 0 < self.short_limit_s < self.long_limit_s:
            raise ValueError("priority time limits must satisfy 0 < short < long")
        if self.overdue_after_s < 0 or (self.overdue and not self.overdue_after_s):
            raise ValueError("priority overdue_after_s must be positive when the overdue weight is set")
        if not 0 <= self.overdue_share < 1:
            raise ValueError("priority overdue_share must be at least 0 and below 1")
        if self.attained_threshold_gpu_s < 0 or (self.attained_service and not self.attained_threshold_gpu_s):
            raise ValueError("priority attained_threshold_gpu_s must be positive when the attained_service weight "
                             "is set")
        if self.attained_starvation < 0:
            raise ValueError("priority attained_starvation must not be negative")

    def high_queue(self, job: PendingJob, now: float) -> bool:
        """Whether ``job`` is in attained service's high queue as of ``now`` (attained.py)."""
        service = job.service
        return not service or in_high_queue(service, self.attained_threshold_gpu_s, self.attained_starvation, now)


def overdue_factor(waited_s: float, overdue_after_s: float) -> float:
    """0 until a job has waited ``overdue_after_s``, then 1 more for every further ``overdue_after_s``."""
    if overdue_after_s <= 0 or waited_s <= overdue_after_s:
        return 0.0
    return (waited_s - overdue_after_s) / overdue_after_s + 1.0


def small_job_factor(gpus: int, total_gpus: int) -> float:
    """1 for a job of one GPU (or none), 0 for one as wide as the cluster, log-linear in between."""
    if gpus <= 1 or total_gpus <= 1:
        return 1.0 if gpus <= 1 else 0.0
    if gpus >= total_gpus:
        return 0.0
    return math.log(total_gpus / gpus) / math.log(total_gpus)


NO_WEIGHTS = PriorityWeights(age=0, fair_share=0, qos=0, job_size=0, partition=0)  # plain arrival order


def time_limit_factor(limit_s: float, short_s: float, long_s: float) -> float:
    """1 for a limit at or below ``short_s``, 0 at or above ``long_s``, log-linear in between."""
    if limit_s <= short_s:
        return 1.0
    if limit_s >= long_s:
        return 0.0
    return math.log(long_s / limit_s) / math.log(long_s / short_s)


@dataclass(frozen=True, slots=True)
class PriorityFactors:
    age: float
    fair_share: float
    qos: float
    job_size: float
    partition: float
    admin: int
    total: int
    time_limit: float = 0.0
    nice: int = 0
    overdue: float = 0.0
    small_job: float = 0.0
    attained_service: float = 0.0


class PriorityOrder:
    """The queue order: highest priority first, then oldest, then lowest id (a total order, so plans are
    deterministic)."""

    name = "Priority"

    def key(self, job_id: int, submit_time: float, priority: int) -> tuple[float, ...]:
        return (-priority, submit_time, job_id)

    def keys(
        self, job_ids: Iterable[int], submit_times: Iterable[float], priorities: Iterable[int]
    ) -> list[tuple[float, ...]]:
        return list(zip(map(neg, priorities), submit_times, job_ids, strict=True))


class PriorityContext:
    """What one cycle needs to price every pending job: computed once, then a few dict lookups per job."""

    def __init__(self, snapshot: Snapshot, now: float, weights: PriorityWeights) -> None:
        self.now = now
        self.weights = weights
        accounting = snapshot.accounting
        self.total_gpus = _total_gpus(snapshot.nodes)
        # What the accounting alone decides (the QoS and partition factors, the default QoS and time limits),
        # shared by the contexts of one accounting object: read only, never changed in place.
        facts = _accounting_facts(accounting)
        self.qos_factor: Mapping[str, float] = facts.qos_factor
        self.partition_factor: Mapping[str, float] = facts.partition_factor
        self.default_qos = accounting.default_qos
        # A job without a time limit of its own gets its partition's default (as the cycle does).
        self.default_limit: Mapping[str, int] = facts.default_limit
        self._facts = facts
        self._fingerprint: tuple[object, ...] | None = None
        # When a job becomes overdue this cycle: the fixed bound, or the share of the longest wait now.
        self.overdue_after = weights.overdue_after_s
        if weights.overdue and weights.overdue_share and snapshot.pending:
            longest = now - min(job.submit_time for job in snapshot.pending)
            self.overdue_after = max(self.overdue_after, weights.overdue_share * longest)
        # What a later cycle checks before pricing its queue as of this context (cycle.py): the accounting
        # and the cluster's size it was computed for.
        self.accounting = accounting
        self.fair_share: dict[tuple[str, str], float] = {}
        self._associations: frozenset[tuple[str, str]] = frozenset()
        self._decayed: dict[tuple[str, str], float] = {}
        if weights.fair_share:
            self._associations = _associations(snapshot.pending)
            self._decayed = {key: usage.decayed_gpu_s for key, usage in snapshot.usage.items()}
            self.fair_share = fair_share_factors(accounting, self._associations, self._decayed)
        # Associations first seen after this context was computed (a job submitted since, by a new user):
        # their factor as of the same usage, each against this context's associations and itself, so it
        # does not depend on which others appeared with it. A memo of a pure function of the context.
        self._late_fair_share: dict[tuple[str, str], float] = {}

    def fair_share_of(self, account: str, user: str) -> float:
        """The fair-share factor of (account, user) as of this context's usage."""
        key = (account, user)
        found = self.fair_share.get(key)
        if found is not None:
            return found
        found = self._late_fair_share.get(key)
        if found is None:
            found = fair_share_factors(self.accounting, self._associations | {key}, self._decayed)[key]
            self._late_fair_share[key] = found
        return found

    def factors(self, job: PendingJob) -> PriorityFactors:
        w = self.weights
        age = min(1.0, max(0.0, self.now - job.submit_time) / w.max_age_s)
        fair = self.fair_share_of(job.account_name, job.user) if w.fair_share else 1.0
        qos = self.qos_factor.get(job.qos_name or self.default_qos, 0.0)
        size = min(1.0, job.spec.total_gpus() / self.total_gpus)
        part = self.partition_factor.get(job.partition, 0.0)
        short = time_limit_factor(self._limit(job), w.short_limit_s, w.long_limit_s)
        small = small_job_factor(job.spec.total_gpus(), self.total_gpus)
        overdue = overdue_factor(self.now - job.submit_time, self.overdue_after) if w.overdue else 0.0
        high = 1.0 if w.attained_service and w.high_queue(job, self.now) else 0.0
        total = round(w.age * age + w.fair_share * fair + w.qos * qos + w.job_size * size + w.partition * part
                      + w.time_limit * short + w.small_job * small + w.overdue * overdue
                      + w.attained_service * high)
        nice = job.spec.nice
        return PriorityFactors(age, fair, qos, size, part, job.priority, total + job.priority - nice, short, nice,
                               overdue, small, high)

    def _limit(self, job: PendingJob) -> float:
        if job.time_limit_s is not None:
            return job.time_limit_s
        if job.spec.time_limit_s is not None:
            return job.spec.time_limit_s
        return self.default_limit.get(job.partition, FALLBACK_TIME_LIMIT_S)

    def priority(self, job: PendingJob) -> int:
        return self.factors(job).total

    def priorities(self, jobs: Iterable[PendingJob], whole_queue: bool = True) -> dict[int, int]:
        """``factors(job).total`` for many jobs: the same sums, written for a queue of tens of thousands.
        The part of a job's priority that does not move with the clock or with usage (QoS, size, partition,
        time limit, nice, the admin's adjustment) is remembered per job view across cycles (_STATIC_PARTS):
        a pending job's view is the same object from one snapshot to the next until the job changes.
        ``whole_queue``: ``jobs`` are every pending job, so the memo may forget the others (a few jobs
        priced on their own leave it as it is)."""
        w = self.weights
        now, max_age = self.now, w.max_age_s
        fair_share = self.fair_share
        static = self._static_memo()
        age_w, fair_w = w.age, w.fair_share
        overdue_w, overdue_after = w.overdue, self.overdue_after
        attained_w = w.attained_service
        out: dict[int, int] = {}
        fair_terms: dict[tuple[str, str], float] = {}  # fair_w * the association's factor, once each
        remembered = static.get
        for job in jobs:
            job_id = job.job_id
            known = remembered(job_id)
            if known is None or known[0] is not job:
                fixed, adjustment = self._static_part(job)
                association = (job.account or job.spec.account or "default", job.user)
                association = _ASSOCIATIONS.setdefault(association, association)  # one tuple each, not per job
                known = static[job_id] = (job, fixed, adjustment, association)
            waited = now - job.submit_time
            age = 0.0 if waited <= 0 else (1.0 if waited >= max_age else waited / max_age)
            value = age_w * age + known[1]
            if overdue_w and waited > overdue_after:
                value += overdue_w * ((waited - overdue_after) / overdue_after + 1.0)
            if attained_w and (not job.service or w.high_queue(job, now)):
                value += attained_w  # a job that never ran: the high queue, without a call
            if fair_w:
                association = known[3]
                term = fair_terms.get(association)
                if term is None:
                    fair = fair_share.get(association)
                    term = fair_terms[association] = fair_w * (fair if fair is not None
                                                               else self.fair_share_of(*association))
                value += term
            out[job_id] = round(value) + known[2]
        if whole_queue and len(static) > 2 * len(out) + 1024:
            # Jobs that left the queue: keep only the ones priced now.
            for job_id in [job_id for job_id in static if job_id not in out]:
                del static[job_id]
        return out

    def prices_like(self, other: PriorityContext | None) -> bool:
        """True when this context gives every job view the same priority as ``other`` does: the same
        weights, none of them on a factor that moves with the clock or with usage, and the same
        configuration. A queue ranked as of ``other`` is then ranked as of this context too (queue.py)."""
        if other is None:
            return False
        if other.weights is not self.weights and other.weights != self.weights:
            return False
        return _timeless(self.weights) and self._static_fingerprint() == other._static_fingerprint()

    def _static_fingerprint(self) -> tuple[object, ...]:
        if self._fingerprint is None:
            self._fingerprint = (self.weights, self.total_gpus, *self._facts.fingerprint)
        return self._fingerprint

    def _static_memo(self) -> StaticParts:
        """_static_parts of this context's fingerprint. The last one is remembered with the accounting
        object, weights and cluster size it was found for: the next cycle's context (another object, the
        same configuration) takes it without hashing the fingerprint, a tuple of every QoS, partition and
        weight, again."""
        last = self._facts.last_static
        if last is not None and last[0] is self.weights and last[1] == self.total_gpus:
            return last[2]
        found = _static_parts(self._static_fingerprint())
        self._facts.last_static = (self.weights, self.total_gpus, found)
        return found

    def _static_part(self, job: PendingJob) -> tuple[float, int]:
        """The weighted sum of the factors that depend on the job and the configuration only, and the
        integer adjustment (admin priority less nice)."""
        w = self.weights
        spec = job.spec
        qos = job.qos or spec.qos or self.default_qos
        value = (
            w.qos * self.qos_factor.get(qos, 0.0)
            + w.job_size * min(1.0, spec.total_gpus() / self.total_gpus)
            + w.partition * self.partition_factor.get(job.partition, 0.0)
        )
        if w.time_limit:
            value += w.time_limit * time_limit_factor(self._limit(job), w.short_limit_s, w.long_limit_s)
        if w.small_job:
            value += w.small_job * small_job_factor(spec.total_gpus(), self.total_gpus)
        return value, job.priority - spec.nice


# The weights of the factors that read only the job and the configuration (_static_part), and the settings
# that are no weights. With every other field 0 (age, fair share, overdue, and any field added later until
# it is listed here), a job's priority does not move with the clock or with usage: fifo and fifo-easy,
# whose queue then never needs repricing (queue.py).
_TIMELESS_WEIGHTS = frozenset({"qos", "job_size", "partition", "time_limit", "small_job"})
_SETTINGS = frozenset({"max_age_s", "short_limit_s", "long_limit_s", "overdue_after_s", "overdue_share"})
_TIMELESS: dict[PriorityWeights, bool] = {}


def _timeless(weights: PriorityWeights) -> bool:
    found = _TIMELESS.get(weights)
    if found is None:
        if len(_TIMELESS) >= 64:
            _TIMELESS.clear()
        found = _TIMELESS[weights] = all(
            getattr(weights, f.name) == 0 for f in fields(weights) if f.name not in _TIMELESS_WEIGHTS | _SETTINGS
        )
    return found


# The last snapshot's nodes and pending jobs (the tuples themselves, so that their ids are not reused while
# they are here) with what a context derives from them alone: a snapshot builder hands the next cycle the
# same tuple while nothing changed in it (gsim's SnapshotBuilder: the nodes until a job starts or ends, the
# queue until one arrives or starts). Memos of pure functions, used only for the very tuple they were made from.
_LAST_NODES: tuple[Sequence[NodeView], int] | None = None
_LAST_PENDING: tuple[Sequence[PendingJob], frozenset[tuple[str, str]]] | None = None
_GPU_NAMES = attrgetter("gpu_names")


def _total_gpus(nodes: Sequence[NodeView]) -> int:
    """The cluster's GPUs (at least 1): ``sum(n.gpu_count for n in nodes) or 1``, the property read in C."""
    global _LAST_NODES
    last = _LAST_NODES
    if last is not None and last[0] is nodes:
        return last[1]
    total = sum(map(len, map(_GPU_NAMES, nodes))) or 1
    _LAST_NODES = (nodes, total)
    return total


def _associations(pending: Sequence[PendingJob]) -> frozenset[tuple[str, str]]:
    """The pending jobs' (account, user) associations."""
    global _LAST_PENDING
    last = _LAST_PENDING
    if last is not None and last[0] is pending:
        return last[1]
    # PendingJob.account_name, spelt out: a property call per job doubles this pass over the queue.
    found = frozenset({(job.account or job.spec.account or "default", job.user) for job in pending})
    _LAST_PENDING = (pending, found)
    return found


# Per configuration (the fingerprint of what the static part reads), per job id: (the job view it was
# computed for, its static part, its adjustment, its (account, user) association). A memo of a pure
# function, so the core stays pure: a result is used only for the very view object it was computed from.
# A few configurations at most (gsim runs several policies in one process).
StaticParts = dict[int, tuple[PendingJob, float, int, tuple[str, str]]]
_STATIC_PARTS: dict[tuple[object, ...], StaticParts] = {}
_MAX_CONFIGURATIONS = 4
_ASSOCIATIONS: dict[tuple[str, str], tuple[str, str]] = {}  # (account, user) pairs seen, each one object


def _static_parts(fingerprint: tuple[object, ...]) -> StaticParts:
    found = _STATIC_PARTS.pop(fingerprint, None)
    if found is None:
        found = {}
        while len(_STATIC_PARTS) >= _MAX_CONFIGURATIONS:
            del _STATIC_PARTS[next(iter(_STATIC_PARTS))]
    _STATIC_PARTS[fingerprint] = found  # most recently used last
    return found


class _AccountingFacts:
    """What PriorityContext reads of one accounting object alone, computed once for it (contexts of
    successive cycles share the accounting object until it changes), and the static parts' memo the last
    context of this accounting found (PriorityContext._static_memo)."""

    __slots__ = ("qos_factor", "partition_factor", "default_limit", "fingerprint", "last_static")

    def __init__(self, accounting: Accounting) -> None:
        top_qos = max((q.priority for q in accounting.qos), default=0)
        self.qos_factor = {q.name: (q.priority / top_qos if top_qos > 0 else 0.0) for q in accounting.qos}
        top_part = max((p.priority for p in accounting.partitions), default=0)
        self.partition_factor = {
            p.name: (p.priority / top_part if top_part > 0 else 0.0) for p in accounting.partitions
        }
        self.default_limit = {p.name: p.default_time_s for p in accounting.partitions}
        self.fingerprint = (accounting.default_qos, tuple(sorted(self.qos_factor.items())),
                            tuple(sorted(self.partition_factor.items())), tuple(sorted(self.default_limit.items())))
        self.last_static: tuple[PriorityWeights, int, StaticParts] | None = None


# The facts of the last few accounting objects, most recently used last, each with the object itself (so
# that its id is not reused while it is here).
_FACTS: list[tuple[Accounting, _AccountingFacts]] = []


def _accounting_facts(accounting: Accounting) -> _AccountingFacts:
    for at, (known, facts) in enumerate(_FACTS):
        if known is accounting:
            if at != len(_FACTS) - 1:
                _FACTS.append(_FACTS.pop(at))
            return facts
    facts = _AccountingFacts(accounting)
    if len(_FACTS) >= _MAX_CONFIGURATIONS:
        del _FACTS[0]
    _FACTS.append((accounting, facts))
    return facts
