"""squeue under its own name: Slurm's columns, %-codes and options over the queue gqueue reads (ListJobs).

Fields that need a job's specification (%C, %m, %o, %Z, %q, %c, %E, %f, %k, %y) cost one GetJob per job
and are asked for only when the layout has them, so the default layout stays one call.
"""

from __future__ import annotations

import sys

from garrison.cli.client import EXIT_FAILURE, Client, CliError, fail, run_command
from garrison.cli.queue_format import time_left_text, time_limit_text
from garrison.cli.render import elapsed
from garrison.cli.render import format_duration as duration
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import (
    PercentFormat,
    clock,
    exit_code_text,
    memory_mb,
    parse_long_format,
    short_state,
    slurm_reason,
    sort_by_letters,
    split_list,
    state_names,
    user_names,
)
from garrison.cmdline.argparser import Parser, UsageError

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms of a command that runs in loops
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

PROG = "squeue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
STEP_FORMAT = "%.15i %.8j %.9P %.8u %.9M %N"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
LIVE_STATES = ("CONFIGURING", "RUNNING", "COMPLETING")
# Fields that need GetJob (the job's specification, or its attempts' allocation).
SPEC_KEYS = set("CmoZqcEfky")

HEADERS = {
    "a": "ACCOUNT", "A": "JOBID", "b": "TRES_PER_NODE", "c": "MIN_CPUS", "C": "CPUS", "D": "NODES",
    "e": "END_TIME", "E": "DEPENDENCY", "f": "FEATURES", "F": "ARRAY_JOB_ID", "i": "JOBID", "j": "NAME",
    "k": "COMMENT", "K": "ARRAY_TASK_ID", "l": "TIME_LIMIT", "L": "TIME_LEFT", "m": "MIN_MEMORY",
    "M": "TIME", "N": "NODELIST", "o": "COMMAND", "p": "PRIORITY", "P": "PARTITION", "q": "QOS",
    "Q": "PRIORITY", "r": "REASON", "R": "NODELIST(REASON)", "S": "START_TIME", "t": "ST", "T": "STATE",
    "u": "USER", "U": "UID", "V": "SUBMIT_TIME", "y": "NICE", "Z": "WORK_DIR", "x": "EXC_NODES",
    "X": "EXIT_CODE", "Y": "SCHEDNODES",
}
# squeue -O names -> letters.
LONG_NAMES = {
    "account": "a", "jobid": "i", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "name": "j",
    "username": "u", "userid": "U", "uid": "U", "statecompact": "t", "state": "T", "timeused": "M",
    "timelimit": "l", "timeleft": "L", "numnodes": "D", "numcpus": "C", "nodelist": "N",
    "reasonlist": "R", "reason": "r", "partition": "P", "qos": "q", "priority": "p", "prioritylong": "Q",
    "submittime": "V", "starttime": "S", "endtime": "e", "workdir": "Z", "command": "o",
    "minmemory": "m", "mincpus": "c", "feature": "f", "dependency": "E", "comment": "k", "nice": "y",
    "tres-per-node": "b", "exit_code": "X", "exitcode": "X",
}
STEP_HEADERS = {"i": "STEPID", "j": "NAME", "P": "PARTITION", "u": "USER", "M": "TIME", "N": "NODELIST",
                "l": "TIME_LIMIT", "S": "START_TIME", "T": "STATE", "A": "NTASKS", "b": "TRES_PER_NODE"}


def parser() -> Parser:
    p = Parser(prog=PROG, add_help=False,
               description="Pending and running jobs, as Slurm's squeue shows them (options: docs/reference.md, garrison-squeue).")
    p.add_argument("--help", action="help", help="Show this message and exit.")
    p.add_argument("-u", "--user", dest="users", action="append", default=[])
    p.add_argument("--me", action="store_true")
    p.add_argument("-t", "--states", "--state", dest="states", action="append", default=[])
    p.add_argument("-j", "--jobs", "--job", dest="jobs", action="append", default=[])
    p.add_argument("-p", "--partition", dest="partitions", action="append", default=[])
    p.add_argument("-A", "--account", dest="accounts", action="append", default=[])
    p.add_argument("-n", "--name", dest="names", action="append", default=[])
    p.add_argument("-w", "--nodelist", dest="nodelist", action="append", default=[])
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-o", "--format", dest="format", default=None)
    p.add_argument("-O", "--Format", dest="long_format", default=None)
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-r", "--array", dest="expand_arrays", action="store_true")
    p.add_argument("-s", "--steps", dest="steps", action="store_const", const="", default=None)
    p.add_argument("-i", "--iterate", default=None)
    p.add_argument("-S", "--sort", dest="sort", default=None)
    p.add_argument("--start", dest="show_start", action="store_true")
    p.add_argument("-a", "--all", action="store_true")  # every partition: Garrison hides none
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--json", action="store_true")
    return p


