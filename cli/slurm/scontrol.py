"""scontrol: Slurm's job and host-list commands over Garrison's (gjob's data, gcontrol's ControlJobs).

``scontrol [-o] [-Q] COMMAND ...`` with the commands a Slurm user's scripts run:

- ``show hostnames [LIST]`` (default ``$SLURM_JOB_NODELIST``): one name per line, all in one write, so
  ``scontrol show hostnames | head -n1`` under ``set -o pipefail`` exits 0; ``show hostlist LIST`` the other way.
  Neither needs the controller.
- ``show job [ID]``, ``show node [NAME]``, ``show partition [NAME]``: Slurm's ``Key=Value`` records (``-o``: one
  line each), from the fields Garrison keeps.
- ``hold ID``, ``uhold ID``, ``release ID``, ``requeue ID[,ID]``, ``update JobId=N TimeLimit=... Priority=...
  QOS=... Nice=...``: gcontrol's actions. ``scontrol requeue $SLURM_JOB_ID`` from inside that job answers (exit
  0) before the requeue's SIGTERM can stop it, as PyTorch Lightning's SIGUSR1 handler expects.

Keywords are case-insensitive, as Slurm's are. Errors exit 1.
"""

from __future__ import annotations

import os
import sys
import time

from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import (
    clock,
    exit_code_text,
    job_output_path,
    memory_mb,
    sacct_duration,
    slurm_reason,
)
from garrison.model.arrayfold import index_ranges
from garrison.model.hostlist import HostListError, compress_hostlist, expand_hostlist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

PROG = "scontrol"
EXIT_FAILURE = 1  # every error, as Slurm's scontrol (client.py's, not imported: show hostnames needs no socket)
UPDATE_KEYS = ("timelimit", "priority", "qos", "nice", "name", "jobname", "comment", "dependency", "arraytaskthrottle")


class ScontrolError(Exception):
    """A one-line error; scontrol prints it after ``scontrol: error:`` and exits 1."""


# -- formats (pure) ------------------------------------------------------------------------------------------


def slurm_duration(seconds: float | None) -> str:
    """Slurm's RunTime/TimeLimit: ``HH:MM:SS``, ``D-HH:MM:SS``; ``UNLIMITED`` for no limit (None or 0)."""
    return sacct_duration(seconds) if seconds else "UNLIMITED"


def hostnames_text(nodelist: str) -> str:
    """``scontrol show hostnames``: every name of a host list, one a line."""
    try:
        names = expand_hostlist(nodelist)
    except HostListError as exc:
        raise ScontrolError(str(exc)) from None
    return "".join(f"{name}\n" for name in names)


def format_record(lines: Sequence[Sequence[tuple[str, str]]], oneliner: bool) -> str:
    """A Slurm record: each line's ``Key=Value`` pairs, the lines after the first indented by three spaces
    (``-o``: all on one line)."""
    # A key's leading spaces indent its line further (-d's per-node lines), except on one line (-o).
    rendered = [" ".join(f"{key.lstrip() if oneliner else key}={value}" for key, value in line)
                for line in lines if line]
    if oneliner:
        return " ".join(rendered)
    return "\n".join(rendered[:1] + [f"   {text}" for text in rendered[1:]])


def _exit_code(job: Any) -> str:
    """Slurm's ``code:signal``, as sacct shows the same job (fields.exit_code_text): ``0:N`` for a job stopped
    from outside whose process died of signal N (128+N in Garrison's records), else the code the batch script
    exited with, ``139:0`` for a script whose srun step died of SIGSEGV, as Slurm 22.05 shows it."""
    return exit_code_text(job.exit_code if job.HasField("exit_code") else None, job.state)


def _last_allocation(job: Any) -> list[Any]:
    return list(job.attempts[-1].allocation) if job.attempts else []



def _task_count(spec: Any, node_count: int) -> int:
    """Slurm's NumTasks: -n, else --ntasks-per-node on every node, else one task per node (an `-N 2` job
    shows NumTasks=2 under Slurm 22.05; it showed 1 here)."""
    if spec.HasField("ntasks"):
        return int(spec.ntasks)
    if spec.HasField("ntasks_per_node"):
        return int(spec.ntasks_per_node) * node_count
    return node_count

