"""gqueue: show the queue (squeue's counterpart)."""

from __future__ import annotations

import getpass
import sys

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.render import JOB_COLUMNS, job_row, jobs_json, plain_table, rich_table


def _split(values: tuple[str, ...]) -> list[str]:
    return [v for value in values for v in value.split(",") if v]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-u", "--user", "users", multiple=True, help="Only jobs of these users (comma list).")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("-t", "--states", "states", multiple=True, help="Only jobs in these states (comma list).")
@click.option("-j", "--jobs", "jobs", multiple=True, help="Only these job ids (comma list; 12 or 12_3).")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...]} as JSON.')
@click.option("--start", "show_start", is_flag=True,
              help="Pending jobs with their queue position and estimated start (from the last cycle).")
@click.option("--priority", "show_priority", is_flag=True,
              help="Pending jobs' priority and its weighted factors (like sprio).")
def gqueue(users: tuple[str, ...], me: bool, states: tuple[str, ...], jobs: tuple[str, ...], as_json: bool,
           show_start: bool, show_priority: bool) -> None:
    """Show pending, running and recently finished jobs."""
    wanted_users = _split(users) + ([getpass.getuser()] if me else [])
    if show_start or show_priority:
        _pending_view(wanted_users, _split(jobs), as_json, show_priority)
        return
    # The plain form (garrison/plainmsg.py): the queue's one call never imports protobuf.
    request = {"users": wanted_users, "states": [s.upper() for s in _split(states)], "job_ids": _split(jobs)}
    try:
        with Client() as client:
            response = client.call_plain("ListJobs", request)
    except CliError as exc:
        fail("gqueue", exc)
    if as_json:
        click.echo(jobs_json(response.jobs))
        return
    rows = [job_row(j) for j in response.jobs]
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(JOB_COLUMNS, rows))
    else:
        click.echo(plain_table(JOB_COLUMNS, rows))


def _pending_view(users: list[str], job_ids: list[str], as_json: bool, show_priority: bool) -> None:
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
            response = client.service_call(
                admin_pb2_grpc.AdminStub, "QueueDetails", adminpb.QueueDetailsRequest(users=users, job_ids=job_ids)
            )
    except CliError as exc:
        fail("gqueue", exc)
    if as_json:
        click.echo(details_json(response))
        return
    columns, rows = (PRIORITY_COLUMNS, priority_rows(response)) if show_priority else (START_COLUMNS, start_rows(response))
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print(rich_table(columns, rows))
    else:
        click.echo(plain_table(columns, rows))


def main() -> None:
    gqueue(prog_name="gqueue")


if __name__ == "__main__":
    main()
