"""sstat under its own name: what running jobs' steps use now, from the figures the agents report with each
heartbeat (the job attempt's cgroups: peak memory, CPU time), as gjob shows them.

Garrison measures a job attempt as a whole (its cgroup holds the batch script and every step), not each step
apart, so every step line of a job carries the job's figures; NTasks, the node list and the task count are
the step's own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from garrison.cli.client import EXIT_FAILURE, Client, CliError, fail, run_command
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import FieldList, split_list
from garrison.cmdline.argparser import Parser, UsageError

PROG = "sstat"
KNOWN_FIELDS = {
    "JobID": -12, "MaxRSS": 10, "MaxRSSNode": -10, "MaxRSSTask": 10, "AveRSS": 10, "MinCPU": 10,
    "MinCPUNode": -10, "MinCPUTask": 10, "AveCPU": 10, "TotalCPU": 10, "NTasks": 8, "Nodelist": -20,
    "MaxVMSize": 10, "AveVMSize": 10, "ConsumedEnergy": 14, "TRESUsageInTot": -20,
}
DEFAULT_FIELDS = "JobID,MaxRSS,MaxRSSNode,MaxRSSTask,AveRSS,MinCPU,MinCPUNode,MinCPUTask,AveCPU,NTasks"
LIVE_STATES = ("CONFIGURING", "RUNNING", "COMPLETING")


def parser() -> Parser:
    p = Parser(prog=PROG, add_help=False,
               description="What running job steps use, as Slurm's sstat (options: docs/reference.md, garrison-sstat).")
    p.add_argument("-h", "--help", action="help", help="Show this message and exit.")  # as sacct -h, sstat -h
    p.add_argument("-j", "--jobs", dest="jobs", action="append", default=[])
    p.add_argument("-o", "--format", "--fields", dest="format", action="append", default=[])
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("-a", "--allsteps", action="store_true")
    p.add_argument("-e", "--helpformat", action="store_true")
    p.add_argument("positional_jobs", nargs="*")  # sstat also takes the job list as its argument
    return p


def step_lines(job: Any, steps: Sequence[Any], wanted: str | None, all_steps: bool) -> list[dict[str, str]]:
    """The lines for one running job (a GetJob JobInfo with its attempts) and its gsrun steps: ``wanted`` a
    step (``batch``, ``0``...), else with ``all_steps`` the batch step and every running step, else the
    lowest-numbered running step (the batch step when there is none), as sstat picks."""
    from garrison.cli.usage_format import format_bytes, format_cpu_time, measured
    from garrison.model.hostlist import compress_hostlist

    attempt = job.attempts[-1] if job.attempts else None
    usage = measured(attempt.usage) if attempt is not None and attempt.HasField("usage") else None
    nodes = [n.node for n in attempt.allocation] if attempt is not None else list(job.node_list)
    running = sorted((s for s in steps if s.state == "RUNNING"), key=lambda s: s.step_id)
    candidates: list[tuple[str, int, list[str]]] = [("batch", 1, nodes[:1])]
    candidates += [(str(s.step_id), int(s.ntasks), list(s.nodes)) for s in running]
    if wanted is not None:
        chosen = [c for c in candidates if c[0] == wanted]
    elif all_steps:
        chosen = candidates
    else:
        chosen = candidates[1:2] or candidates[:1]
    rss = format_bytes(usage.max_rss_bytes) if usage is not None and usage.HasField("max_rss_bytes") else ""
    cpu = format_cpu_time(usage.cpu_time_s) if usage is not None and usage.HasField("cpu_time_s") else ""
    # The peak belongs to the largest node of the attempt; which one is not recorded unless there is one.
    peak_node = nodes[0] if len(nodes) == 1 else ""
    lines = []
    for step_id, ntasks, step_nodes in chosen:
        lines.append({
            "JobID": f"{job.display_id}.{step_id}", "MaxRSS": rss, "MaxRSSNode": peak_node if rss else "",
            "MaxRSSTask": "0" if rss else "", "AveRSS": rss, "MinCPU": cpu,
            "MinCPUNode": peak_node if cpu else "", "MinCPUTask": "0" if cpu else "", "AveCPU": cpu,
            "TotalCPU": cpu, "NTasks": str(ntasks),
            "Nodelist": compress_hostlist(step_nodes) if step_nodes else "", "MaxVMSize": "", "AveVMSize": "",
            "ConsumedEnergy": "0", "TRESUsageInTot": f"cpu={cpu},mem={rss}" if rss and cpu else "",
        })
    return lines


def sstat(argv: list[str]) -> None:
    try:
        args = parser().parse_args(argv)
        if args.helpformat:
            print(" ".join(KNOWN_FIELDS))
            return
        fields = FieldList(",".join(args.format) or DEFAULT_FIELDS, KNOWN_FIELDS)
        refs = split_list(args.jobs) + split_list(args.positional_jobs)
        if not refs:
            raise UsageError("no job given: sstat -j JOBID[.STEP],...")
        wanted: list[tuple[str, str | None]] = []
        for ref in refs:
            job_text, dot, step_text = ref.partition(".")
            base, underscore, task = job_text.partition("_")
            if not base.isdigit() or (underscore and not task.isdigit()) or (dot and not step_text):
                raise UsageError(f"invalid job id {ref!r}")
            wanted.append((job_text, step_text if dot else None))
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    from garrison.protos.v1 import garrison_pb2 as pb

    lines: list[dict[str, str]] = []
    errors = 0
    try:
        with Client() as client:
            for job_ref, step in wanted:
                job = client.call("GetJob", pb.GetJobRequest(job_id=job_ref))
                if job.state not in LIVE_STATES:
                    print(f"{PROG}: error: job {job_ref} is not running ({job.state}): sacct -j {job_ref} "
                          f"shows what it used", file=sys.stderr)
                    errors += 1
                    continue
                steps = list(client.call("ListSteps", pb.ListStepsRequest(job_ids=[str(job.job_id)])).steps)
                found = step_lines(job, steps, step, args.allsteps)
                if not found:
                    print(f"{PROG}: error: no running step {job_ref}.{step}", file=sys.stderr)
                    errors += 1
                lines += found
    except CliError as exc:
        fail(PROG, exc)
    parsable = "p" if args.parsable else "P" if args.parsable2 else ""
    out = fields.render(lines, header=not args.noheader, parsable=parsable)
    if lines or not errors:
        sys.stdout.write("\n".join(out) + "\n" if out else "")
    sys.stdout.flush()
    if errors:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    run_command(sstat, argv)


if __name__ == "__main__":
    main()