def job_record(job: Any, oneliner: bool = False, details: bool = False) -> str:
    """``scontrol show job``: the Key=Value lines Slurm prints, as far as Garrison keeps the same facts.
    ``details`` (``-d``): also DerivedExitCode, and JOB_GRES with a line per node of what the job holds there
    (``Nodes=node1 CPU_IDs=0-3 Mem=16384 GRES=gpu:2(IDX:0-1)``), which scripts read for their GPUs' indices."""
    spec = job.spec
    allocation = _last_allocation(job)
    running = job.state in ("CONFIGURING", "RUNNING", "COMPLETING")
    nodes = compress_hostlist(job.node_list) if job.node_list else "(null)"
    cpus = sum(len(a.cpus) for a in allocation) or (spec.cpus_per_task if spec.HasField("cpus_per_task") else 0) or 1
    mem_mb = sum(a.mem_mb for a in allocation) or spec.mem_mb
    node_count = job.nodes or max(len(job.node_list), 1)
    tres = [f"cpu={cpus}"] + ([f"mem={memory_mb(mem_mb)}"] if mem_mb else []) + [f"node={node_count}"]
    if job.gpus:
        tres.append(f"gres/gpu={job.gpus}")
    run_time = (job.end_time or job.now or time.time()) - job.start_time if job.start_time else 0
    array_job = job.array_job_id if job.HasField("array_job_id") else None
    array_task = job.array_task_id if job.HasField("array_task_id") else None

    def output(pattern: str) -> str:
        return "(null)" if spec.launch == "allocation" else job_output_path(job, pattern)

    # Garrison keeps the script's text, not its path: Slurm's Command= (the script and its arguments) as far as known.
    command = "(null)" if spec.launch == "allocation" else " ".join(["(script)", *spec.command])
    reason = slurm_reason(job.reason)
    lines: list[list[tuple[str, str]]] = [
        [("JobId", str(job.job_id)), ("JobName", job.name)],
        [("UserId", f"{job.user}({job.uid})"), ("GroupId", f"{job.user}({job.uid})"), ("MCS_label", "N/A")],
        [("Priority", str(job.priority)), ("Nice", str(spec.nice)), ("Account", job.account or "(null)"),
         ("QOS", spec.qos or "normal")],
        [("JobState", job.state), ("Reason", reason), ("Dependency", spec.dependency or "(null)")],
        [("Requeue", "0" if spec.no_requeue else "1"), ("Restarts", str(job.restart_count)),
         ("BatchFlag", "0" if spec.launch == "allocation" else "1"), ("Reboot", "0"), ("ExitCode", _exit_code(job))],
        [("RunTime", slurm_duration(run_time) if run_time >= 1 else "00:00:00"),
         ("TimeLimit", slurm_duration(job.time_limit_s)), ("TimeMin", "N/A")],
        [("SubmitTime", clock(job.submit_time)),
         ("EligibleTime", clock(spec.begin_time if spec.HasField("begin_time") else job.submit_time))],
        [("StartTime", clock(job.start_time)), ("EndTime", clock(job.end_time)), ("Deadline", "N/A")],
        [("Partition", job.partition), ("AllocNode:Sid", f"{spec.submit_host or '(null)'}:0")],
        [("ReqNodeList", ",".join(spec.nodelist) or "(null)"), ("ExcNodeList", ",".join(spec.exclude) or "(null)")],
        [("NodeList", nodes)],
        [("BatchHost", job.node_list[0])] if job.node_list and running else [],
        [("NumNodes", str(node_count)), ("NumCPUs", str(cpus)),
         ("NumTasks", str(_task_count(spec, node_count))),
         ("CPUs/Task", str(spec.cpus_per_task) if spec.HasField("cpus_per_task") else "1")],
        [("TRES", ",".join(tres))],
        [("MinMemoryNode", memory_mb(spec.mem_mb) if spec.mem_mb else "0")],
        [("Features", spec.constraint or "(null)"), ("OverSubscribe", "NO" if spec.exclusive else "OK")],
        [("Command", command)],
        [("WorkDir", spec.workdir)],
        [("Comment", spec.comment)] if spec.comment else [],
        [("StdErr", output(spec.error or spec.output))],
        [("StdIn", "/dev/null")],
        [("StdOut", output(spec.output))],
    ]
    if array_job is not None:
        lines[0] += [("ArrayJobId", str(array_job)), ("ArrayTaskId", str(array_task))]
    if details:
        lines.insert(5, [("DerivedExitCode", _exit_code(job))])
        at = next(i for i, line in enumerate(lines) if line and line[0][0] == "TRES") + 1
        gres = f"gpu:{spec.gpu_type + ':' if spec.gpu_type else ''}"
        lines.insert(at, [("JOB_GRES", f"{gres}{job.gpus}" if job.gpus else "(null)")])
        # Nodes holding alike share a line, their names folded, as scontrol prints them.
        alike: dict[tuple[str, str, str], list[str]] = {}
        for held in allocation if running else []:
            used = f"{gres}{len(held.gpus)}(IDX:{index_ranges(held.gpus)})" if held.gpus else ""
            alike.setdefault((index_ranges(held.cpus) or "(null)", str(held.mem_mb), used), []).append(held.node)
        for offset, ((cpu_ids, mem, used), names) in enumerate(alike.items(), start=1):
            lines.insert(at + offset, [("  Nodes", compress_hostlist(names)), ("CPU_IDs", cpu_ids), ("Mem", mem),
                                       ("GRES", used)])
    return format_record(lines, oneliner)


