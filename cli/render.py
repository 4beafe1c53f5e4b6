"""Pure functions that turn controller answers into text: plain columns for pipes, rich tables for
terminals, JSON for scripts. No I/O here, so every view is testable as text."""

from __future__ import annotations

import time

from garrison.cli.usage_format import measured, usage_line
from garrison.model.arrayfold import fold, folded_id
from garrison.model.arrayfold import index_ranges as index_ranges  # sacct's, too

TYPE_CHECKING = False  # not typing's: importing typing costs gqueue ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

JOB_COLUMNS = ("JOBID", "PARTITION", "NAME", "USER", "ACCOUNT", "STATE", "TIME", "GPUS", "NODES(REASON)")
NODE_COLUMNS = ("NODE", "STATE", "GPUS(A/T)", "CPUS(A/T)", "MEM(A/T)", "MODEL", "GPU", "FEATURES", "REASON")
LIVE_STATES = ("CONFIGURING", "RUNNING", "COMPLETING")  # a job holding GPUs


def format_duration(seconds: float) -> str:
    """Slurm's elapsed-time format: M:SS, H:MM:SS, D-HH:MM:SS."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def elapsed(job: Any) -> float:
    if not job.start_time:
        return 0.0
    end = job.end_time or job.now
    return end - job.start_time


def job_row(job: Any) -> tuple[str, ...]:
    where = ",".join(job.node_list) if job.state in ("CONFIGURING", "RUNNING", "COMPLETING") else ""
    if job.state == "PENDING":
        where = f"({job.reason or 'None'})"
    elif not where and job.state not in ("CONFIGURING", "RUNNING", "COMPLETING"):
        where = ",".join(job.node_list)
    return (
        job.display_id,
        job.partition,
        job.name,
        job.user,
        job.account,
        job.state,
        format_duration(elapsed(job)),
        str(job.gpus),
        where,
    )


class FoldedArray:
    """The pending tasks of one array that wait for the same reason, shown as one row the way squeue shows
    them (garrison/model/arrayfold.py). Reads like its first task otherwise."""

    def __init__(self, tasks: Sequence[Any]) -> None:
        self._first = tasks[0]
        limit = self._first.array_max_running if self._first.HasField("array_max_running") else 0
        self.display_id = folded_id(self._first.array_job_id, [task.array_task_id for task in tasks], limit)
        self.tasks = tuple(tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._first, name)

    def HasField(self, name: str) -> bool:  # noqa: N802 - the message's own spelling
        return bool(self._first.HasField(name))


def _pending_array_group(job: Any) -> tuple[int, str, str] | None:
    if job.state != "PENDING" or not job.HasField("array_job_id") or not job.HasField("array_task_id"):
        return None
    return (job.array_job_id, job.reason, job.partition)


def fold_pending_arrays(jobs: Sequence[Any]) -> list[Any]:
    """squeue's view of job arrays (garrison/model/arrayfold.py), on listed jobs: each array's pending tasks
    that wait for the same reason become one row (``FoldedArray``); a lone pending task stays as it is."""
    return [FoldedArray(item) if isinstance(item, list) else item for item in fold(jobs, _pending_array_group)]


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]], header: bool = True) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()] if header else []
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]], show_header: bool = True) -> Any:
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False, show_header=show_header)
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    return table


def job_json(job: Any) -> dict[str, Any]:
    return {
        "job_id": job.display_id,
        "array_job_id": job.array_job_id if job.HasField("array_job_id") else None,
        "array_task_id": job.array_task_id if job.HasField("array_task_id") else None,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "state": job.state,
        "reason": job.reason,
        "submit_time": job.submit_time,
        "start_time": job.start_time or None,
        "end_time": job.end_time or None,
        "elapsed_s": round(elapsed(job), 3),
        "time_limit_s": job.time_limit_s,
        "gpus": job.gpus,
        "nodes": list(job.node_list),
        "exit_code": job.exit_code if job.HasField("exit_code") else None,
        "restart_count": job.restart_count,
    }


def jobs_json(jobs: Sequence[Any]) -> str:
    import json  # here: json imports re, ~6 ms of a gqueue that does not print JSON

    return json.dumps({"jobs": [job_json(j) for j in jobs]}, indent=2)


def node_row(node: Any) -> tuple[str, ...]:
    total = len(node.inventory.gpus)
    allocated = len(node.allocated_gpus)
    state = node.state
    if state == "UP":
        state = "IDLE" if allocated == 0 else ("ALLOCATED" if allocated >= total > 0 else "MIXED")
    gpu_model = node.inventory.gpus[0].name if node.inventory.gpus else "-"
    cpus = f"{node.allocated_cpus}/{node.inventory.cpus}"
    memory = format_memory_pair(node.allocated_memory_mb, node.inventory.memory_mb)
    features = ",".join(node.inventory.features) or "-"  # what gsub -C selects on (sinfo's AVAIL_FEATURES)
    # A node whose agent enforces nothing (allow_unconfined) says so where an admin looks for trouble.
    reason = "; ".join(part for part in (node.reason, _unconfined_note(node.inventory.containment)) if part)
    return (node.name, state, f"{allocated}/{total}", cpus, memory, node.inventory.model or "-", gpu_model,
            features, reason)


def _unconfined_note(containment: str) -> str:
    return "unconfined (jobs not contained by cgroups)" if containment == "unconfined" else ""


PARTITION_COLUMNS = ("PARTITION", "TIMELIMIT", "NODES(A/I/O/T)", "GPUS(A/I/O/T)", "NODELIST")


def partition_rows(response: Any, compress: Callable[[list[str]], str]) -> list[tuple[str, ...]]:
    """sinfo -s: per partition (the default one marked ``*``), its longest time limit, and its nodes and GPUs
    allocated (a node with any GPU in use), idle, other (drained, down or not connected) and in total."""
    rows: list[tuple[str, ...]] = []
    for partition in response.partitions:
        nodes = [n for n in response.nodes if partition.name in n.partitions]
        node_count = [0, 0, 0]
        gpu_count = [0, 0, 0]
        for node in nodes:
            total, used = len(node.inventory.gpus), len(node.allocated_gpus)
            if node.state != "UP":
                node_count[2] += 1
                gpu_count[2] += total
                continue
            node_count[0 if used else 1] += 1
            gpu_count[0] += used
            gpu_count[1] += total - used
        name = partition.name + ("*" if partition.default else "")
        limit = format_duration(partition.max_time_s) if partition.max_time_s else "infinite"
        rows.append((name, limit, "/".join(map(str, [*node_count, len(nodes)])),
                     "/".join(map(str, [*gpu_count, sum(gpu_count)])), compress([n.name for n in nodes]) or "-"))
    return rows


def format_memory_pair(allocated_mb: int, total_mb: int) -> str:
    """``allocated/total`` host memory in GiB, like sinfo's memory columns but readable: ``12/1007G``
    (a non-zero allocation under half a GiB shows as <1)."""
    if total_mb <= 0:
        return "-"
    used = "0" if allocated_mb <= 0 else ("<1" if allocated_mb < 512 else str(round(allocated_mb / 1024)))
    return f"{used}/{round(total_mb / 1024)}G"


def _no_command(spec: Any) -> str:
    if spec.launch == "allocation":
        return f"(galloc on {spec.submit_host})" if spec.submit_host else "(galloc)"
    return "(script)"


def exit_text(code: int) -> str:
    """An exit code as gjob shows it: ``3``; ``-9(SIGKILL)`` for a process that died of signal 9."""
    if code >= 0:
        return str(code)
    import signal

    try:
        return f"{code}({signal.Signals(-code).name})"
    except ValueError:
        return str(code)


def job_detail(job: Any) -> str:
    spec = job.spec
    lines = [
        f"JobId={job.display_id} JobName={job.name}",
        f"   UserId={job.user}({job.uid}) Account={job.account} Partition={job.partition}",
        f"   JobState={job.state} Reason={job.reason or 'None'} ExitCode="
        f"{exit_text(job.exit_code) if job.HasField('exit_code') else '-'} Restarts={job.restart_count}",
        f"   SubmitTime={_ts(job.submit_time)} StartTime={_ts(job.start_time)} EndTime={_ts(job.end_time)}",
        f"   RunTime={format_duration(elapsed(job))} TimeLimit={format_duration(job.time_limit_s)}",
        f"   NumNodes={job.nodes} GPUs={job.gpus} NodeList={','.join(job.node_list) or '(null)'}",
        f"   GpuType={spec.gpu_type or '(any)'} GpuMem={_mb(spec.gpu_mem_mb)} CpusPerGpu={spec.cpus_per_gpu or '-'} "
        f"MemPerNode={_mb(spec.mem_mb)}",
        f"   Launch={spec.launch or 'rank'} WorkDir={spec.workdir} Dependency={spec.dependency or '(null)'}",
        f"   ExcNodeList={','.join(spec.exclude) or '(null)'} "
        f"BeginTime={_ts(spec.begin_time) if spec.HasField('begin_time') else '(null)'} Nice={spec.nice}",
        f"   ReqNodeList={','.join(spec.nodelist) or '(null)'} Features={spec.constraint or '(null)'} "
        f"Exclusive={'yes' if spec.exclusive else 'no'}",
        f"   Command={' '.join(spec.command) if spec.command else _no_command(spec)}",
        # galloc's command writes to galloc's terminal, on the submitting host.
        "   StdOut=(galloc) StdErr=(galloc)" if spec.launch == "allocation" else
        f"   StdOut={_output_path(job, spec.output)} StdErr={_output_path(job, spec.error or spec.output)}",
        f"   NumTasks={spec.ntasks if spec.HasField('ntasks') else '-'} "
        f"CpusPerTask={spec.cpus_per_task if spec.HasField('cpus_per_task') else '-'} "
        f"MemPerGpu={_mb(spec.mem_per_gpu_mb)} OpenMode={spec.open_mode or '(truncate first attempt)'}",
    ]
    if spec.comment:
        lines.append(f"   Comment={spec.comment}")
    if spec.HasField("script") and spec.script:  # only its owner (or an admin) is sent the script
        script_lines = spec.script.splitlines()
        shown = script_lines[:SCRIPT_LINES_SHOWN]
        more = len(script_lines) - len(shown)
        lines.append("   Script=" + ("" if not shown else f"(first {len(shown)} of {len(script_lines)} lines)"
                                     if more else f"({len(shown)} lines)"))
        lines.extend(f"     | {line}" for line in shown)
    last = max((att.attempt for att in job.attempts), default=None)
    for att in job.attempts:
        where = " ".join(_node_allocation(a) for a in att.allocation)
        code = exit_text(att.exit_code) if att.HasField("exit_code") else "-"
        # An attempt's record is written when it starts and when it ends; while it runs, the job's state
        # (CONFIGURING, RUNNING, COMPLETING) is the attempt's.
        state = job.state if att.attempt == last and not att.end_time and job.state in LIVE_STATES else att.state
        lines.append(
            f"   Attempt {att.attempt}: {state} start={_ts(att.start_time)} end={_ts(att.end_time)} "
            f"exit={code} {where}" + (f" reason={att.reason}" if att.reason else "")
        )
        usage = measured(att.usage if att.HasField("usage") else None)
        if usage is not None:  # sstat's figures while it runs, sacct's once it has ended
            end = att.end_time or job.now or time.time()
            cpus = sum(len(a.cpus) for a in att.allocation)
            lines.append(f"     {usage_line(usage, max(end - att.start_time, 0.0), cpus)}")
    return "\n".join(lines)


SCRIPT_LINES_SHOWN = 10


def _output_path(job: Any, pattern: str) -> str:
    """Where rank 0 writes, as the agent resolves it (scontrol show job's StdOut=)."""
    from garrison.model.outputpath import resolve_output_path

    return resolve_output_path(
        pattern or None, workdir=job.spec.workdir, job_id=job.job_id, rank=0, node_rank=0,
        array_job_id=job.array_job_id if job.HasField("array_job_id") else None,
        array_task_id=job.array_task_id if job.HasField("array_task_id") else None,
        user=job.user, job_name=job.name,
    )


def _node_allocation(a: Any) -> str:
    """``node1:gpus=0,1`` and, when the job holds them, ``:cpus=0-7:mem=4096M``."""
    text = f"{a.node}:gpus={','.join(str(g) for g in a.gpus) or '-'}"
    if a.cpus:
        from garrison.model.cpulist import format_cpu_list

        text += f":cpus={format_cpu_list(a.cpus)}"
    if a.mem_mb:
        text += f":mem={a.mem_mb}M"
    return text


def _mb(value: int) -> str:
    return f"{value}M" if value else "-"


def _ts(value: float) -> str:
    if not value:
        return "Unknown"
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value))
