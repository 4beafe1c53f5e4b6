"""gacct: accounting records of jobs and their attempts, and GPU usage (sacct's and sreport's counterpart).

The records come from the controller's store (the Accounting service), so finished jobs stay visible long
after gqueue has forgotten them, and across controller restarts.
"""

from __future__ import annotations

import getpass
import os
import sys
from datetime import datetime
from typing import Any

import click

from garrison.cli.accounting import (
    DEFAULT_LAYOUT,
    TIME_FORMATS_HELP,
    USAGE_COLUMNS,
    FormatError,
    TimeSpecError,
    format_columns,
    parse_time,
    record_rows,
    records_csv,
    records_json,
    select_columns,
    usage_csv,
    usage_header,
    usage_json,
    usage_rows,
)
from garrison.cli.client import EXIT_USAGE, Client, CliError, fail
from garrison.cli.render import plain_table, rich_table


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _print_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(headers, rows))
    else:
        click.echo(plain_table(headers, rows))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--jobs", "jobs", multiple=True, help="Only these jobs (comma list; 12, or 12_3 for an array task).")
@click.option("-u", "--user", "users", multiple=True, help="Only jobs of these users (comma list).")
@click.option("-a", "--allusers", is_flag=True, help="Jobs of every user (the default for root, and with -j).")
@click.option("-A", "--account", "accounts", multiple=True, help="Only jobs charged to these accounts (comma list).")
@click.option("-s", "--state", "states", multiple=True,
              help="Only jobs now in these states (comma list: PENDING, RUNNING, COMPLETED, FAILED, ...).")
@click.option("-S", "--starttime", "start", default=None,
              help=f"Jobs that existed at or after this time (default: today 00:00, or any time with -j). {TIME_FORMATS_HELP}.")
@click.option("-E", "--endtime", "end", default=None, help="Jobs that existed at or before this time (default: now).")
@click.option("-X", "--allocations", is_flag=True, help="One line per job, without its attempts.")
@click.option("--steps", "show_steps", is_flag=True,
              help="The jobs' steps (JOBID.batch, then gsrun's JOBID.0, JOBID.1, ...) instead of their attempts.")
@click.option("--usage", is_flag=True, help="GPU-hours per account and user in the period -S..-E instead of jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV with a header line.")
@click.option("-o", "--format", "fields", default=None, metavar="FIELD[%WIDTH],...",
              help="Only these columns of the table, in this order, as sacct's --format: e.g. JobID,JobName%20,State.")
def gacct(jobs: tuple[str, ...], users: tuple[str, ...], allusers: bool, accounts: tuple[str, ...],
          states: tuple[str, ...], start: str | None, end: str | None, allocations: bool, show_steps: bool, usage: bool,
          as_json: bool, as_csv: bool, fields: str | None) -> None:
    """Show accounting records: finished and running jobs with each attempt, or GPU usage with --usage."""
    try:
        if as_json and as_csv:
            raise CliError("choose one of --json and --csv", EXIT_USAGE)
        chosen = None
        if fields is not None:
            if as_json or as_csv or usage:
                raise CliError("--format chooses the table's columns; it does not go with --json, --csv or --usage",
                               EXIT_USAGE)
            try:
                chosen = format_columns(fields)
            except FormatError as exc:
                raise CliError(f"--format: {exc}", EXIT_USAGE) from None
        now = datetime.now().astimezone()
        try:
            start_time = parse_time(start, now) if start is not None else None
            end_time = parse_time(end, now) if end is not None else None
        except TimeSpecError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        wanted_states = [s.upper() for s in _split(states)]  # the controller names an unknown one
        wanted_users = _split(users)
        job_refs = _split(jobs)
        if usage:
            if job_refs or wanted_states or allocations:
                raise CliError("--usage takes only -S, -E, -u and -A", EXIT_USAGE)
            _show_usage(now, start_time, end_time, wanted_users, _split(accounts), as_json, as_csv)
            return
        if not wanted_users and not allusers and not job_refs and os.geteuid() != 0:
            wanted_users = [getpass.getuser()]  # like sacct: your own jobs unless you ask for more
        if start_time is None and not job_refs:
            start_time = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
        if start_time is not None and end_time is not None and start_time > end_time:
            raise CliError("the start time (-S) is after the end time (-E)", EXIT_USAGE)
        _show_records(job_refs, wanted_users, _split(accounts), wanted_states, start_time, end_time,
                      allocations, as_json, as_csv, now, chosen, show_steps)
    except CliError as exc:
        fail("gacct", exc)