def node_record(node: Any, oneliner: bool = False) -> str:
    """``scontrol show node``: a node's Key=Value lines, from ginfo's data."""
    inventory = node.inventory
    total, used = len(inventory.gpus), len(node.allocated_gpus)
    state = node.state
    if state == "UP":
        state = "IDLE" if used == 0 and not node.allocated_cpus else ("ALLOCATED" if used >= total > 0 else "MIXED")
    gpu_type = inventory.gpus[0].name.replace(" ", "_") if inventory.gpus else ""
    gres = f"gpu:{gpu_type}:{total}" if total else "(null)"
    lines: list[list[tuple[str, str]]] = [
        [("NodeName", node.name), ("Arch", os.uname().machine)],
        [("CPUAlloc", str(node.allocated_cpus)), ("CPUTot", str(inventory.cpus))],
        [("AvailableFeatures", ",".join(inventory.features) or "(null)")],
        [("ActiveFeatures", ",".join(inventory.features) or "(null)")],
        [("Gres", gres), ("GresUsed", f"gpu:{gpu_type}:{used}" if total else "(null)")],
        [("NodeAddr", inventory.hostname or node.name), ("NodeHostName", inventory.hostname or node.name)],
        [("RealMemory", str(inventory.memory_mb)), ("AllocMem", str(node.allocated_memory_mb))],
        [("State", state)],
        [("Partitions", ",".join(node.partitions) or "(null)")],
        [("LastBusyTime", clock(node.last_heartbeat))],
        [("Reason", node.reason)] if node.reason else [],
    ]
    return format_record(lines, oneliner)


def partition_record(partition: Any, nodes: Iterable[Any], oneliner: bool = False) -> str:
    """``scontrol show partition``: a partition's Key=Value lines."""
    members = [n for n in nodes if partition.name in n.partitions]
    lines: list[list[tuple[str, str]]] = [
        [("PartitionName", partition.name)],
        [("Default", "YES" if partition.default else "NO")],
        [("DefaultTime", slurm_duration(partition.default_time_s) if partition.default_time_s else "NONE"),
         ("MaxTime", slurm_duration(partition.max_time_s))],
        [("Nodes", compress_hostlist(n.name for n in members) or "(null)")],
        [("State", "UP"), ("TotalCPUs", str(sum(n.inventory.cpus for n in members))),
         ("TotalNodes", str(len(members)))],
        [("TRES", f"cpu={sum(n.inventory.cpus for n in members)},node={len(members)},"
                  f"gres/gpu={sum(len(n.inventory.gpus) for n in members)}")],
    ]
    return format_record(lines, oneliner)


