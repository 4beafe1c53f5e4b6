"""JobSpec -> its protobuf message (``spec_to_pb``, re-exported by convert.py, which imports every domain
type) or that message's plain form (``spec_to_plain``, garrison/plainmsg.py), which is what gsub sends:
neither gsub nor this module's import pays for more than JobSpec's module."""

from __future__ import annotations

from garrison.model.jobspec import JobSpec

TYPE_CHECKING = False  # not typing's: importing typing costs gsub ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from garrison.protos.v1 import garrison_pb2 as pb


def spec_to_plain(spec: JobSpec) -> dict[str, Any]:
    """The JobSpec message's fields by proto name; the ``optional`` ones only when the spec sets them."""
    fields: dict[str, Any] = {
        "name": spec.name,
        "command": list(spec.command),
        "gpu_type": spec.gpu_type or "",
        "cpus_per_gpu": spec.cpus_per_gpu,
        "mem_mb": spec.mem_mb,
        "account": spec.account or "",
        "partition": spec.partition or "",
        "workdir": spec.workdir,
        "env": dict(spec.env),
        "output": spec.output or "",
        "error": spec.error or "",
        "launch": spec.launch.value,
        "no_requeue": not spec.requeue,
        "max_restarts": spec.max_restarts,
        "qos": spec.qos or "",
        "signal": spec.signal or "",
        "dependency": spec.dependency or "",
        "exclude": list(spec.exclude),
        "gpu_mem_mb": spec.gpu_mem_mb,
        "nice": spec.nice,
        "submit_host": spec.submit_host or "",
        "constraint": spec.constraint or "",
        "nodelist": list(spec.nodelist),
        "exclusive": spec.exclusive,
        "cpus_per_node": spec.cpus_per_node,
        "mem_per_gpu_mb": spec.mem_per_gpu_mb,
        "mem_per_cpu_mb": spec.mem_per_cpu_mb,
        "comment": spec.comment or "",
        "open_mode": spec.open_mode or "",
        "mem_whole_node": spec.mem_whole_node,
    }
    optional = {
        "script": spec.script,
        "nodes": spec.nodes,
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "time_limit_s": spec.time_limit_s,
        "ntasks_per_node": spec.ntasks_per_node,
        "umask": spec.umask,
        "begin_time": spec.begin_time,
        "ntasks": spec.ntasks,
        "cpus_per_task": spec.cpus_per_task,
        "gpus_per_task": spec.gpus_per_task,
        "ntasks_per_gpu": spec.ntasks_per_gpu,
        # Sent only where -D chose another directory than gsub's: a controller older than the field still
        # takes every other submission.
        "submit_dir": spec.submit_dir,
    }
    fields.update((name, value) for name, value in optional.items() if value is not None)
    return fields


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    from garrison.protos.v1 import garrison_pb2 as pb

    return pb.JobSpec(**spec_to_plain(spec))