def _show_records(job_refs: list[str], users: list[str], accounts: list[str], states: list[str],
                  start_time: float | None, end_time: float | None, allocations: bool, as_json: bool,
                  as_csv: bool, now: datetime, chosen: list[tuple[int, int | None]] | None = None,
                  show_steps: bool = False) -> None:
    from garrison.protos.v1 import accounting_pb2 as apb
    from garrison.protos.v1 import accounting_pb2_grpc as apb_grpc

    request = apb.JobRecordsRequest(job_ids=job_refs, users=users, accounts=accounts, states=states)
    if start_time is not None:
        request.start_time = start_time
    if end_time is not None:
        request.end_time = end_time
    records = []
    controller_now = now.timestamp()
    with Client() as client:
        while True:  # page through by job id until a short page
            response = client.service_call(apb_grpc.AccountingStub, "ListJobRecords", request)
            records.extend(response.jobs)
            controller_now = response.now or controller_now
            if len(response.jobs) < response.page_size or not response.jobs:
                break
            request.after_job_id = response.jobs[-1].job_id
        if show_steps:
            _show_steps(client, records, controller_now, as_json)
            return
    zone = now.tzinfo
    if as_json:
        click.echo(records_json(records, controller_now))
    elif as_csv:
        click.echo(records_csv(records, controller_now, zone, with_attempts=not allocations), nl=False)
    else:
        rows = record_rows(records, controller_now, zone, with_attempts=not allocations)
        _print_table(*select_columns(rows, DEFAULT_LAYOUT if chosen is None else chosen))


def _show_steps(client: Client, records: list[Any], now: float, as_json: bool) -> None:
    from garrison.cli.step_views import STEP_COLUMNS, batch_of_record, step_records, step_rows, steps_json
    from garrison.protos.v1 import garrison_pb2 as pb

    steps: list[Any] = []
    ids = [str(r.job_id) for r in records]
    for first in range(0, len(ids), 5000):  # a request names at most 10,000 jobs
        steps += client.call("ListSteps", pb.ListStepsRequest(job_ids=ids[first:first + 5000])).steps
    step_list = step_records([batch_of_record(r) for r in records], steps, now)
    if as_json:
        click.echo(steps_json(step_list))
    else:
        _print_table(STEP_COLUMNS, step_rows(step_list))


def _show_usage(now: datetime, start_time: float | None, end_time: float | None, users: list[str],
                accounts: list[str], as_json: bool, as_csv: bool) -> None:
    from garrison.protos.v1 import accounting_pb2 as apb
    from garrison.protos.v1 import accounting_pb2_grpc as apb_grpc

    start = start_time if start_time is not None else now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()
    end = end_time if end_time is not None else now.timestamp()
    if start >= end:
        raise CliError("the period is empty: the start time (-S) must be before the end time (-E)", EXIT_USAGE)
    request = apb.UsageRequest(start_time=start, end_time=end, users=users, accounts=accounts)
    with Client() as client:
        response = client.service_call(apb_grpc.AccountingStub, "GetUsage", request)
    if as_json:
        click.echo(usage_json(response))
    elif as_csv:
        click.echo(usage_csv(response), nl=False)
    else:
        click.echo(usage_header(response, now.tzinfo))
        _print_table(USAGE_COLUMNS, usage_rows(response.rows))


def main() -> None:
    gacct(prog_name="gacct")


if __name__ == "__main__":
    main()
