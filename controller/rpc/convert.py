"""The only place where protobuf messages and domain types meet."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from garrison.controller.accounts import UNSET, Account, Accounting, PartitionDef, Qos, User
from garrison.controller.domain import (
    Allocation,
    Attempt,
    Gpu,
    Job,
    JobSpec,
    LaunchMode,
    Node,
    NodeAllocation,
    NodeInventory,
    NodeResult,
    RankOutcome,
)
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import garrison_pb2 as pb

if TYPE_CHECKING:  # not at run time: the agent imports this module and needs no store (nor SQLAlchemy)
    from garrison.controller.admin import PendingLine, UsageLine
    from garrison.controller.sched.priority import PriorityWeights
    from garrison.controller.store.interface import UsageRow


def inventory_to_pb(inv: NodeInventory) -> pb.NodeInventory:
    return pb.NodeInventory(
        hostname=inv.hostname,
        gpus=[
            pb.GpuInfo(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                memory_mib=g.memory_mib,
                pci_bus_id=g.pci_bus_id,
                numa_node=g.numa_node,
                cpu_affinity=g.cpu_affinity,
                mig_enabled=g.mig_enabled,
            )
            for g in inv.gpus
        ],
        nvlink=[pb.IntRow(values=list(row)) for row in inv.nvlink],
        topo=[pb.LabelRow(values=list(row)) for row in inv.topo],
        cpus=inv.cpus,
        memory_mb=inv.memory_mb,
        model=inv.model,
    )


def inventory_from_pb(msg: pb.NodeInventory) -> NodeInventory:
    return NodeInventory(
        hostname=msg.hostname,
        gpus=tuple(
            Gpu(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                memory_mib=g.memory_mib,
                pci_bus_id=g.pci_bus_id,
                numa_node=g.numa_node,
                cpu_affinity=g.cpu_affinity,
                mig_enabled=g.mig_enabled,
            )
            for g in msg.gpus
        ),
        nvlink=tuple(tuple(row.values) for row in msg.nvlink),
        topo=tuple(tuple(row.values) for row in msg.topo),
        cpus=msg.cpus,
        memory_mb=msg.memory_mb,
        model=msg.model,
    )


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        name=spec.name,
        command=list(spec.command),
        gpu_type=spec.gpu_type or "",
        cpus_per_gpu=spec.cpus_per_gpu,
        mem_mb=spec.mem_mb,
        account=spec.account or "",
        partition=spec.partition or "",
        workdir=spec.workdir,
        env=dict(spec.env),
        output=spec.output or "",
        error=spec.error or "",
        launch=spec.launch.value,
        no_requeue=not spec.requeue,
        max_restarts=spec.max_restarts,
        qos=spec.qos or "",
        signal=spec.signal or "",
        gpu_mem_mb=spec.gpu_mem_mb,
    )
    if spec.script is not None:
        msg.script = spec.script
    if spec.nodes is not None:
        msg.nodes = spec.nodes
    if spec.gpus is not None:
        msg.gpus = spec.gpus
    if spec.gpus_per_node is not None:
        msg.gpus_per_node = spec.gpus_per_node
    if spec.time_limit_s is not None:
        msg.time_limit_s = spec.time_limit_s
    if spec.ntasks_per_node is not None:
        msg.ntasks_per_node = spec.ntasks_per_node
    if spec.umask is not None:
        msg.umask = spec.umask
    return msg


class InvalidRequest(ValueError):
    """A request that fails validation; maps to INVALID_ARGUMENT with this one-line message."""


def spec_from_pb(msg: pb.JobSpec) -> JobSpec:
    """Decode a spec. Only decoding happens here; the controller validates the values (validate.py)."""
    try:
        launch = LaunchMode(msg.launch or "rank")
    except ValueError:
        raise InvalidRequest(f"unknown launch mode {msg.launch[:20]!r} (expected rank, node or single)") from None
    return JobSpec(
        name=msg.name,
        command=tuple(msg.command),
        script=msg.script if msg.HasField("script") else None,
        nodes=msg.nodes if msg.HasField("nodes") else None,
        gpus=msg.gpus if msg.HasField("gpus") else None,
        gpus_per_node=msg.gpus_per_node if msg.HasField("gpus_per_node") else None,
        gpu_type=msg.gpu_type or None,
        cpus_per_gpu=msg.cpus_per_gpu,
        mem_mb=msg.mem_mb,
        time_limit_s=msg.time_limit_s if msg.HasField("time_limit_s") else None,
        account=msg.account or None,
        partition=msg.partition or None,
        workdir=msg.workdir,
        env=dict(msg.env),
        output=msg.output or None,
        error=msg.error or None,
        launch=launch,
        ntasks_per_node=msg.ntasks_per_node if msg.HasField("ntasks_per_node") else None,
        requeue=not msg.no_requeue,
        max_restarts=msg.max_restarts,
        qos=msg.qos or None,
        signal=msg.signal or None,
        umask=msg.umask if msg.HasField("umask") else None,
        gpu_mem_mb=msg.gpu_mem_mb,
    )


def allocation_to_pb(allocation: Allocation) -> list[pb.NodeAllocation]:
    return [pb.NodeAllocation(node=n.node, gpus=list(n.gpus), cpus=list(n.cpus), mem_mb=n.mem_mb)
            for n in allocation.nodes]


def allocation_from_pb(nodes: list[pb.NodeAllocation]) -> Allocation:
    return Allocation(
        tuple(NodeAllocation(node=n.node, gpus=tuple(n.gpus), cpus=tuple(n.cpus), mem_mb=n.mem_mb) for n in nodes)
    )


def job_to_pb(job: Job, now: float, with_spec: bool = False) -> pb.JobInfo:
    attempt = job.current_attempt
    node_list = list(attempt.allocation.node_names) if attempt is not None else []
    gpus = attempt.allocation.gpu_count() if attempt is not None else job.spec.total_gpus()
    msg = pb.JobInfo(
        job_id=job.job_id,
        display_id=job.display_id,
        name=job.spec.name,
        user=job.user,
        uid=job.uid,
        account=job.account,
        partition=job.partition,
        state=job.state.value,
        reason=job.reason,
        priority=job.priority,
        submit_time=job.submit_time,
        start_time=job.start_time or 0.0,
        end_time=job.end_time or 0.0,
        time_limit_s=job.time_limit_s,
        gpus=gpus,
        nodes=len(node_list) if node_list else (job.spec.nodes or 1),
        node_list=node_list,
        restart_count=job.restart_count,
        now=now,
    )
    if job.exit_code is not None:
        msg.exit_code = job.exit_code
    if job.array_job_id is not None:
        msg.array_job_id = job.array_job_id
    if job.array_task_id is not None:
        msg.array_task_id = job.array_task_id
    if with_spec:
        spec = spec_to_pb(job.spec)
        spec.ClearField("env")  # the environment can hold secrets; gjob shows the rest
        msg.spec.CopyFrom(spec)
        for att in job.attempts:
            info = pb.AttemptInfo(
                attempt=att.attempt,
                allocation=allocation_to_pb(att.allocation),
                state=att.state.value,
                start_time=att.start_time,
                end_time=att.end_time or 0.0,
                reason=att.reason,
            )
            if att.exit_code is not None:
                info.exit_code = att.exit_code
            msg.attempts.append(info)
    return msg


def node_to_pb(node: Node, allocated: list[int], connected: bool) -> pb.NodeInfo:
    return pb.NodeInfo(
        name=node.name,
        state=node.state.value if connected or node.state.value != "UP" else "UNKNOWN",
        reason=node.reason,
        inventory=inventory_to_pb(node.inventory),
        allocated_gpus=sorted(allocated),
        last_heartbeat=node.last_heartbeat,
    )


MAX_RESULT_ERROR_CHARS = 4096


def result_from_pb(msg: pb.JobResult) -> NodeResult:
    return NodeResult(
        job_id=msg.job_id,
        attempt=msg.attempt,
        # Error texts end up in job reasons and the store: keep a long one to its first few kilobytes.
        ranks=tuple(RankOutcome(r.rank, r.exit_code, r.error[:MAX_RESULT_ERROR_CHARS]) for r in msg.ranks),
        error=msg.error[:MAX_RESULT_ERROR_CHARS],
    )


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
    factors = line.factors
    if factors is not None:
        msg.factors.CopyFrom(adminpb.PriorityFactors(age=factors.age, fair_share=factors.fair_share, qos=factors.qos,
                                                 job_size=factors.job_size, partition=factors.partition,
                                                 admin=factors.admin))
    return msg


def priority_weights_to_pb(weights: PriorityWeights) -> adminpb.PriorityWeights:
    return adminpb.PriorityWeights(age=weights.age, fair_share=weights.fair_share, qos=weights.qos,
                               job_size=weights.job_size, partition=weights.partition)