def parse_update(words: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """``update JobId=N[,M] Key=Value ...`` -> (job ids, {lower-case key: value}); unknown keys are errors."""
    ids: list[str] = []
    fields: dict[str, str] = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals:
            raise ScontrolError(f"update: expected Key=Value, got {word!r}")
        lowered = key.lower()
        if lowered in ("jobid", "job"):
            ids += [part for part in value.split(",") if part]
        elif lowered in UPDATE_KEYS:
            fields[lowered] = value
        else:
            raise ScontrolError(f"update: {key} cannot be changed here (Garrison updates TimeLimit, Priority, "
                                "QOS, Nice, JobName, Comment, Dependency and ArrayTaskThrottle)")
    if not ids:
        raise ScontrolError("update: give JobId=N")
    if not fields:
        raise ScontrolError("update: nothing to change: give TimeLimit=, Priority=, QOS=, Nice=, JobName=, "
                            "Comment=, Dependency= or ArrayTaskThrottle=")
    return ids, fields


# -- commands ------------------------------------------------------------------------------------------------


def _write(text: str) -> None:
    """All of ``text`` in one write: a reader that stops early (``| head -n1``) leaves us nothing to fail on."""
    data = text.encode()
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


def _client() -> Any:
    from garrison.cli.client import Client

    return Client()


def _control(action: str, ids: Sequence[str], quiet: bool, **fields: Any) -> None:
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    if not ids:
        raise ScontrolError(f"{action}: give a job id")
    request = adminpb.JobControlRequest(action=action, job_ids=list(ids))
    for name, value in fields.items():
        if value is not None:
            setattr(request, name, value)
    with _client() as client:
        response = client.service_call(admin_pb2_grpc.AdminStub, "ControlJobs", request)
    if not response.job_ids and not quiet:
        why = {"hold": "not pending", "release": "not held", "requeue": "not running"}.get(action, "unchanged")
        raise ScontrolError(f"no job to {action} ({why}): {','.join(ids)}")


def _ids(words: Sequence[str]) -> list[str]:
    return [part for word in words for part in word.split(",") if part]


def own_job_ids(environ: Mapping[str, str]) -> set[str]:
    """The ids the job this process runs in goes by: ``12``, and for an array task also ``10_3`` (Lightning's
    requeue names an array task so)."""
    own = {environ.get("SLURM_JOB_ID", ""), environ.get("GARRISON_JOB_ID", "")}
    array_job, array_task = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
    if array_job and array_task:
        own.add(f"{array_job}_{array_task}")
    return own - {""}


def _requeue(ids: list[str], quiet: bool) -> None:
    if own_job_ids(os.environ) & set(ids):
        _requeue_own_job(ids, quiet)
    else:
        _control("requeue", ids, quiet)


def _requeue_own_job(ids: list[str], quiet: bool) -> None:
    """``scontrol requeue $SLURM_JOB_ID`` from inside the job (Lightning's SIGUSR1 handler): the requeue stops
    every process of the job, the caller and this one too, and a job's steps are killed as soon as its batch
    shell has ended, so the answer comes first. What can be checked is checked here (exit 1 as usual); then this
    process exits 0 and a child of it, in a session of its own, sends the request once its parent is gone."""
    import signal
    import stat

    for job_id in ids:
        state = _job(job_id).state
        if state not in ("CONFIGURING", "RUNNING"):
            if quiet:
                return
            raise ScontrolError(f"no job to requeue (not running): {job_id} is {state}")
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    if os.fork():
        os._exit(0)  # the answer, before the requeue stops the job
    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    # A caller reading our output through a pipe ($(scontrol requeue ...)) would otherwise wait for this child.
    for fd in (0, 1, 2):
        if fd != 2 or stat.S_ISFIFO(os.fstat(2).st_mode):
            os.dup2(devnull, fd)
    deadline = time.monotonic() + 5.0
    while os.getppid() == parent and time.monotonic() < deadline:  # the caller has its answer once we are orphaned
        time.sleep(0.002)
    code = 0
    try:
        _control("requeue", ids, quiet)
    except Exception as exc:  # no one waits for this process: say it in the job's error output, if it has one
        print(f"{PROG}: error: requeue {','.join(ids)}: {exc}", file=sys.stderr, flush=True)
        code = 1
    os._exit(code)


def _update(words: Sequence[str], quiet: bool) -> None:
    from garrison.cmdline.parsing import UsageError, parse_nice, parse_time_limit, slurm_dependency

    ids, fields = parse_update(words)
    values: dict[str, Any] = {}
    relative = 0  # TimeLimit=+T / -T: seconds added to each job's own limit
    try:
        if "timelimit" in fields:
            text = fields["timelimit"]
            if text[:1] in ("+", "-") and text[1:]:
                relative = parse_time_limit(text[1:]) * (1 if text[0] == "+" else -1)
            else:
                values["time_limit_s"] = parse_time_limit(text)
        if "nice" in fields:
            values["nice"] = parse_nice(fields["nice"])
        if "priority" in fields:
            values["priority"] = int(fields["priority"])
        if "qos" in fields:
            values["qos"] = fields["qos"]
        for key in ("name", "jobname"):
            if key in fields:
                values["name"] = fields[key]
        if "comment" in fields:
            values["comment"] = fields["comment"]
        if "arraytaskthrottle" in fields:  # 0: no limit
            values["array_task_throttle"] = int(fields["arraytaskthrottle"])
            if values["array_task_throttle"] < 0:
                raise ValueError("ArrayTaskThrottle must be 0 (no limit) or more")
        if "dependency" in fields:  # "" clears it; a bare id is afterany:ID, as slurmctld reads it
            values["dependency"] = slurm_dependency(fields["dependency"]) if fields["dependency"] else ""
    except (UsageError, ValueError) as exc:
        raise ScontrolError(f"update: {exc}") from None
    if not relative:
        _control("update", ids, quiet, **values)
        return
    for job_id in ids:
        _control("update", [job_id], quiet, **values, time_limit_s=_job(job_id).time_limit_s + relative)


def _job(job_id: str) -> Any:
    """The job's GetJob answer in its plain form (a PlainMessage, read as the message): on the controller's
    local socket that imports neither protobuf nor gRPC, most of what `scontrol show job` cost."""
    with _client() as client:
        return client.call_plain("GetJob", {"job_id": job_id})


def _show(words: Sequence[str], oneliner: bool, details: bool = False) -> None:
    if not words:
        raise ScontrolError("show: what? (job, node, partition, hostnames, hostlist)")
    entity, rest = words[0].lower(), list(words[1:])
    if entity in ("hostnames", "hostname"):
        nodelist = rest[0] if rest else os.environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise ScontrolError("show hostnames: give a host list (SLURM_JOB_NODELIST is not set)")
        _write(hostnames_text(nodelist))
        return
    if entity in ("hostlist", "hostlistsorted"):
        if not rest:
            raise ScontrolError(f"show {entity}: give host names")
        names = [name for word in rest for name in expand_hostlist(word)]
        _write(compress_hostlist(names) + "\n")
        return
    if entity in ("job", "jobs", "jobid"):
        _write(_jobs_text(rest, oneliner, details))
        return
    if entity in ("node", "nodes", "nodename", "partition", "partitions", "partitionname"):
        from garrison.protos.v1 import garrison_pb2 as pb

        with _client() as client:
            response = client.call("ListNodes", pb.ListNodesRequest())
        if entity.startswith("node"):
            nodes = [n for n in response.nodes if not rest or n.name in expand_hostlist(rest[0])]
            if rest and not nodes:
                raise ScontrolError(f"Node {rest[0]} not found")
            records = [node_record(n, oneliner) for n in nodes]
        else:
            partitions = [p for p in response.partitions if not rest or p.name == rest[0]]
            if rest and not partitions:
                raise ScontrolError(f"Partition {rest[0]} not found")
            records = [partition_record(p, response.nodes, oneliner) for p in partitions]
        _write("".join(f"{record}\n" + ("" if oneliner else "\n") for record in records))
        return
    raise ScontrolError(f"show: unknown entity {words[0]!r} (job, node, partition, hostnames, hostlist)")


def _jobs_text(rest: Sequence[str], oneliner: bool, details: bool = False) -> str:
    if rest:
        jobs = [_job(job_id) for job_id in _ids(rest)]
    else:
        # Every job's full record, as Slurm prints it: ListJobs' rows carry no specification (WorkDir=,
        # StdOut=, Comment=...), so each job's GetJob answer, on one connection.
        with _client() as client:
            listed = client.call_plain("ListJobs", {}).jobs
            jobs = [client.call_plain("GetJob", {"job_id": str(job.job_id)}) for job in listed]
        if not jobs:
            return "No jobs in the system\n"
    return "".join(f"{job_record(job, oneliner, details)}\n" + ("" if oneliner else "\n") for job in jobs)


def _write_batch_script(words: Sequence[str]) -> None:
    """``write batch_script JOBID [FILE]``: the job's script into FILE (default ``slurm-JOBID.sh``), or to
    standard output with ``-``, as Slurm's scontrol writes it; its owner's and admins' only."""
    if not words or words[0].lower() != "batch_script" or len(words) not in (2, 3):
        raise ScontrolError("write: give batch_script JOBID [FILE|-]")
    job_id = words[1]
    job = _job(job_id)
    if not job.spec.HasField("script"):
        raise ScontrolError(f"job {job_id} has no batch script to write (an allocation, a command, or not yours)")
    target = words[2] if len(words) == 3 else f"slurm-{job_id}.sh"
    if target == "-":
        _write(job.spec.script)
        return
    try:
        with open(target, "x", encoding="utf-8") as out:
            out.write(job.spec.script)
    except FileExistsError:
        raise ScontrolError(f"file {target} exists, remove it or give another name") from None
    except OSError as exc:
        raise ScontrolError(f"cannot write {target}: {exc.strerror}") from None
    _write(f"batch script for job {job_id} written to {target}\n")


COMMANDS: dict[str, Callable[[list[str], Flags], None]] = {
    "show": lambda rest, flags: _show(rest, flags.oneliner, flags.details),
    "hold": lambda rest, flags: _control("hold", _ids(rest), flags.quiet),
    "uhold": lambda rest, flags: _control("hold", _ids(rest), flags.quiet),
    "release": lambda rest, flags: _control("release", _ids(rest), flags.quiet),
    "requeue": lambda rest, flags: _requeue(_ids(rest), flags.quiet),
    "update": lambda rest, flags: _update(rest, flags.quiet),
    "write": lambda rest, flags: _write_batch_script(rest),
}

USAGE = """usage: scontrol [-o|--oneliner] [-Q|--quiet] COMMAND ...

  show hostnames [LIST]      the names of a host list (default $SLURM_JOB_NODELIST), one a line
  show hostlist NAMES        the other way: node1,node2,node3 -> node[1-3]
  show job [ID]              a job's record (every job's without ID)
  show node [NAME]           a node's record
  show partition [NAME]      a partition's record
  hold ID[,ID]  uhold ID     keep pending jobs from starting
  release ID[,ID]            let held jobs start
  requeue ID[,ID]            stop running jobs and queue them again (also from inside the job)
  update JobId=ID[,ID] TimeLimit=T|+T|-T Priority=N QOS=NAME Nice=N JobName=NAME Comment=TEXT
                     Dependency=LIST (pending jobs; Comment= and Dependency= empty clear them)
                     ArrayTaskThrottle=N (an array's tasks running at once; 0: no limit)
  write batch_script ID [FILE|-]   the job's script (default slurm-ID.sh; - for standard output)

  -d (-dd) with show job: also each node's CPUs, memory and GPU indices (GRES=gpu:2(IDX:0-1))
"""


class Flags:
    """The command line's flags. A plain class, not a dataclass: dataclasses imports inspect and re, a fifth
    of a `scontrol show job`."""

    def __init__(self) -> None:
        self.oneliner: bool = False  # -o
        self.quiet: bool = False  # -Q
        self.details: bool = False  # -d (-dd: the same here)
        self.help: bool = False  # -h


LONG_FLAGS = {"--oneliner": "o", "--quiet": "Q", "--details": "d", "--verbose": "v", "--all": "a", "--help": "h"}


def run(argv: Sequence[str]) -> None:
    words, flags = parse_command_line(argv)
    if flags.help:
        _write(USAGE)
        return
    if not words:
        raise ScontrolError("no command given (scontrol --help lists them)")
    command = COMMANDS.get(words[0].lower())
    if command is None:
        raise ScontrolError(f"invalid command {words[0]!r} (scontrol --help lists them)")
    command(words[1:], flags)


def parse_command_line(argv: Sequence[str]) -> tuple[list[str], Flags]:
    """The words and the flags of a command line. Options go anywhere on the line, as getopt permutes them for
    scontrol (``scontrol show jobid -dd 12``), and bundle (``-dd``, ``-od``); a lone ``-`` is a word
    (``write batch_script 12 -``)."""
    flags = Flags()
    words: list[str] = []
    for word in argv:
        if not word.startswith("-") or word == "-":
            words.append(word)
            continue
        letters = LONG_FLAGS.get(word) if word.startswith("--") else word[1:]
        if letters is None:
            raise ScontrolError(f"unrecognized option {word!r}")
        for letter in letters:
            if letter == "o":
                flags.oneliner = True
            elif letter == "Q":
                flags.quiet = True
            elif letter == "d":
                flags.details = True
            elif letter == "h":
                flags.help = True
            elif letter not in ("v", "a"):
                raise ScontrolError(f"unrecognized option {word!r}")
    return words, flags


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    try:
        run(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:
        # The reader went away (| head -n1) after what it wanted: no message, and no failure for pipefail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        sys.exit(0)
    except (ScontrolError, HostListError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILURE)
    except Exception as exc:
        from garrison.cli.client import CliError  # imported by every command that reached the controller

        if not isinstance(exc, CliError):
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILURE)


if __name__ == "__main__":
    main()
