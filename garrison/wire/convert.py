"""Where protobuf messages and domain types meet (with convert_admin.py for the admin and accounting
services, which convert controller-only accounting types). Kept light: gsub and gqueue import it on every call."""

from __future__ import annotations

from garrison.model.domain import (
    Allocation,
    AttemptUsage,
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
from garrison.model.launch import LaunchDescription
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert_spec import spec_to_pb as spec_to_pb


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
        features=list(inv.features),
        containment=inv.containment,
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
        features=tuple(msg.features),
        containment=msg.containment,
    )


class InvalidRequest(ValueError):
    """A request that fails validation; maps to INVALID_ARGUMENT with this one-line message."""


def spec_from_pb(msg: pb.JobSpec) -> JobSpec:
    """Decode a spec. Only decoding happens here; the controller validates the values (validate.py)."""
    try:
        launch = LaunchMode(msg.launch or "rank")
    except ValueError:
        raise InvalidRequest(f"unknown launch mode {msg.launch[:20]!r} (expected rank, node, single or allocation)") from None
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
        dependency=msg.dependency or None,
        exclude=tuple(msg.exclude),
        begin_time=msg.begin_time if msg.HasField("begin_time") else None,
        nice=msg.nice,
        umask=msg.umask if msg.HasField("umask") else None,
        gpu_mem_mb=msg.gpu_mem_mb,
        submit_host=msg.submit_host or None,
        submit_dir=msg.submit_dir or None,
        constraint=msg.constraint or None,
        nodelist=tuple(msg.nodelist),
        exclusive=msg.exclusive,
        ntasks=msg.ntasks if msg.HasField("ntasks") else None,
        cpus_per_task=msg.cpus_per_task if msg.HasField("cpus_per_task") else None,
        gpus_per_task=msg.gpus_per_task if msg.HasField("gpus_per_task") else None,
        ntasks_per_gpu=msg.ntasks_per_gpu if msg.HasField("ntasks_per_gpu") else None,
        cpus_per_node=msg.cpus_per_node,
        mem_per_gpu_mb=msg.mem_per_gpu_mb,
        mem_per_cpu_mb=msg.mem_per_cpu_mb,
        comment=msg.comment or None,
        open_mode=msg.open_mode or None,
        mem_whole_node=msg.mem_whole_node,
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
    if job.spec.array_max_running is not None:
        msg.array_max_running = job.spec.array_max_running
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
            if att.usage is not None:
                info.usage.CopyFrom(attempt_usage_to_pb(att.usage))
            msg.attempts.append(info)
    return msg


def node_to_pb(
    node: Node, allocated: list[int], connected: bool, allocated_cpus: int = 0, allocated_memory_mb: int = 0
) -> pb.NodeInfo:
    return pb.NodeInfo(
        name=node.name,
        state=node.state.value if connected or node.state.value != "UP" else "UNKNOWN",
        reason=node.reason,
        inventory=inventory_to_pb(node.inventory),
        allocated_gpus=sorted(allocated),
        last_heartbeat=node.last_heartbeat,
        allocated_cpus=allocated_cpus,
        allocated_memory_mb=allocated_memory_mb,
    )


MAX_RESULT_ERROR_CHARS = 4096


def result_from_pb(msg: pb.JobResult) -> NodeResult:
    return NodeResult(
        job_id=msg.job_id,
        attempt=msg.attempt,
        # Error texts end up in job reasons and the store: keep a long one to its first few kilobytes.
        ranks=tuple(RankOutcome(r.rank, r.exit_code, r.error[:MAX_RESULT_ERROR_CHARS]) for r in msg.ranks),
        error=msg.error[:MAX_RESULT_ERROR_CHARS],
        lease_expired=msg.lease_expired,
        launch_failed=msg.launch_failed,
        supervisor_lost=msg.supervisor_lost,
        usage=attempt_usage_from_pb(msg.usage) if msg.HasField("usage") else None,
        out_of_memory=msg.out_of_memory,
    )


