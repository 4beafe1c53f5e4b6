"""``squeue --json``: Slurm 22.05's document (its OpenAPI v0.0.38 job records), from Garrison's job records.

Every key Slurm 22.05 writes for a job is here, so a script that reads ``job["qos"]`` or ``job["flags"]`` finds
it; what Garrison does not keep has the value Slurm gives a job without it (``""``, ``0``, ``null``, ``[]``).
The values follow Slurm's, checked against ../shared/slurm-anchor: times are epoch seconds (0: not yet),
``time_limit`` is minutes (null: none), ``exit_code`` is the raw wait status (``768`` for exit 3, ``9`` for
a death by SIGKILL), array tasks each have a record, and ended jobs stay listed for ``ENDED_SHOWN_S`` (Slurm's
MinJobAge) as slurmctld keeps them.
"""

from __future__ import annotations

from garrison.cli.slurm import SLURM_RELEASE
from garrison.model.arrayfold import index_ranges
from garrison.model.hostlist import compress_hostlist

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of a command that runs in loops
if TYPE_CHECKING:
    from typing import Any

ENDED_SHOWN_S = 300.0  # Slurm's MinJobAge default: how long slurmctld keeps an ended job (and squeue lists it)


def meta() -> dict[str, Any]:
    major, minor, micro = (int(part) for part in SLURM_RELEASE.split("."))
    return {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": major, "micro": micro, "minor": minor}, "release": SLURM_RELEASE}}


def wait_status(code: int | None) -> int:
    """Slurm's exit_code: the wait status, ``CODE << 8`` for an exit, the signal for a death by one (-N)."""
    if code is None:
        return 0
    return -code if code < 0 else (code & 0xFF) << 8


def _epoch(value: float) -> int:
    return int(value) if value else 0


def job_document(job: Any, detail: Any, cluster: str, output: Any) -> dict[str, Any]:
    """One job's record. ``job`` is its ListJobs row, ``detail`` its GetJob answer (the specification and
    the attempts), ``output(pattern)`` its resolved output path (scontrol's StdOut)."""
    spec = detail.spec
    attempts = list(detail.attempts)
    allocation = list(attempts[-1].allocation) if attempts else []
    running = job.state in ("CONFIGURING", "RUNNING", "COMPLETING")
    held = allocation if running or job.end_time else []
    cpus = sum(len(a.cpus) for a in held) or (spec.cpus_per_task if spec.HasField("cpus_per_task") else 0) or 1
    node_count = job.nodes or max(len(job.node_list), 1)
    mem_mb = sum(a.mem_mb for a in held) or spec.mem_mb
    array_job = job.array_job_id if job.HasField("array_job_id") else 0
    array_task = job.array_task_id if job.HasField("array_task_id") else None
    code = job.exit_code if job.HasField("exit_code") else None
    begin = spec.begin_time if spec.HasField("begin_time") else job.submit_time
    end = job.end_time or (job.start_time + job.time_limit_s if job.start_time and job.time_limit_s else 0)
    tres = [f"cpu={cpus}"] + ([f"mem={mem_mb}M"] if mem_mb else []) + [f"node={node_count}"]
    if job.gpus:
        tres.append(f"gres/gpu={job.gpus}")
    gres = f"gpu:{spec.gpu_type + ':' if spec.gpu_type else ''}"
    allocation_job = spec.launch == "allocation"
    return {
        "account": job.account, "accrue_time": _epoch(begin), "admin_comment": "",
        "array_job_id": array_job, "array_task_id": array_task,
        "array_max_tasks": job.array_max_running if job.HasField("array_max_running") else 0,
        "array_task_string": "", "association_id": 0, "batch_features": "", "batch_flag": not allocation_job,
        "batch_host": job.node_list[0] if job.node_list and running else "", "flags": [],
        "burst_buffer": "", "burst_buffer_state": "", "cluster": cluster, "cluster_features": "",
        "command": "" if allocation_job or spec.HasField("script") else " ".join(spec.command),
        "comment": spec.comment, "container": "", "contiguous": False, "core_spec": None, "thread_spec": None,
        "cores_per_socket": None, "billable_tres": float(cpus) if running else None,
        "cpus_per_task": spec.cpus_per_task if spec.HasField("cpus_per_task") else None,
        "cpu_frequency_minimum": None, "cpu_frequency_maximum": None, "cpu_frequency_governor": None,
        "cpus_per_tres": f"gres:gpu:{spec.cpus_per_gpu}" if spec.cpus_per_gpu else "", "deadline": 0,
        "delay_boot": 0, "dependency": spec.dependency, "derived_exit_code": 0, "eligible_time": _epoch(begin),
        "end_time": _epoch(end), "excluded_nodes": ",".join(spec.exclude), "exit_code": wait_status(code),
        "features": spec.constraint, "federation_origin": "", "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": [f"{gres}{len(a.gpus)}(IDX:{index_ranges(a.gpus)})" for a in held if a.gpus] if running else [],
        "group_id": job.uid, "group_name": job.user, "job_id": job.job_id,
        **({"job_resources": {
            "nodes": compress_hostlist([a.node for a in held]), "allocated_cores": cpus,
            "allocated_hosts": len(held),
            "allocated_nodes": [{"sockets": {"0": {"cores": {str(cpu): "allocated" for cpu in a.cpus}}},
                                 "nodename": a.node, "cpus_used": 0, "memory_used": 0,
                                 "memory_allocated": a.mem_mb} for a in held],
        }} if held else {}),
        "job_state": job.state, "last_sched_evaluation": _epoch(job.now), "licenses": "", "max_cpus": 0,
        "max_nodes": 0, "mcs_label": "", "memory_per_tres": f"gres:gpu:{spec.mem_per_gpu_mb}" if spec.mem_per_gpu_mb else "",
        "name": job.name, "nodes": compress_hostlist(list(job.node_list)) if job.node_list else "",
        "nice": spec.nice or None, "tasks_per_core": None, "tasks_per_node": 0, "tasks_per_socket": None,
        "tasks_per_board": 0, "cpus": cpus, "node_count": node_count,
        "tasks": spec.ntasks if spec.HasField("ntasks") else node_count, "het_job_id": 0, "het_job_id_set": "",
        "het_job_offset": 0, "partition": job.partition, "prefer": "", "memory_per_node": spec.mem_mb or None,
        "memory_per_cpu": None, "minimum_cpus_per_node": 1, "minimum_tmp_disk_per_node": 0, "preempt_time": 0,
        "pre_sus_time": 0, "priority": job.priority, "profile": None, "qos": spec.qos, "reboot": False,
        "required_nodes": ",".join(spec.nodelist), "requeue": not spec.no_requeue, "resize_time": 0,
        "restart_cnt": job.restart_count, "resv_name": "", "shared": None,
        "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"], "sockets_per_board": 0, "sockets_per_node": None,
        "start_time": _epoch(job.start_time), "state_description": "", "state_reason": job.reason or "None",
        "standard_error": "" if allocation_job else output(spec.error or spec.output),
        "standard_input": "/dev/null",
        "standard_output": "" if allocation_job else output(spec.output),
        "submit_time": _epoch(job.submit_time), "suspend_time": 0, "system_comment": "",
        "time_limit": job.time_limit_s // 60 if job.time_limit_s else None, "time_minimum": 0,
        "threads_per_core": None, "tres_bind": "", "tres_freq": "", "tres_per_job": "",
        "tres_per_node": f"gres:gpu:{job.gpus // node_count}" if job.gpus and spec.HasField("gpus_per_node")
        else "", "tres_per_socket": "", "tres_per_task": "",
        "tres_req_str": ",".join(tres), "tres_alloc_str": ",".join(tres) if held else "",
        "user_id": job.uid, "user_name": job.user, "wckey": "", "current_working_directory": spec.workdir,
    }


