"""gqueue: show the queue (squeue's counterpart). Its options are parsed with argparse (garrison/cmdline/argparser.py),
not click like the other commands': it runs often and in loops, and must start fast."""

from __future__ import annotations

import argparse
import getpass
import sys

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail, run_command
from garrison.cli.fastpath import list_request, queue_states, split_values
from garrison.cli.render import JOB_COLUMNS, job_row, jobs_json, plain_table, rich_table
from garrison.cmdline.argparser import Parser, UsageError

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms
if TYPE_CHECKING:
    from typing import Any


def parser() -> argparse.ArgumentParser:
    # -h is squeue's --noheader, so help is --help only.
    p = Parser(prog="gqueue", add_help=False,
               description="Show pending and running jobs; with -t all or -j, also those finished in the last few "
                           "minutes.")
    p.add_argument("--help", action="help", help="Show this message and exit.")
    p.add_argument("-u", "--user", dest="users", action="append", default=[], metavar="USERS",
                   help="Only jobs of these users (comma list).")
    p.add_argument("--me", action="store_true", help="Only my jobs.")
    p.add_argument("-t", "--states", dest="states", action="append", default=[], metavar="STATES",
                   help="Only jobs in these states (comma list; all: every state).")
    p.add_argument("-j", "--jobs", dest="jobs", action="append", default=[], metavar="JOBS",
                   help="Only these job ids (comma list; 12 or 12_3).")
    p.add_argument("-p", "--partition", dest="partitions", action="append", default=[], metavar="PARTITIONS",
                   help="Only jobs in these partitions (comma list).")
    p.add_argument("-A", "--account", dest="accounts", action="append", default=[], metavar="ACCOUNTS",
                   help="Only jobs charged to these accounts (comma list).")
    p.add_argument("-n", "--name", dest="names", action="append", default=[], metavar="NAMES",
                   help="Only jobs with these names (comma list).")
    p.add_argument("-h", "--noheader", action="store_true", help="Print the table without its header line.")
    p.add_argument("-o", "--format", dest="format", default=None, metavar="FORMAT",
                   help='Lay out each job as squeue -o does, e.g. "%%.10i %%.9P %%.20j %%.2t %%.10M %%R".')
    p.add_argument("-i", "--iterate", default=None, metavar="SECONDS",
                   help="Show the queue again every SECONDS seconds, the time above each (Ctrl-C stops).")
    p.add_argument("-r", "--array", dest="expand_arrays", action="store_true",
                   help="One row per array task, pending ones too (by default an array's pending tasks share one "
                        "row, 5_[11-100%%10], as in squeue).")
    p.add_argument("--json", dest="as_json", action="store_true", help='Print {"jobs": [...]} as JSON.')
    p.add_argument("-s", "--steps", dest="show_steps", action="store_true",
                   help="The running jobs' steps (JOBID.batch, JOBID.0, ...) instead of the jobs, as squeue -s.")
    p.add_argument("--start", dest="show_start", action="store_true",
                   help="Pending jobs with their queue position and estimated start (from the last cycle).")
    p.add_argument("--priority", dest="show_priority", action="store_true",
                   help="Pending jobs' priority and its weighted factors (like sprio).")
    p.add_argument("--explain", dest="explain", default=None, metavar="JOBID",
                   help="Why pending job JOBID waits, in terms you can act on (from the last cycle).")
    return p


def gqueue(argv: list[str]) -> None:
    try:
        args = parser().parse_args(argv)
    except UsageError as exc:
        fail("gqueue", CliError(f"{exc} (see gqueue --help)", EXIT_USAGE))
    wanted_users = split_values(args.users) + ([getpass.getuser()] if args.me else [])
    filters = JobFilters(split_values(args.names), split_values(args.partitions), split_values(args.accounts))
    layout = None
    if args.format is not None:
        if args.show_start or args.show_priority or args.as_json:
            fail("gqueue", CliError("-o/--format lays out the plain queue; it does not go with --start, --priority "
                                    "or --json", EXIT_USAGE))
        from garrison.cli.queue_format import QueueFormat

        try:
            layout = QueueFormat(args.format)
        except UsageError as exc:
            fail("gqueue", CliError(str(exc), EXIT_USAGE))
    if args.explain is not None:
        _explain(args.explain)
        return
    if args.iterate is None:
        _show(args, wanted_users, filters, layout)
        return
    from garrison.cmdline.parsing import parse_count  # only here: its imports cost every gqueue call ~7 ms

    try:
        interval = parse_count(args.iterate, minimum=1)
    except UsageError as exc:
        fail("gqueue", CliError(f"--iterate: {exc}", EXIT_USAGE))
    import time

    try:
        while True:
            print(time.strftime("%a %b %d %H:%M:%S %Y"))
            _show(args, wanted_users, filters, layout)
            print(flush=True)
            time.sleep(interval)  # the interval the user asked for between two looks at the queue
    except KeyboardInterrupt:
        return  # Ctrl-C ends the watch, as it ends squeue -i


