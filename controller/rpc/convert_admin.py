"""Protobuf <-> domain for the admin and accounting services (protos/v1/admin.proto, accounting.proto).

Split from convert.py, which the CLI's hot path (gsub, gqueue) imports: these conversions pull in the
accounting model and two more generated modules that a job submission never needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from garrison.model.accounts import UNSET, Account, Accounting, PartitionDef, Qos, User
from garrison.model.domain import Attempt, Job
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.wire.convert import allocation_to_pb, attempt_usage_to_pb, job_to_pb

if TYPE_CHECKING:  # not at run time: keep SQLAlchemy and the scheduler out of this module's imports
    from garrison.controller.admin import PendingLine, UsageLine
    from garrison.controller.sched.priority import PriorityWeights
    from garrison.controller.store.interface import UsageRow


# -- accounting (protos/v1/accounting.proto) ---------------------------------------------------------------


def attempt_gpu_seconds(job: Job, attempt: Attempt, now: float) -> float:
    """GPU time an attempt held: its GPUs x its duration, up to ``now`` while it runs (the store's rule)."""
    end = attempt.end_time if attempt.end_time is not None else (job.end_time if job.end_time is not None else now)
    return attempt.allocation.gpu_count() * max(end - attempt.start_time, 0.0)


def job_record_to_pb(job: Job, now: float) -> apb.JobRecord:
    attempts = []
    for att in job.attempts:
        record = apb.AttemptRecord(
            attempt=att.attempt,
            state=att.state.value,
            start_time=att.start_time,
            end_time=att.end_time or 0.0,
            reason=att.reason,
            allocation=allocation_to_pb(att.allocation),
            gpus=att.allocation.gpu_count(),
            gpu_seconds=attempt_gpu_seconds(job, att, now),
        )
        if att.exit_code is not None:
            record.exit_code = att.exit_code
        if att.usage is not None:
            record.usage.CopyFrom(attempt_usage_to_pb(att.usage))
        attempts.append(record)
    msg = apb.JobRecord(
        job_id=job.job_id,
        display_id=job.display_id,
        name=job.spec.name,
        user=job.user,
        uid=job.uid,
        account=job.account,
        partition=job.partition,
        state=job.state.value,
        reason=job.reason,
        submit_time=job.submit_time,
        start_time=job.start_time or 0.0,
        end_time=job.end_time or 0.0,
        time_limit_s=job.time_limit_s,
        requested_gpus=job.spec.total_gpus(),
        restart_count=job.restart_count,
        attempts=attempts,
        gpu_seconds=sum(a.gpu_seconds for a in attempts),
        comment=job.spec.comment or "",
        workdir=job.spec.workdir,
        qos=job.spec.qos or "",
        constraint=job.spec.constraint or "",
        gid=job.gid,
    )
    if job.exit_code is not None:
        msg.exit_code = job.exit_code
    return msg


def usage_to_pb(row: UsageRow) -> apb.UsageRecord:
    return apb.UsageRecord(
        account=row.account, user=row.user, gpu_seconds=row.gpu_seconds, jobs=row.jobs, attempts=row.attempts
    )


# -- Admin service (protos/v1/admin.proto): accounting data, usage, queue details -------------------------
# A modify sends only what changes: an optional field that is absent maps to UNSET ("leave as it is"); a
# limit sent as a negative number maps to None ("no limit").


def _optional(msg: Any, name: str) -> object:
    return getattr(msg, name) if msg.HasField(name) else UNSET


def _limit(msg: Any, name: str) -> object:
    if not msg.HasField(name):
        return UNSET
    value = getattr(msg, name)
    return None if value < 0 else value


def _names(msg: Any, name: str) -> object:
    return tuple(getattr(msg, name).values) if msg.HasField(name) else UNSET


def policy_to_pb(accounting: Accounting) -> adminpb.PolicyInfo:
    msg = adminpb.PolicyInfo(
        accounts=[
            adminpb.AccountInfo(name=a.name, parent=a.parent or "", shares=a.shares, allowed_qos=list(a.allowed_qos),
                            description=a.description)
            for a in accounting.accounts
        ],
        users=[
            adminpb.UserInfo(name=u.name, default_account=u.default_account,
                         accounts=[adminpb.Membership(account=a, shares=s) for a, s in u.accounts],
                         coordinator_of=list(u.coordinator_of))
            for u in accounting.users
        ],
        partitions=[
            adminpb.PartitionInfo(name=p.name, nodes=list(p.nodes), default_time_s=p.default_time_s,
                              max_time_s=p.max_time_s, default=p.default, allowed_accounts=list(p.allowed_accounts),
                              allowed_qos=list(p.allowed_qos), priority=p.priority)
            for p in accounting.partitions
        ],
        default_account=accounting.default_account,
        default_qos=accounting.default_qos,
        enforce_associations=accounting.enforce_associations,
    )
    for q in accounting.qos:
        info = adminpb.QosInfo(name=q.name, priority=q.priority, preempts=list(q.preempts), grace_s=q.grace_s,
                           description=q.description)
        if q.max_gpus_per_user is not None:
            info.max_gpus_per_user = q.max_gpus_per_user
        if q.max_jobs_per_user is not None:
            info.max_jobs_per_user = q.max_jobs_per_user
        if q.max_time_s is not None:
            info.max_time_s = q.max_time_s
        msg.qos.append(info)
    for kind, table in (("account", accounting.account_limits), ("user", accounting.user_limits)):
        for name, limits in table:
            quota = adminpb.QuotaInfo(kind=kind, name=name)
            if limits.max_gpus is not None:
                quota.limits.max_gpus = limits.max_gpus
            if limits.max_jobs is not None:
                quota.limits.max_jobs = limits.max_jobs
            if limits.max_gpu_hours is not None:
                quota.limits.max_gpu_hours = limits.max_gpu_hours
            msg.quotas.append(quota)
    return msg


def account_from_pb(msg: adminpb.AccountChange) -> Account:
    return Account(
        name=msg.name,
        parent=msg.parent or None,
        shares=msg.shares if msg.HasField("shares") else 1,
        allowed_qos=tuple(msg.allowed_qos.values) if msg.HasField("allowed_qos") else (),
        description=msg.description,
    )


def account_changes_from_pb(msg: adminpb.AccountChange) -> dict[str, object]:
    return {"parent": _optional(msg, "parent"), "shares": _optional(msg, "shares"),
            "allowed_qos": _names(msg, "allowed_qos"), "description": _optional(msg, "description")}


def user_from_pb(msg: adminpb.UserChange) -> User:
    shares = msg.shares if msg.HasField("shares") else 1
    accounts = tuple(dict.fromkeys(msg.add_accounts))
    return User(
        name=msg.name,
        default_account=msg.default_account or (accounts[0] if accounts else ""),
        accounts=tuple((a, shares) for a in accounts),
        coordinator_of=tuple(msg.add_coordinator),
    )


def qos_from_pb(msg: adminpb.QosChange) -> Qos:
    def limit(name: str) -> int | None:
        value = _limit(msg, name)
        return None if value is UNSET or value is None else int(value)  # type: ignore[call-overload]

    return Qos(
        name=msg.name,
        priority=msg.priority,
        preempts=tuple(msg.preempts.values) if msg.HasField("preempts") else (),
        max_gpus_per_user=limit("max_gpus_per_user"),
        max_jobs_per_user=limit("max_jobs_per_user"),
        max_time_s=limit("max_time_s"),
        grace_s=msg.grace_s if msg.HasField("grace_s") else 60,
        description=msg.description,
    )


def qos_changes_from_pb(msg: adminpb.QosChange) -> dict[str, object]:
    return {
        "priority": _optional(msg, "priority"),
        "preempts": _names(msg, "preempts"),
        "max_gpus_per_user": _limit(msg, "max_gpus_per_user"),
        "max_jobs_per_user": _limit(msg, "max_jobs_per_user"),
        "max_time_s": _limit(msg, "max_time_s"),
        "grace_s": _optional(msg, "grace_s"),
        "description": _optional(msg, "description"),
    }


def partition_from_pb(msg: adminpb.PartitionChange) -> PartitionDef:
    defaults = PartitionDef(msg.name)
    return PartitionDef(
        name=msg.name,
        nodes=tuple(msg.nodes.values) if msg.HasField("nodes") else (),
        default_time_s=msg.default_time_s if msg.HasField("default_time_s") else defaults.default_time_s,
        max_time_s=msg.max_time_s if msg.HasField("max_time_s") else defaults.max_time_s,
        default=msg.default,
        allowed_accounts=tuple(msg.allowed_accounts.values) if msg.HasField("allowed_accounts") else (),
        allowed_qos=tuple(msg.allowed_qos.values) if msg.HasField("allowed_qos") else (),
        priority=msg.priority,
    )


def partition_changes_from_pb(msg: adminpb.PartitionChange) -> dict[str, object]:
    return {
        "nodes": _names(msg, "nodes"),
        "default_time_s": _optional(msg, "default_time_s"),
        "max_time_s": _optional(msg, "max_time_s"),
        "default": _optional(msg, "default"),
        "allowed_accounts": _names(msg, "allowed_accounts"),
        "allowed_qos": _names(msg, "allowed_qos"),
        "priority": _optional(msg, "priority"),
    }


def quota_changes_from_pb(msg: adminpb.QuotaChange) -> dict[str, object]:
    return {"max_gpus": _limit(msg, "max_gpus"), "max_jobs": _limit(msg, "max_jobs"),
            "max_gpu_hours": _limit(msg, "max_gpu_hours")}


def fair_share_to_pb(lines: Sequence[UsageLine]) -> list[adminpb.FairShareEntry]:
    return [
        adminpb.FairShareEntry(account=line.account, user=line.user, decayed_gpu_s=line.decayed_gpu_s,
                           period_gpu_s=line.period_gpu_s, total_gpu_s=line.total_gpu_s,
                           normalised_shares=line.normalised_shares, fair_share=line.fair_share)
        for line in lines
    ]


def pending_detail_to_pb(line: PendingLine, now: float) -> adminpb.PendingDetail:
    msg = adminpb.PendingDetail(job=job_to_pb(line.job, now), position=line.position)
    if line.estimated_start is not None:
        msg.estimated_start = line.estimated_start
    if line.priority is not None:
        msg.priority = line.priority
    msg.explanation.extend(line.explanation)
    factors = line.factors
    if factors is not None:
        msg.factors.CopyFrom(adminpb.PriorityFactors(age=factors.age, fair_share=factors.fair_share, qos=factors.qos,
                                                 job_size=factors.job_size, partition=factors.partition,
                                                 admin=factors.admin, time_limit=factors.time_limit,
                                                 nice=factors.nice))
    return msg


def priority_weights_to_pb(weights: PriorityWeights) -> adminpb.PriorityWeights:
    return adminpb.PriorityWeights(age=weights.age, fair_share=weights.fair_share, qos=weights.qos,
                               job_size=weights.job_size, partition=weights.partition,
                               time_limit=weights.time_limit)
