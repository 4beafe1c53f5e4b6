"""gcancel: cancel jobs (scancel's counterpart)."""

from __future__ import annotations

import click

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_ids", nargs=-1)
@click.option("-u", "--user", default="", help="Cancel every job of this user (yours unless you are an admin).")
@click.option("-t", "--state", "states", multiple=True, help="Only jobs in this state (repeatable, comma list).")
@click.option("-s", "--signal", "signal_name", default="", metavar="SIG",
              help="Send SIG (USR1, SIGUSR1 or a number) to every rank of the running jobs instead of cancelling them.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
def gcancel(job_ids: tuple[str, ...], user: str, states: tuple[str, ...], signal_name: str, quiet: bool) -> None:
    """Cancel jobs by id (12, 12_3 for one array task, 12 for a whole array), by user, or by state; or, with
    --signal, send them a signal (scancel --signal)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    state_list = [s.upper() for value in states for s in value.split(",") if s]
    ids = [i for value in job_ids for i in value.split(",") if i]
    verb = "signal" if signal_name else "cancel"
    if not ids and not user and not state_list:
        fail("gcancel", CliError(f"nothing to {verb}: give job ids, -u USER or -t STATE", EXIT_USAGE))
    request = pb.CancelJobsRequest(job_ids=ids, user=user, states=state_list, signal=signal_name)
    try:
        with Client() as client:
            response = client.call("CancelJobs", request)
    except CliError as exc:
        fail("gcancel", exc)
    if signal_name:
        if response.not_running:
            # As scancel: the others were signalled; these could not be, and the exit status says so.
            fail("gcancel", CliError(f"not running, so not signalled: {', '.join(response.not_running)}"))
        return
    if not quiet and not response.cancelled and ids:
        click.echo("gcancel: nothing to cancel (jobs already finished)", err=True)


def main() -> None:
    gcancel(prog_name="gcancel")


if __name__ == "__main__":
    main()