# --- the value of each field for a job --------------------------------------------------------------------


def _nodelist(names: Sequence[str]) -> str:
    from garrison.model.hostlist import compress_hostlist

    return compress_hostlist(list(names)) if names else ""


def _reason_or_nodes(job: Any) -> str:
    if job.state == "PENDING" or not job.node_list:
        return f"({slurm_reason(job.reason)})"
    return _nodelist(job.node_list)


def _cpus(job: Any, detail: Any | None) -> str:
    if detail is not None and detail.attempts:
        last = detail.attempts[-1]
        if last.allocation:
            return str(sum(len(node.cpus) for node in last.allocation))
    spec = detail.spec if detail is not None else None
    if spec is None:
        return "N/A"
    if spec.cpus_per_gpu and job.gpus:
        return str(spec.cpus_per_gpu * job.gpus)
    if spec.cpus_per_node:
        return str(spec.cpus_per_node * max(job.nodes, 1))
    if spec.HasField("ntasks"):
        return str(spec.ntasks * (spec.cpus_per_task if spec.HasField("cpus_per_task") else 1))
    return str(max(job.nodes, 1))


def _tres_per_node(job: Any) -> str:
    if not job.gpus:
        return "N/A"
    per_node = job.gpus // max(job.nodes, 1) or job.gpus
    return f"gres/gpu:{per_node}"


def _command(spec: Any) -> str:
    if spec.HasField("script"):
        return "(script)"
    return " ".join(spec.command) or "(null)"


def job_values(job: Any, detail: Any | None = None, estimate: float | None = None) -> Callable[[str], str]:
    """The text of each squeue %-letter for ``job`` (a ListJobs JobInfo, or a folded array); ``detail``,
    the job's GetJob answer, is needed only for the letters of SPEC_KEYS; ``estimate``, a pending job's
    estimated start from the last scheduling cycle, is its %S."""
    spec = detail.spec if detail is not None else None
    array_job = str(job.array_job_id) if job.HasField("array_job_id") else str(job.job_id)
    array_task = str(job.array_task_id) if job.HasField("array_task_id") else "N/A"
    if job.display_id.endswith("]"):  # a folded array: 5_[11-100%10]
        array_task = job.display_id.split("_", 1)[1][1:-1]

    def spec_text(read: Callable[[Any], str]) -> str:
        return read(spec) if spec is not None else "N/A"

    table: dict[str, Callable[[], str]] = {
        "a": lambda: job.account, "A": lambda: str(job.job_id), "b": lambda: _tres_per_node(job),
        "c": lambda: spec_text(lambda s: str(s.cpus_per_task if s.HasField("cpus_per_task") else 1)),
        "C": lambda: _cpus(job, detail), "D": lambda: str(job.nodes),
        "e": lambda: clock(job.end_time) if job.end_time else "N/A",
        "E": lambda: spec_text(lambda s: s.dependency or "(null)"),
        "f": lambda: spec_text(lambda s: s.constraint or "(null)"),
        "F": lambda: array_job, "i": lambda: job.display_id, "j": lambda: job.name,
        "k": lambda: spec_text(lambda s: s.comment or "(null)"),
        "K": lambda: array_task, "l": lambda: time_limit_text(job), "L": lambda: time_left_text(job),
        "m": lambda: spec_text(lambda s: memory_mb(s.mem_mb)), "M": lambda: duration(elapsed(job)),
        "N": lambda: _nodelist(job.node_list), "o": lambda: spec_text(_command),
        "p": lambda: f"{job.priority / 4294967295:.8f}" if job.priority > 0 else "0.00000000",
        "P": lambda: job.partition, "q": lambda: spec_text(lambda s: s.qos or "normal"),
        "Q": lambda: str(job.priority), "r": lambda: slurm_reason(job.reason), "R": lambda: _reason_or_nodes(job),
        "S": lambda: clock(job.start_time) if job.start_time and job.state != "PENDING"
        else clock(max(estimate, job.now)) if estimate else "N/A",
        "t": lambda: short_state(job.state), "Y": lambda: "(null)",
        "T": lambda: job.state, "u": lambda: job.user, "U": lambda: str(job.uid),
        "V": lambda: clock(job.submit_time), "y": lambda: spec_text(lambda s: str(s.nice)),
        "Z": lambda: spec_text(lambda s: s.workdir), "x": lambda: spec_text(lambda s: ",".join(s.exclude)),
        "X": lambda: exit_code_text(job.exit_code if job.HasField("exit_code") else None, job.state),
    }
    return lambda key: table[key]()