def _show(args: argparse.Namespace, wanted_users: list[str], filters: JobFilters, layout: Any) -> None:
    """One look at the queue, in the form the options ask for."""
    if args.show_start or args.show_priority:
        _pending_view(wanted_users, split_values(args.jobs), filters, args.as_json, args.show_priority, args.noheader)
        return
    job_ids = split_values(args.jobs)
    if args.show_steps:
        _steps_view(wanted_users, job_ids, filters, args.as_json, args.noheader)
        return
    # The plain form (garrison/plainmsg.py): the queue's one call never imports protobuf.
    request = list_request(wanted_users, queue_states(args.states, job_ids), job_ids, filters.fields(),
                           fold=not (args.expand_arrays or args.as_json))
    try:
        with Client() as client:
            response = client.call_plain("ListJobs", request)
    except CliError as exc:
        fail("gqueue", exc)
    if args.as_json:
        print(jobs_json(response.jobs))
        return
    jobs = list(response.jobs)
    if layout is not None:
        text = layout.render(jobs, header=not args.noheader)
        if text:
            print(text)
        return
    _print_table(JOB_COLUMNS, [job_row(j) for j in jobs], args.noheader)


def _steps_view(users: list[str], job_ids: list[str], filters: JobFilters, as_json: bool, noheader: bool) -> None:
    """squeue -s: the steps of running jobs, each job's batch step first."""
    from garrison.cli.step_views import STEP_COLUMNS, batch_of_job, step_records, step_rows, steps_json

    request = {"users": users, "states": ["RUNNING"], "job_ids": job_ids, **filters.fields()}
    try:
        with Client() as client:
            jobs = list(client.call_plain("ListJobs", request).jobs)
            steps = list(client.call_plain("ListSteps", {"job_ids": [str(j.job_id) for j in jobs]}).steps) if jobs else []
    except CliError as exc:
        fail("gqueue", exc)
    now = jobs[0].now if jobs else 0.0
    records = step_records([batch_of_job(j) for j in jobs], [s for s in steps if s.state == "RUNNING"], now)
    if as_json:
        print(steps_json(records))
        return
    _print_table(STEP_COLUMNS, step_rows(records), noheader)


class JobFilters:
    """-n, -p and -A, which the controller applies (ListJobs and QueueDetails take the same three)."""

    def __init__(self, names: list[str], partitions: list[str], accounts: list[str]) -> None:
        self.names, self.partitions, self.accounts = names, partitions, accounts

    def fields(self) -> dict[str, list[str]]:
        return {"names": self.names, "partitions": self.partitions, "accounts": self.accounts}


def _pending_view(users: list[str], job_ids: list[str], filters: JobFilters, as_json: bool, show_priority: bool,
                  noheader: bool) -> None:
    from garrison.cli.queue_views import (
        PRIORITY_COLUMNS,
        START_COLUMNS,
        details_json,
        priority_rows,
        start_rows,
    )
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    try:
        with Client() as client:
            request = adminpb.QueueDetailsRequest(users=users, job_ids=job_ids, names=filters.names,
                                                  partitions=filters.partitions, accounts=filters.accounts)
            response = client.service_call(admin_pb2_grpc.AdminStub, "QueueDetails", request)
    except CliError as exc:
        fail("gqueue", exc)
    if as_json:
        print(details_json(response))
        return
    if show_priority:
        _print_table(PRIORITY_COLUMNS, priority_rows(response), noheader)
    else:
        _print_table(START_COLUMNS, start_rows(response), noheader)


def _explain(job_id: str) -> None:
    from garrison.cli.queue_views import explain_text
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    try:
        with Client() as client:
            request = adminpb.QueueDetailsRequest(job_ids=[job_id], explain=True)
            response = client.service_call(admin_pb2_grpc.AdminStub, "QueueDetails", request)
    except CliError as exc:
        fail("gqueue", exc)
    if not response.jobs:
        fail("gqueue", CliError(f"job {job_id} is not pending: nothing to explain (gjob {job_id} shows it)"))
    print(explain_text(response))


def _print_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], noheader: bool = False) -> None:
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(columns, rows, show_header=not noheader))
    else:
        text = plain_table(columns, rows, header=not noheader)
        if text:  # no header and no jobs: nothing at all, as squeue -h prints
            print(text)


def main(argv: list[str] | None = None) -> None:
    run_command(gqueue, argv)


if __name__ == "__main__":
    main()
