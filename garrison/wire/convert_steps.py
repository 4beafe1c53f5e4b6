"""Job steps on the wire: gsrun's request, a node's step launch and the step views, both ways."""

from __future__ import annotations

from garrison.model.steps import (
    CpuBind,
    GpuBind,
    Step,
    StepLaunchDescription,
    StepLayout,
    StepNode,
    StepRequest,
)
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import InvalidRequest


def _optional(message: object, name: str) -> int | None:
    return int(getattr(message, name)) if message.HasField(name) else None  # type: ignore[attr-defined]


def step_request_from_pb(spec: pb.StepSpec) -> StepRequest:
    try:
        gpu_bind = GpuBind(spec.gpu_bind)
    except ValueError:
        raise InvalidRequest(f"--gpu-bind: unknown binding {spec.gpu_bind!r}") from None
    try:
        cpu_bind = CpuBind(spec.cpu_bind)
    except ValueError:
        raise InvalidRequest(f"--cpu-bind: unknown binding {spec.cpu_bind!r}") from None
    return StepRequest(
        argv=tuple(spec.argv),
        env=dict(spec.env),
        cwd=spec.cwd,
        ntasks=_optional(spec, "ntasks"),
        nodes=_optional(spec, "nodes"),
        ntasks_per_node=_optional(spec, "ntasks_per_node"),
        gpus_per_task=_optional(spec, "gpus_per_task"),
        cpus_per_task=_optional(spec, "cpus_per_task"),
        nodelist=tuple(spec.nodelist),
        gpu_bind=gpu_bind,
        gpu_bind_arg=tuple(spec.gpu_bind_arg),
        cpu_bind=cpu_bind,
        cpu_bind_arg=tuple(spec.cpu_bind_arg),
        label=spec.label,
        kill_on_bad_exit=spec.kill_on_bad_exit,
        pty=spec.pty,
        unbuffered=spec.unbuffered,
        name=spec.name,
    )


def step_request_to_pb(job_id: int, request: StepRequest, umask: int | None = None) -> pb.StepSpec:
    message = pb.StepSpec(
        job_id=job_id, argv=list(request.argv), env=dict(request.env), cwd=request.cwd,
        nodelist=list(request.nodelist), gpu_bind=request.gpu_bind.value, gpu_bind_arg=list(request.gpu_bind_arg),
        cpu_bind=request.cpu_bind.value, cpu_bind_arg=list(request.cpu_bind_arg), label=request.label,
        kill_on_bad_exit=request.kill_on_bad_exit, pty=request.pty, unbuffered=request.unbuffered, name=request.name,
    )
    for name in ("ntasks", "nodes", "ntasks_per_node", "gpus_per_task", "cpus_per_task"):
        value = getattr(request, name)
        if value is not None:
            setattr(message, name, value)
    if umask is not None:
        message.umask = umask
    return message


def _node_to_pb(node: StepNode) -> pb.StepNodeTasks:
    return pb.StepNodeTasks(
        node=node.node, tasks=list(node.tasks),
        task_gpus=[pb.IntRow(values=list(g)) for g in node.task_gpus],
        task_cpus=[pb.IntRow(values=list(c)) for c in node.task_cpus],
        held_gpus=list(node.held_gpus), held_cpus=list(node.held_cpus),
    )


def _node_from_pb(node: pb.StepNodeTasks) -> StepNode:
    return StepNode(
        node=node.node, tasks=tuple(node.tasks),
        task_gpus=tuple(tuple(row.values) for row in node.task_gpus),
        task_cpus=tuple(tuple(row.values) for row in node.task_cpus),
        held_gpus=tuple(node.held_gpus), held_cpus=tuple(node.held_cpus),
    )


def step_launch_to_pb(launch: StepLaunchDescription) -> pb.StepLaunch:
    message = pb.StepLaunch(
        job_id=launch.job_id, step_id=launch.step_id, user=launch.user, uid=launch.uid, gid=launch.gid,
        argv=list(launch.argv), env=dict(launch.env), cwd=launch.cwd,
        nodes=[_node_to_pb(n) for n in launch.layout.nodes], node_index=launch.node_index,
        master_addr=launch.master_addr, master_port=launch.master_port, kill_wait_s=launch.kill_wait_s,
        pty=launch.pty, unbuffered=launch.unbuffered,
    )
    if launch.umask is not None:
        message.umask = launch.umask
    return message


def step_launch_from_pb(message: pb.StepLaunch) -> StepLaunchDescription:
    layout = StepLayout(nodes=tuple(_node_from_pb(n) for n in message.nodes))
    if not layout.nodes or message.node_index >= len(layout.nodes) or not message.argv:
        raise InvalidRequest("a step launch needs its nodes, the receiving node's index and a command")
    return StepLaunchDescription(
        job_id=message.job_id, step_id=message.step_id, user=message.user, uid=message.uid, gid=message.gid,
        argv=tuple(message.argv), env=dict(message.env), cwd=message.cwd, layout=layout,
        node_index=message.node_index, master_addr=message.master_addr, master_port=message.master_port,
        kill_wait_s=message.kill_wait_s, pty=message.pty, unbuffered=message.unbuffered,
        umask=message.umask if message.HasField("umask") else None,
    )


def step_to_pb(step: Step) -> pb.StepInfo:
    info = pb.StepInfo(
        job_id=step.job_id, step_id=step.step_id, name=step.name, user=step.user, state=step.state.value,
        start_time=step.start_time, end_time=step.end_time or 0.0, ntasks=step.layout.ntasks,
        nodes=list(step.layout.node_names), gpus=sum(len(n.held_gpus) for n in step.layout.nodes),
        reason=step.reason,
    )
    if step.exit_code is not None:
        info.exit_code = step.exit_code
    return info