def attempt_usage_to_pb(usage: AttemptUsage) -> pb.ContainmentUsage:
    msg = pb.ContainmentUsage(oom_kills=usage.oom_kills)
    if usage.max_rss_bytes is not None:
        msg.max_rss_bytes = usage.max_rss_bytes
    if usage.cpu_time_s is not None:
        msg.cpu_time_s = usage.cpu_time_s
    if usage.gpu_utilization_pct is not None:
        msg.gpu_utilization_pct = usage.gpu_utilization_pct
    if usage.gpu_memory_bytes is not None:
        msg.gpu_memory_bytes = usage.gpu_memory_bytes
    return msg


def attempt_usage_from_pb(msg: pb.ContainmentUsage) -> AttemptUsage:
    """An agent's figures, kept to what they can be (an agent is trusted, but its numbers are still checked)."""
    utilization = msg.gpu_utilization_pct if msg.HasField("gpu_utilization_pct") else None
    if utilization is not None and not 0.0 <= utilization <= 100.0:
        utilization = None
    cpu = msg.cpu_time_s if msg.HasField("cpu_time_s") else None
    if cpu is not None and not cpu >= 0.0:  # NaN too
        cpu = None
    return AttemptUsage(
        max_rss_bytes=msg.max_rss_bytes if msg.HasField("max_rss_bytes") else None,
        cpu_time_s=cpu,
        gpu_utilization_pct=utilization,
        gpu_memory_bytes=msg.gpu_memory_bytes if msg.HasField("gpu_memory_bytes") else None,
        oom_kills=msg.oom_kills,
    )


def launch_to_pb(launch: LaunchDescription) -> pb.LaunchJob:
    msg = pb.LaunchJob(
        job_id=launch.job_id,
        attempt=launch.attempt,
        user=launch.user,
        uid=launch.uid,
        gid=launch.gid,
        spec=spec_to_pb(launch.spec),
        allocation=allocation_to_pb(launch.allocation),
        node_rank=launch.node_rank,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        restart_count=launch.restart_count,
        kill_wait_s=launch.kill_wait_s,
        time_limit_s=launch.time_limit_s,
        account=launch.account,
        partition=launch.partition,
        qos=launch.qos,
        cluster_name=launch.cluster_name,
        array_task_count=launch.array_task_count,
        array_task_min=launch.array_task_min,
        array_task_max=launch.array_task_max,
        array_task_step=launch.array_task_step,
        batch_signal=launch.batch_signal,
        start_time=launch.start_time,
        start_barrier=launch.start_barrier,
    )
    if launch.array_job_id is not None:
        msg.array_job_id = launch.array_job_id
    if launch.array_task_id is not None:
        msg.array_task_id = launch.array_task_id
    return msg


def launch_from_pb(msg: pb.LaunchJob) -> LaunchDescription:
    return LaunchDescription(
        job_id=msg.job_id,
        attempt=msg.attempt,
        user=msg.user,
        uid=msg.uid,
        gid=msg.gid,
        spec=spec_from_pb(msg.spec),
        allocation=allocation_from_pb(list(msg.allocation)),
        node_rank=msg.node_rank,
        master_addr=msg.master_addr,
        master_port=msg.master_port,
        restart_count=msg.restart_count,
        kill_wait_s=msg.kill_wait_s,
        time_limit_s=msg.time_limit_s,
        array_job_id=msg.array_job_id if msg.HasField("array_job_id") else None,
        array_task_id=msg.array_task_id if msg.HasField("array_task_id") else None,
        account=msg.account,
        partition=msg.partition,
        qos=msg.qos,
        cluster_name=msg.cluster_name,
        array_task_count=msg.array_task_count,
        array_task_min=msg.array_task_min,
        array_task_max=msg.array_task_max,
        array_task_step=msg.array_task_step,
        batch_signal=msg.batch_signal,
        start_time=msg.start_time,
        start_barrier=msg.start_barrier,
    )