# --sort: squeue's letters, '-' before one reverses it.
SORT_KEYS: dict[str, Callable[[Any], Any]] = {
    "i": lambda j: (j.array_job_id if j.HasField("array_job_id") else j.job_id, j.job_id),
    "A": lambda j: j.job_id, "j": lambda j: j.name, "u": lambda j: j.user, "P": lambda j: j.partition,
    "a": lambda j: j.account, "t": lambda j: j.state, "T": lambda j: j.state, "M": elapsed,
    "l": lambda j: j.time_limit_s, "D": lambda j: j.nodes, "Q": lambda j: j.priority, "p": lambda j: j.priority,
    "V": lambda j: j.submit_time, "S": lambda j: j.start_time, "e": lambda j: j.end_time, "r": lambda j: j.reason,
}


def sort_jobs(jobs: list[Any], spec: str | None) -> list[Any]:
    """squeue's order (by partition, then priority, highest first) or --sort's ``[-]LETTER,...``."""
    if spec is None:
        return sorted(jobs, key=lambda j: (j.state not in LIVE_STATES, j.partition, -j.priority, j.job_id))
    return sort_by_letters(jobs, spec, SORT_KEYS,
                           lambda letter: f"--sort: unknown field {letter!r} (known: {', '.join(SORT_KEYS)})")


def render_jobs(layout: PercentFormat, jobs: Sequence[Any], details: dict[int, Any], header: bool,
                estimates: dict[int, float] | None = None) -> list[str]:
    estimates = estimates or {}
    return layout.render([job_values(job, details.get(int(job.job_id)), estimates.get(int(job.job_id)))
                          for job in jobs], header)


def step_values(step: dict[str, Any], partition: str, time_limit_s: int) -> Callable[[str], str]:
    table = {
        "i": step["step_id"], "j": step["name"], "P": partition, "u": step["user"],
        "M": duration(step["elapsed_s"]), "N": _nodelist(step["nodes"]),
        "l": duration(time_limit_s) if time_limit_s else "UNLIMITED", "S": clock(step["start_time"]),
        "T": step["state"], "A": str(step["ntasks"]),
        "b": f"gres/gpu:{step['gpus']}" if step["gpus"] else "N/A",
    }
    return table.__getitem__


# --- the command ------------------------------------------------------------------------------------------


def _layout(args: Any) -> PercentFormat:
    headers = STEP_HEADERS if args.steps is not None else HEADERS
    if args.long_format is not None:
        if args.steps is not None:
            raise UsageError("-O/--Format does not go with -s/--steps; use -o")
        names = {name: (letter, HEADERS[letter]) for name, letter in LONG_NAMES.items()}
        return parse_long_format(args.long_format, names)
    if args.format is not None:
        return PercentFormat(args.format, headers)
    if args.steps is not None:
        return PercentFormat(STEP_FORMAT, headers)
    if args.show_start:
        return PercentFormat(START_FORMAT, headers)
    return PercentFormat(LONG_FORMAT if args.long else DEFAULT_FORMAT, headers)


def _json_states(args: Any) -> list[str]:
    """--json: -t's states, or every state (slurmctld's jobs: those that ended in the last MinJobAge too)."""
    states = state_names(split_list(args.states))
    return [] if "ALL" in states else states


def _states(args: Any) -> list[str]:
    """The states to list: -t's, or pending and running ones, also with -j: Slurm 22.05's `squeue -j ID` of a
    job that has ended prints the header alone (exit 0), which is how scripts wait for a job to leave the
    queue (`while squeue -h -j $ID | grep -q .`); `-t all` shows it. (gqueue -j shows it in any state.)"""
    states = state_names(split_list(args.states))
    if "ALL" in states:
        return []
    return states or list(ACTIVE_STATES)


def squeue(argv: list[str]) -> None:
    try:
        args = parser().parse_args(argv)
        layout = _layout(args)
        states = _states(args)
        if args.sort is not None:
            sort_jobs([], args.sort)  # reject a bad --sort before asking the controller
        interval = None
        if args.iterate is not None:
            from garrison.cmdline.parsing import parse_count

            interval = parse_count(args.iterate, minimum=1)
        _node_filter(args.nodelist)  # a bad host list is a usage error before any call
    except (UsageError, ValueError) as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    users = user_names(args.users) + ([_login_name()] if args.me else [])
    import time

    if interval is None:
        if args.long:
            print(time.strftime("%a %b %d %H:%M:%S %Y"))  # squeue -l's first line
        _show(args, layout, users, states)
        return
    try:
        while True:
            print(time.strftime("%a %b %d %H:%M:%S %Y"))
            _show(args, layout, users, states)
            print(flush=True)
            time.sleep(interval)  # the interval asked for between two looks at the queue
    except KeyboardInterrupt:
        return


