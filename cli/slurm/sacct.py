"""sacct under its own name: accounting records in Slurm's fields and layouts, from gacct's store.

Each job has a line (``12``, or ``12_3`` for an array task), then, once it has started, ``12.batch`` (its
batch script) and a line per gsrun step (``12.0``, ``12.1``, ...), as sacct prints them. The pending tasks
of an array that never started share one line, ``12_[4-7]``, as in sacct. submitit runs
``sacct -o JobID,State,NodeList --parsable2 -j ID ...`` and reads exactly this.
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from garrison.cli.client import EXIT_FAILURE, Client, CliError, fail, run_command
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import (
    FieldList,
    clock,
    exit_code_text,
    memory_mb,
    sacct_duration,
    sacct_state,
    split_list,
    state_names,
    user_names,
)
from garrison.cmdline.argparser import Parser, UsageError

PROG = "sacct"
# Every field sacct prints here, with its default width (negative: left-justified), as sacct's table has them.
KNOWN_FIELDS = {
    "JobID": -12, "JobIDRaw": -12, "JobName": 10, "Partition": 10, "Account": 10, "User": 9, "UID": 6,
    "State": 10, "ExitCode": 8, "DerivedExitCode": 15, "NodeList": -15, "Start": 19, "End": 19,
    "Submit": 19, "Eligible": 19, "Elapsed": 10, "ElapsedRaw": 10, "AllocCPUS": 10, "NCPUS": 10,
    "ReqCPUS": 8, "AllocTRES": -10, "ReqTRES": -10, "AllocNodes": 10, "NNodes": 8, "ReqNodes": 8,
    "NTasks": 8, "Timelimit": 10, "TimelimitRaw": 12, "Reason": -20, "MaxRSS": 10, "TotalCPU": 10,
    "CPUTime": 10, "CPUTimeRAW": 10, "ReqMem": 10, "ArrayJobID": 12, "ArrayTaskID": 12, "Suspended": 10,
    "Restarts": 8, "AllocGRES": -12, "ReqGRES": -12, "Cluster": 10, "QOS": 10,
    "Comment": 15, "WorkDir": -15, "Constraints": 19, "GID": 6, "Group": 9, "AveRSS": 10, "AveCPU": 10,
}
# The rest of Slurm 22.05's fields (sacct -e), which Garrison neither measures nor keeps: they print empty, as sacct
# prints a figure its cluster does not gather, so a script's field list (apel's `--format=...,Group,...,MaxVMSize,
# State`, `--format=ALL`) runs instead of failing on its first unknown name.
UNMEASURED_FIELDS = {
    name: 10 for name in (
        "AdminComment", "AssocID", "AveCPU", "AveCPUFreq", "AveDiskRead", "AveDiskWrite", "AvePages", "AveRSS",
        "AveVMSize", "BlockID", "Comment", "Constraints", "ConsumedEnergy", "ConsumedEnergyRaw", "Container",
        "DBIndex", "Flags", "GID", "Group", "Layout", "MaxDiskRead", "MaxDiskReadNode", "MaxDiskReadTask",
        "MaxDiskWrite", "MaxDiskWriteNode", "MaxDiskWriteTask", "MaxPages", "MaxPagesNode", "MaxPagesTask",
        "MaxRSSNode", "MaxRSSTask", "MaxVMSize", "MaxVMSizeNode", "MaxVMSizeTask", "McsLabel", "MinCPU",
        "MinCPUNode", "MinCPUTask", "Planned", "PlannedCPU", "PlannedCPURAW", "Priority", "QOSRAW", "ReqCPUFreq",
        "ReqCPUFreqGov", "ReqCPUFreqMax", "ReqCPUFreqMin", "Reservation", "ReservationId", "Reserved",
        "ResvCPU", "ResvCPURAW", "SubmitLine", "SystemComment", "SystemCPU", "TRESUsageInAve",
        "TRESUsageInMax", "TRESUsageInMaxNode", "TRESUsageInMaxTask", "TRESUsageInMin", "TRESUsageInMinNode",
        "TRESUsageInMinTask", "TRESUsageInTot", "TRESUsageOutAve", "TRESUsageOutMax", "TRESUsageOutMaxNode",
        "TRESUsageOutMaxTask", "TRESUsageOutMin", "TRESUsageOutMinNode", "TRESUsageOutMinTask",
        "TRESUsageOutTot", "UserCPU", "WCKey", "WCKeyID", "WorkDir",
    )
    if name not in KNOWN_FIELDS  # Comment, WorkDir, Group, ...: kept, above
}
SLURM_FIELDS = {**KNOWN_FIELDS, **UNMEASURED_FIELDS}
DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FIELDS = "JobID,State,ExitCode"
LONG_FIELDS = ("JobID,JobIDRaw,JobName,Partition,MaxRSS,AllocCPUS,TotalCPU,NTasks,Elapsed,State,ExitCode,"
               "DerivedExitCode,NodeList,AllocTRES,ReqTRES,Timelimit")


def parser() -> Parser:
    p = Parser(prog=PROG, add_help=False,
               description="Accounting records of jobs and steps, as Slurm's sacct (options: docs/reference.md, garrison-sacct).")
    p.add_argument("-h", "--help", action="help", help="Show this message and exit.")  # as sacct -h, sstat -h
    p.add_argument("-j", "--jobs", dest="jobs", action="append", default=[])
    p.add_argument("-o", "--format", dest="format", action="append", default=[])
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("--delimiter", default="|")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("-X", "--allocations", action="store_true")
    p.add_argument("-S", "--starttime", dest="start", default=None)
    p.add_argument("-E", "--endtime", dest="end", default=None)
    p.add_argument("-u", "--user", "--uid", dest="users", action="append", default=[])
    p.add_argument("-a", "--allusers", action="store_true")
    p.add_argument("-A", "--accounts", "--account", dest="accounts", action="append", default=[])
    p.add_argument("-r", "--partition", dest="partitions", action="append", default=[])
    p.add_argument("-s", "--state", dest="states", action="append", default=[])
    p.add_argument("--name", dest="names", action="append", default=[])
    p.add_argument("-N", "--nodelist", dest="nodelist", action="append", default=[])
    p.add_argument("-b", "--brief", action="store_true")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-e", "--helpformat", action="store_true")
    p.add_argument("-L", "--allclusters", action="store_true")  # one cluster: nothing to widen
    p.add_argument("-D", "--duplicates", action="store_true")
    p.add_argument("--array", dest="expand_arrays", action="store_true")
    p.add_argument("--units", default=None)
    p.add_argument("--noconvert", action="store_true")
    return p


# --- lines -------------------------------------------------------------------------------------------------


def _cpus(allocation: Sequence[Any]) -> int:
    """AllocCPUS: the CPUs bound on each node, and 1 on a node where the job asked for none (it is bound to
    none and shares the node's): Slurm's smallest allocation, one CPU, so that what divides by AllocCPUS
    (seff's CPU efficiency, CPUTime) has a figure, as it would have under Slurm for the same script."""
    return sum(len(node.cpus) or 1 for node in allocation)


def _hostlist(names: Sequence[str]) -> str:
    from garrison.model.hostlist import compress_hostlist

    return compress_hostlist(list(names)) if names else "None assigned"


def _tres(cpus: int, gpus: int, mem_mb: int, nodes: int) -> str:
    parts = [f"billing={cpus}", f"cpu={cpus}"]
    if gpus:
        parts.append(f"gres/gpu={gpus}")
    if mem_mb:
        parts.append(f"mem={memory_mb(mem_mb)}")
    parts.append(f"node={nodes}")
    return ",".join(parts)


def _array_ids(display_id: str, job_id: int) -> tuple[str, str]:
    base, underscore, task = display_id.partition("_")
    return (base, task) if underscore else (str(job_id), "N/A")


def _elapsed(start: float, end: float, now: float) -> float:
    return max(0.0, (end or now) - start) if start else 0.0


def _usage(attempt: Any | None) -> Any | None:
    from garrison.cli.usage_format import measured

    return measured(attempt.usage) if attempt is not None and attempt.HasField("usage") else None


def job_lines(record: Any, steps: Sequence[Any], now: float, allocations: bool = False,
              duplicates: bool = False) -> list[dict[str, str]]:
    """sacct's lines for one accounting record (apb.JobRecord) and its gsrun steps (pb.StepInfo): the job's
    current (or last) run; with ``duplicates`` (-D) each earlier run of a requeued job first, its state
    REQUEUED, NODE_FAIL or PREEMPTED as sacct -D shows them. A job pending again after a requeue shows as
    pending, without the earlier run's nodes and steps."""
    from garrison.cli.usage_format import format_bytes, format_cpu_time

    current = record.state != "PENDING"
    last = record.attempts[-1] if record.attempts and current else None
    earlier = list(record.attempts[:-1] if current else record.attempts)
    allocation = list(last.allocation) if last is not None else []
    nodes = [node.node for node in allocation]
    cpus, gpus = _cpus(allocation), (last.gpus if last is not None else record.requested_gpus)
    mem = sum(node.mem_mb for node in allocation)
    start, end = (record.start_time, record.end_time) if current else (0.0, 0.0)
    elapsed = _elapsed(start, end, now)
    usage = _usage(last)
    code = record.exit_code if record.HasField("exit_code") else None
    array_job, array_task = _array_ids(record.display_id, record.job_id)
    step_codes = [s.exit_code for s in steps if s.HasField("exit_code")]
    derived = max([c for c in [code, *step_codes] if c is not None], default=None)
    limit = record.time_limit_s
    job: dict[str, str] = {
        "JobID": record.display_id, "JobIDRaw": str(record.job_id), "JobName": record.name,
        "Partition": record.partition, "Account": record.account, "User": record.user, "UID": str(record.uid),
        "State": sacct_state(record.state, record.uid), "ExitCode": exit_code_text(code, record.state),
        "DerivedExitCode": exit_code_text(derived, record.state), "NodeList": _hostlist(nodes),
        "Start": clock(start), "End": clock(end), "Submit": clock(record.submit_time),
        "Eligible": clock(record.submit_time), "Elapsed": sacct_duration(elapsed), "ElapsedRaw": str(int(elapsed)),
        "AllocCPUS": str(cpus), "NCPUS": str(cpus), "ReqCPUS": str(cpus),
        "AllocTRES": _tres(cpus, gpus, mem, len(nodes)) if nodes else "",
        "ReqTRES": _tres(cpus, gpus, mem, max(len(nodes), 1)) if nodes else f"gres/gpu={gpus}" if gpus else "",
        "AllocNodes": str(len(nodes)), "NNodes": str(max(len(nodes), 1)), "ReqNodes": str(max(len(nodes), 1)),
        "NTasks": "", "Timelimit": sacct_duration(limit) if limit else "UNLIMITED",
        "TimelimitRaw": str(limit // 60) if limit else "UNLIMITED", "Reason": record.reason or "None",
        "MaxRSS": "", "TotalCPU": format_cpu_time(usage.cpu_time_s) if usage and usage.HasField("cpu_time_s") else "",
        "CPUTime": sacct_duration(elapsed * cpus), "CPUTimeRAW": str(int(elapsed * cpus)),
        "ReqMem": memory_mb(allocation[0].mem_mb) if allocation else "0", "ArrayJobID": array_job,
        "ArrayTaskID": array_task, "Suspended": "00:00:00", "Restarts": str(record.restart_count),
        "AllocGRES": f"gpu:{gpus}" if gpus and nodes else "", "ReqGRES": f"gpu:{gpus}" if gpus else "",
        "Cluster": "garrison", "QOS": record.qos or "normal", "Comment": record.comment, "WorkDir": record.workdir,
        "Constraints": record.constraint, "GID": str(record.gid), "Group": _group_name(record.gid),
    }
    lines = [_earlier_run(job, attempt, now) for attempt in earlier] if duplicates else []
    lines.append(job)
    if allocations or not start or last is None:
        return lines
    first = allocation[:1]
    batch_cpus = _cpus(first)
    batch = dict(job)
    batch.update({
        "JobID": f"{record.display_id}.batch", "JobIDRaw": f"{record.job_id}.batch", "JobName": "batch",
        "Partition": "", "User": "", "State": sacct_state(record.state), "NodeList": _hostlist([n.node for n in first]),
        "AllocCPUS": str(batch_cpus), "NCPUS": str(batch_cpus), "ReqCPUS": str(batch_cpus),
        "AllocTRES": _tres(batch_cpus, len(first[0].gpus) if first else 0, first[0].mem_mb if first else 0, 1),
        "ReqTRES": "", "AllocNodes": "1", "NNodes": "1", "ReqNodes": "1", "NTasks": "1", "Timelimit": "",
        "TimelimitRaw": "", "Reason": "", "DerivedExitCode": "", "Submit": clock(start),
        "Eligible": clock(start),
        "MaxRSS": format_bytes(usage.max_rss_bytes) if usage and usage.HasField("max_rss_bytes") else "",
        "CPUTime": sacct_duration(elapsed * batch_cpus), "CPUTimeRAW": str(int(elapsed * batch_cpus)),
        "AllocGRES": "", "ReqGRES": "", "Restarts": "", "Comment": "", "Constraints": "", "QOS": "",
        # One task: its average is its figure.
        "AveRSS": format_bytes(usage.max_rss_bytes) if usage and usage.HasField("max_rss_bytes") else "",
        "AveCPU": job["TotalCPU"],
    })
    lines.append(batch)
    for step in steps:
        step_elapsed = _elapsed(step.start_time, step.end_time, now)
        step_code = step.exit_code if step.HasField("exit_code") else None
        line = {key: "" for key in job}
        line.update({
            "JobID": f"{record.display_id}.{step.step_id}", "JobIDRaw": f"{record.job_id}.{step.step_id}",
            "JobName": step.name, "Account": record.account, "UID": str(record.uid),
            "State": sacct_state(step.state, record.uid), "ExitCode": exit_code_text(step_code, step.state),
            "NodeList": _hostlist(list(step.nodes)), "Start": clock(step.start_time), "End": clock(step.end_time),
            "Submit": clock(step.start_time), "Eligible": clock(step.start_time),
            "Elapsed": sacct_duration(step_elapsed), "ElapsedRaw": str(int(step_elapsed)),
            "AllocTRES": ",".join([*([f"gres/gpu={step.gpus}"] if step.gpus else []), f"node={len(step.nodes)}"]),
            "AllocNodes": str(len(step.nodes)), "NNodes": str(len(step.nodes)), "ReqNodes": str(len(step.nodes)),
            "NTasks": str(step.ntasks), "Reason": step.reason, "ArrayJobID": array_job, "ArrayTaskID": array_task,
            "Suspended": "00:00:00", "Cluster": "garrison",
        })
        lines.append(line)
    return lines


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except (KeyError, OverflowError):
        return str(gid)


def _earlier_run(job: dict[str, str], attempt: Any, now: float) -> dict[str, str]:
    """sacct -D: the line of a run the job was requeued after."""
    allocation = list(attempt.allocation)
    nodes = [node.node for node in allocation]
    cpus = _cpus(allocation)
    elapsed = _elapsed(attempt.start_time, attempt.end_time, now)
    state = attempt.state if attempt.state in ("NODE_FAIL", "PREEMPTED") else "REQUEUED"
    code = attempt.exit_code if attempt.HasField("exit_code") else None
    line = dict(job)
    line.update({
        "State": state, "ExitCode": exit_code_text(code, state), "DerivedExitCode": exit_code_text(code, state),
        "NodeList": _hostlist(nodes), "Start": clock(attempt.start_time), "End": clock(attempt.end_time),
        "Elapsed": sacct_duration(elapsed), "ElapsedRaw": str(int(elapsed)), "AllocCPUS": str(cpus),
        "NCPUS": str(cpus), "AllocNodes": str(len(nodes)), "NNodes": str(max(len(nodes), 1)),
        "AllocTRES": _tres(cpus, attempt.gpus, sum(n.mem_mb for n in allocation), len(nodes)) if nodes else "",
        "Reason": attempt.reason or "None", "CPUTime": sacct_duration(elapsed * cpus),
        "CPUTimeRAW": str(int(elapsed * cpus)), "TotalCPU": "", "MaxRSS": "",
    })
    return line


def fold_pending_tasks(records: Sequence[Any]) -> list[Any]:
    """The array tasks that never started (pending, or cancelled while pending, with the same state) share
    one record shown as ``12_[4-7]``, at the place of the first, as sacct shows an array not yet split."""
    from garrison.cli.render import index_ranges

    groups: dict[tuple[str, str], list[Any]] = {}
    order: list[Any] = []
    for record in records:
        base, underscore, task = record.display_id.partition("_")
        if not underscore or record.start_time or not task.isdigit() or record.state != "PENDING":
            order.append(record)
            continue
        key = (base, record.state)
        if key not in groups:
            groups[key] = []
            order.append(groups[key])
        groups[key].append(record)
    folded: list[Any] = []
    for item in order:
        if not isinstance(item, list):
            folded.append(item)
        elif len(item) == 1:
            folded.append(item[0])
        else:
            base = item[0].display_id.partition("_")[0]
            folded.append(_Folded(item[0], f"{base}_[{index_ranges([int(r.display_id.partition('_')[2]) for r in item])}]"))
    return folded


class _Folded:
    """A record that reads like the first of its tasks, with the folded id."""

    def __init__(self, first: Any, display_id: str) -> None:
        self._first = first
        self.display_id = display_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._first, name)

    def HasField(self, name: str) -> bool:  # noqa: N802 - the message's own spelling
        return bool(self._first.HasField(name))


def wanted_line(line: dict[str, str], step_refs: set[str]) -> bool:
    """With ``-j 12.0`` or ``-j 12.batch``, only those steps' lines (and any job asked for whole)."""
    if not step_refs:
        return True
    return line["JobID"] in step_refs or line["JobIDRaw"] in step_refs


def expand_job_refs(refs: Sequence[str]) -> tuple[list[str], set[str], set[str]]:
    """sacct's -j values: ``12``, ``12_3``, ``12_[1-3,7]``, ``12.batch``, ``12.0``. Returns the job ids to
    ask the store for, the steps asked for alone, and the jobs asked for whole."""
    jobs: list[str] = []
    steps: set[str] = set()
    whole: set[str] = set()
    for ref in refs:
        job, dot, step = ref.partition(".")
        base, underscore, task = job.partition("_")
        if not base.isdigit():
            raise UsageError(f"invalid job id {ref!r}")
        ids = [job]
        if underscore and task.startswith("[") and task.endswith("]"):
            ids = []
            for part in task[1:-1].split("%")[0].split(","):
                low, _, high = part.partition("-")
                if not low.isdigit() or (high and not high.isdigit()):
                    raise UsageError(f"invalid job id {ref!r}")
                ids += [f"{base}_{i}" for i in range(int(low), int(high or low) + 1)]
        elif underscore and not task.isdigit():
            raise UsageError(f"invalid job id {ref!r}")
        jobs += ids
        if dot:
            steps.update(f"{i}.{step}" for i in ids)
        else:
            whole.update(ids)
    return jobs, steps, whole


def render(lines: Sequence[dict[str, str]], fields: FieldList, args: Any) -> list[str]:
    parsable = "p" if args.parsable else "P" if args.parsable2 else ""
    out = fields.render(lines, header=not args.noheader, parsable=parsable)
    if parsable and args.delimiter != "|":
        out = [line.replace("|", args.delimiter) for line in out]
    return out


# --- the command -------------------------------------------------------------------------------------------


def _field_list(args: Any) -> FieldList:
    spec = ",".join(args.format) if args.format else (
        BRIEF_FIELDS if args.brief else LONG_FIELDS if args.long else DEFAULT_FIELDS)
    if spec.strip().upper() == "ALL":  # sacct --format=ALL: every field
        spec = ",".join(SLURM_FIELDS)
    return FieldList(spec, SLURM_FIELDS)


MEMORY_FIELDS = ("MaxRSS", "AveRSS", "ReqMem")
UNITS = "KMGTP"


def _unit(args: Any) -> str | None:
    """--units=[KMGTP] (a memory figure in that unit), or --noconvert (in bytes, as Slurm: ``''``)."""
    if args.units is not None:
        unit = args.units.strip().upper()
        if len(unit) != 1 or unit not in UNITS:
            raise UsageError(f"--units: expected one of K, M, G, T, P, got {args.units[:20]!r}")
        return unit
    return "" if args.noconvert else None


def in_unit(text: str, unit: str) -> str:
    """A memory figure as sacct prints it (``300.25M``, ``4G``, ``512K``) in ``unit`` (``""``: bytes): two
    decimals unless whole (``--units=G``: ``0.29G``, ``4G``). Text that is no figure is left as it is."""
    number, suffix = text[:-1], text[-1:].upper()
    if suffix not in UNITS:
        number, suffix = text, ""
    try:
        value = float(number) * 1024 ** (UNITS.index(suffix) + 1 if suffix else 0)
    except ValueError:
        return text
    scaled = value / 1024 ** (UNITS.index(unit) + 1) if unit else value
    return (f"{scaled:.0f}" if scaled == int(scaled) else f"{scaled:.2f}") + unit


def sacct(argv: list[str]) -> None:
    from garrison.cli.accounting import TimeSpecError, parse_time

    try:
        args = parser().parse_args(argv)
        if args.helpformat:
            names = sorted(SLURM_FIELDS, key=str.lower)
            for first in range(0, len(names), 4):
                print(" ".join(f"{name:<19}" for name in names[first:first + 4]).rstrip())
            return
        fields = _field_list(args)
        unit = _unit(args)
        states = {s for s in state_names(split_list(args.states)) if s != "ALL"}
        if "RUNNING" in states:
            states |= {"CONFIGURING", "COMPLETING"}  # RUNNING to sacct (fields.sacct_state)
        job_ids, step_refs, whole = expand_job_refs(split_list(args.jobs))
        from garrison.model.hostlist import HostListError, expand_hostlist

        try:
            on = {name for value in args.nodelist for name in expand_hostlist(value)}
        except HostListError as exc:
            raise UsageError(str(exc)) from None
        now = datetime.now().astimezone()
        try:
            start = parse_time(slurm_time(args.start, now), now) if args.start else None
            end = parse_time(slurm_time(args.end, now), now) if args.end else None
        except TimeSpecError as exc:
            raise UsageError(str(exc)) from None
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    users = user_names(args.users)
    if not users and not args.allusers and not job_ids and os.geteuid() != 0:
        users = [getpass.getuser()]  # as sacct: your own jobs unless you ask for more
    if start is None and not job_ids:
        start = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    try:
        records, steps, controller_now = _fetch(job_ids, users, split_list(args.accounts), start, end,
                                                with_steps=not args.allocations)
    except CliError as exc:
        fail(PROG, exc)
    wanted_names = set(split_list(args.names))
    partitions = set(split_list(args.partitions))
    if on:
        records = [r for r in records if r.attempts and on & {n.node for n in r.attempts[-1].allocation}]
    records = [r for r in records if (not states or r.state in states) and (not wanted_names or r.name in wanted_names)
               and (not partitions or r.partition in partitions)]
    by_job: dict[int, list[Any]] = {}
    for step in steps:
        by_job.setdefault(int(step.job_id), []).append(step)
    lines: list[dict[str, str]] = []
    shown = records if args.expand_arrays else fold_pending_tasks(records)
    for record in shown:
        record_lines = job_lines(record, by_job.get(int(record.job_id), []), controller_now, args.allocations,
                                 args.duplicates)
        if step_refs and record.display_id not in whole:
            record_lines = [line for line in record_lines if wanted_line(line, step_refs)]
        lines += record_lines
    if unit is not None:
        for line in lines:
            for key in MEMORY_FIELDS:
                if line.get(key):
                    line[key] = in_unit(line[key], unit)
    out = render(lines, fields, args)
    if out:
        sys.stdout.write("\n".join(out) + "\n")


def slurm_time(text: str, now: datetime) -> str:
    """sacct's own time forms as gacct's: ``HH:MM[:SS]`` (today), ``MMDD[YY]``, ``MM/DD[/YY]`` and
    ``MM.DD[.YY]`` (with ``-HH:MM[:SS]`` after the date), into ``YYYY-MM-DD[THH:MM[:SS]]``; others unchanged."""
    import re

    value = text.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", value):
        return f"{now:%Y-%m-%d}T{value.zfill(len(value) + 1) if value.index(':') == 1 else value}"
    date = re.fullmatch(r"(\d{2})(?:[/.]?)(\d{2})(?:[/.]?(\d{2}))?(?:-(\d{1,2}:\d{2}(?::\d{2})?))?", value)
    if date:
        month, day, year, clock_part = date.groups()
        full_year = 2000 + int(year) if year else now.year
        iso = f"{full_year:04d}-{month}-{day}"
        return f"{iso}T{clock_part}" if clock_part else iso
    return value


def _fetch(job_ids: list[str], users: list[str], accounts: list[str], start: float | None, end: float | None,
           with_steps: bool) -> tuple[list[Any], list[Any], float]:
    """The job records and their steps, in plain form (PlainMessage, read as the messages): on the controller's
    host the local socket answers without protobuf or gRPC, most of what a sacct call cost (scripts poll it)."""
    request: dict[str, Any] = {"job_ids": job_ids, "users": users, "accounts": accounts}
    if start is not None:
        request["start_time"] = start
    if end is not None:
        request["end_time"] = end
    records: list[Any] = []
    steps: list[Any] = []
    now = datetime.now().timestamp()
    with Client() as client:
        while True:  # page through by job id until a short page
            response = client.call_plain("ListJobRecords", request)
            records.extend(response.jobs)
            now = response.now or now
            if len(response.jobs) < response.page_size or not response.jobs:
                break
            request["after_job_id"] = response.jobs[-1].job_id
        if with_steps:
            ids = [str(r.job_id) for r in records if r.start_time]
            for first in range(0, len(ids), 5000):  # a request names at most 10,000 jobs
                steps += client.call_plain("ListSteps", {"job_ids": ids[first:first + 5000]}).steps
    return records, steps, now


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(sacct, argv)


if __name__ == "__main__":
    main()