def squeue_document(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"meta": meta(), "errors": [], "jobs": jobs}


def node_document(node: Any, state: str, gres: str, gres_used: str) -> dict[str, Any]:
    """One node's record in ``sinfo --json``: ``state`` is sinfo's long state (idle, mixed, ...), ``gres`` and
    ``gres_used`` sinfo's texts for it."""
    import os

    inventory = node.inventory
    cpus = inventory.cpus
    uname = os.uname()
    memory = f"{inventory.memory_mb / 1024:.2f}G" if inventory.memory_mb >= 1024 else f"{inventory.memory_mb}M"
    flags = {"draining": ["DRAIN"], "drained": ["DRAIN"], "down*": ["NOT_RESPONDING"]}.get(state, [])
    return {
        "architecture": uname.machine, "burstbuffer_network_address": "", "boards": 1, "boot_time": 0,
        "comment": "", "cores": cpus, "cpu_binding": 0, "cpu_load": 0, "extra": "", "free_memory": None,
        "cpus": cpus, "last_busy": int(node.last_heartbeat), "features": ",".join(inventory.features),
        "active_features": ",".join(inventory.features), "gres": "" if gres == "(null)" else gres,
        "gres_drained": "N/A", "gres_used": "" if gres_used == "(null)" else gres_used, "mcs_label": "",
        "name": node.name, "next_state_after_reboot": "invalid", "address": inventory.hostname or node.name,
        "hostname": inventory.hostname or node.name, "state": state.rstrip("*").replace("draining", "mixed")
        .replace("drained", "idle"), "state_flags": flags, "next_state_after_reboot_flags": [],
        "operating_system": f"{uname.sysname} {uname.release} {uname.version}", "owner": None,
        "partitions": list(node.partitions), "port": 0, "real_memory": inventory.memory_mb,
        "reason": node.reason, "reason_changed_at": 0, "reason_set_by_user": None, "slurmd_start_time": 0,
        "sockets": 1, "threads": 1, "temporary_disk": 0, "weight": 1,
        "tres": f"cpu={cpus},mem={memory},billing={cpus}" + (f",gres/gpu={len(inventory.gpus)}" if inventory.gpus else ""),
        "slurmd_version": SLURM_RELEASE, "alloc_memory": node.allocated_memory_mb, "alloc_cpus": node.allocated_cpus,
        "idle_cpus": max(cpus - node.allocated_cpus, 0),
        "tres_used": f"cpu={node.allocated_cpus}" if node.allocated_cpus else None,
        "tres_weighted": float(node.allocated_cpus),
    }


def sinfo_document(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"meta": meta(), "errors": [], "nodes": nodes}