def _show(args: Any, layout: PercentFormat, users: list[str], states: list[str]) -> None:
    from garrison.cli.render import fold_pending_arrays

    job_ids = split_list(args.jobs)
    request = {"users": users, "states": states, "job_ids": job_ids, "names": split_list(args.names),
               "partitions": split_list(args.partitions), "accounts": split_list(args.accounts)}
    if args.show_start:
        request["states"] = ["PENDING"]  # squeue --start: the pending jobs and when they should start
    if args.steps is not None:
        request["states"] = ["RUNNING"]
        request["job_ids"] = sorted({j.split(".")[0] for j in job_ids})
    if args.json:
        request["states"] = _json_states(args)
    try:
        with Client() as client:
            jobs = list(client.call_plain("ListJobs", request).jobs)
            wanted_nodes = _node_filter(args.nodelist)
            if wanted_nodes is not None:
                jobs = [j for j in jobs if wanted_nodes & set(j.node_list)]
            if args.json:
                lines = [_json(client, jobs, explicit_states=bool(request["states"]))]
            elif args.steps is not None:
                lines = _steps(client, jobs, layout, job_ids, not args.noheader)
            else:
                jobs = sort_jobs(jobs, args.sort)
                shown = jobs if args.expand_arrays else fold_pending_arrays(jobs)
                details: dict[int, Any] = {}
                if layout.field_keys() & SPEC_KEYS:
                    for job in shown:
                        details[int(job.job_id)] = client.call_plain("GetJob", {"job_id": str(job.job_id)})
                estimates = _estimates(client, request) if "S" in layout.field_keys() and any(
                    j.state == "PENDING" for j in shown) else {}
                lines = render_jobs(layout, shown, details, not args.noheader, estimates)
    except CliError as exc:
        fail(PROG, exc)
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")


def _json(client: Client, jobs: list[Any], explicit_states: bool) -> str:
    """squeue --json's document: each job (array tasks one by one) with its GetJob details."""
    import functools
    import json
    import os

    from garrison.cli.slurm.fields import job_output_path
    from garrison.cli.slurm.json_views import ENDED_SHOWN_S, job_document, squeue_document

    cluster = os.environ.get("SLURM_CLUSTER_NAME") or "garrison"
    documents = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        if not explicit_states and job.end_time and job.end_time < job.now - ENDED_SHOWN_S:
            continue  # ended before slurmctld's MinJobAge: Slurm has forgotten it
        detail = client.call_plain("GetJob", {"job_id": str(job.job_id)})
        output = functools.partial(job_output_path, detail)
        documents.append(job_document(job, detail, cluster, output))
    return json.dumps(squeue_document(documents), indent=2)


def _estimates(client: Client, request: dict[str, Any]) -> dict[int, float]:
    """Pending jobs' estimated starts from the last scheduling cycle (what gqueue --start shows)."""
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    query = adminpb.QueueDetailsRequest(users=request["users"], job_ids=request["job_ids"], names=request["names"],
                                        partitions=request["partitions"], accounts=request["accounts"])
    response = client.service_call(admin_pb2_grpc.AdminStub, "QueueDetails", query)
    return {int(d.job.job_id): d.estimated_start for d in response.jobs if d.HasField("estimated_start")}


def _node_filter(values: list[str]) -> set[str] | None:
    if not values:
        return None
    from garrison.model.hostlist import expand_hostlist

    return {name for value in values for name in expand_hostlist(value)}


def _steps(client: Client, jobs: list[Any], layout: PercentFormat, step_ids: list[str], header: bool) -> list[str]:
    """squeue -s: the running jobs' steps, each job's batch step first; -j ID.STEP shows that step alone,
    -j ID every step of the job."""
    from garrison.cli.step_views import batch_of_job, step_records

    steps = list(client.call_plain("ListSteps", {"job_ids": [str(j.job_id) for j in jobs]}).steps) if jobs else []
    now = jobs[0].now if jobs else 0.0
    records = step_records([batch_of_job(j) for j in jobs], [s for s in steps if s.state == "RUNNING"], now)
    by_id = {str(j.job_id): j for j in jobs}
    if not step_ids:
        step_ids = [j.display_id for j in jobs]
    rows = []
    for record in records:
        job_id, _, step = record["step_id"].partition(".")
        job = by_id.get(job_id)
        if job is not None:
            record["step_id"] = f"{job.display_id}.{step}"  # an array task's steps: 4_0.batch, as squeue -s
        whole = job is None or job.display_id in step_ids or job_id in step_ids
        if not whole and record["step_id"] not in step_ids and f"{job_id}.{step}" not in step_ids:
            continue
        rows.append(step_values(record, job.partition if job else "", job.time_limit_s if job else 0))
    return layout.render(rows, header)


def _login_name() -> str:
    """``--me``'s user. getpass here, not at the top: it imports contextlib and more, which every other squeue
    call would pay for."""
    import getpass

    return getpass.getuser()


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(squeue, argv)


if __name__ == "__main__":
    main()
