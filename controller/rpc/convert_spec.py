"""JobSpec -> protobuf: the one conversion gsub needs, apart from convert.py (re-exported there), which
imports every domain type; gsub pays for only JobSpec's module on each call."""

from __future__ import annotations

from garrison.controller.jobspec import JobSpec
from garrison.protos.v1 import garrison_pb2 as pb


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
