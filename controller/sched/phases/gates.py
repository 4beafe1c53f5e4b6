"""Gates (the Kubernetes framework's PreFilter): may a job be considered this cycle at all? Checks that need
no placement: held, dependency, begin time, partition and QoS rules, -d singleton, array limit, quota, and
the bounded work of a cycle. A job stopped here does not hold back the jobs behind it (except, without
backfill, the partition a blocked job holds)."""

from __future__ import annotations

from garrison.controller.sched.cycle_state import CycleState
from garrison.controller.sched.dependencies import (
    DependencyStatus,
    JobDependencies,
    delay_ends,
    dependency_status,
)
from garrison.controller.sched.plan import Reason
from garrison.controller.sched.snapshot import PendingJob
from garrison.model.accounts import PartitionDef


def dependency_wait(state: CycleState, dependencies: JobDependencies) -> str | None:
    """Why a job with these dependencies waits this cycle (None: they are satisfied). The same for every job
    given the same object within a cycle, so decided once per object."""
    found = state.dependency_waits.get(id(dependencies))
    if found is not None and found[0] is dependencies:
        return found[1]
    key = dependencies.singleton_key
    status = dependency_status(dependencies, key is not None and key in state.snapshot.running_names, state.now)
    if status == DependencyStatus.SATISFIED:
        reason = None
    else:
        ends = delay_ends(dependencies, state.now)
        if ends is not None and (state.wake_at is None or ends < state.wake_at):
            state.wake_at = ends  # an after:JOB+MINUTES delay ends then: the plan changes, though nothing else does
        reason = Reason.DEPENDENCY if status == DependencyStatus.WAITING else Reason.DEPENDENCY_NEVER_SATISFIED
    state.dependency_waits[id(dependencies)] = (dependencies, reason)
    return reason


def standing_reason(state: CycleState, job: PendingJob) -> str | None:
    """Held, or a dependency not satisfied: the gates' first answers, which read nothing of the job's partition,
    time limit or shape. The cycle asks them before it makes the job's placement request, so a queue of
    50,000 held or dependent jobs costs no request each (~340 bytes a job kept from cycle to cycle, and the
    work of making it; issue 23's 2 KB per pending job)."""
    if job.held:
        return Reason.HELD
    if job.dependencies is not None:
        return dependency_wait(state, job.dependencies)
    return None


def policy_reason(state: CycleState, job: PendingJob, partition: PartitionDef | None, limit: int) -> str | None:
    """Held, dependency, and the partition's and QoS's rules."""
    standing = standing_reason(state, job)
    if standing is not None:
        return standing
    accounting = state.snapshot.accounting
    if accounting.partitions:
        if partition is None:
            return Reason.PARTITION_INVALID
        if limit > partition.max_time_s:
            return Reason.PARTITION_TIME_LIMIT
        if partition.allowed_accounts and not accounting.partition_allows_account(partition, job.account_name):
            return Reason.ACCOUNT_NOT_ALLOWED
    qos_name = job.qos_name or state.default_qos
    if partition is not None and partition.allowed_qos and qos_name not in partition.allowed_qos:
        return Reason.QOS_NOT_ALLOWED
    qos = accounting.qos_map.get(qos_name)
    if qos is not None and qos.max_time_s is not None and limit > qos.max_time_s:
        return Reason.QOS_TIME_LIMIT
    return None


def gate(state: CycleState, job: PendingJob, partition: PartitionDef | None, limit: int) -> str | None:
    """Why the job waits without being placed this cycle, or None if placement should look at it."""
    reason = policy_reason(state, job, partition, limit)
    if reason is not None:
        return reason
    begin = job.spec.begin_time
    if begin is not None and begin > state.now:
        if state.wake_at is None or begin < state.wake_at:
            state.wake_at = begin  # the plan changes when it comes, though nothing else does
        return Reason.BEGIN_TIME
    if job.dependencies is not None and job.dependencies.singleton_key in state.singletons_started:
        return Reason.DEPENDENCY  # -d singleton: one of a user's namesakes starts per cycle
    array_limit = job.spec.array_max_running
    if job.array_job_id is not None and array_limit is not None and state.array_running[job.array_job_id] >= array_limit:
        return Reason.ARRAY_LIMIT
    quota = state.quotas.blocked_by(job, job.spec.total_gpus(), limit)
    if quota is not None:
        return quota
    config = state.config
    if ((not config.backfill and job.partition in state.blocked_partitions) or state.failed >= config.max_job_test
            or len(state.starts) >= config.max_starts_per_cycle):
        return Reason.PRIORITY  # bounded work: a deep queue costs a dict lookup per job, not a placement
    return None


def is_plain(state: CycleState, job: PendingJob, partition: PartitionDef | None, limit: int) -> bool:
    """True for a job that only the quota and bounded-work gates can stop: not held, no dependency, no begin
    time, no array, and allowed by its partition's and QoS's rules. All of that depends only on the job, its
    partition and the accounting, so the cycle remembers it per job view instead of asking every cycle."""
    return (not job.held and job.dependencies is None and job.spec.begin_time is None
            and job.array_job_id is None and policy_reason(state, job, partition, limit) is None)
