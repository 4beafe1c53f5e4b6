"""gcancel: cancel jobs (scancel's counterpart)."""

from __future__ import annotations

import click

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_ids", nargs=-1)
@click.option("-u", "--user", default="", help="Cancel every job of this user (yours unless you are an admin).")
@click.option("--me", is_flag=True, help="Only my jobs (the same as -u with your user name).")
@click.option("-t", "--state", "states", multiple=True, help="Only jobs in this state (repeatable, comma list).")
@click.option("-n", "--name", "names", multiple=True, help="Only jobs with this name (repeatable, comma list).")
@click.option("-p", "--partition", "partitions", multiple=True,
              help="Only jobs in this partition (repeatable, comma list).")
@click.option("-A", "--account", "accounts", multiple=True,
              help="Only jobs charged to this account (repeatable, comma list).")
@click.option("-s", "--signal", "signal_name", default="", metavar="SIG",
              help="Send SIG (USR1, SIGUSR1 or a number) to every rank of the running jobs instead of cancelling them.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
def gcancel(job_ids: tuple[str, ...], user: str, me: bool, states: tuple[str, ...], names: tuple[str, ...],
            partitions: tuple[str, ...], accounts: tuple[str, ...], signal_name: str, quiet: bool) -> None:
    """Cancel jobs by id (12, 12_3 for one array task, 12 for a whole array), or every job that matches the
    filters (user, state, name, partition, account; each given must hold); or, with --signal, send them a
    signal (scancel --signal)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    if me:
        import getpass

        if user and user != getpass.getuser():
            fail("gcancel", CliError("--me and -u name different users", EXIT_USAGE))
        user = getpass.getuser()
    state_list = _split(states, upper=True)
    ids = _split(job_ids)
    name_list, partition_list, account_list = _split(names), _split(partitions), _split(accounts)
    verb = "signal" if signal_name else "cancel"
    step_ids = [ref for ref in ids if "." in ref]  # JOBID.STEP: that step only (scancel 12.3)
    ids = [ref for ref in ids if "." not in ref]
    if step_ids:
        _cancel_steps(step_ids, signal_name)
        if not ids:
            return
    if not ids and not (user or state_list or name_list or partition_list or account_list):
        fail("gcancel", CliError(f"nothing to {verb}: give job ids, or filters (-u, --me, -t, -n, -p, -A)",
                                 EXIT_USAGE))
    request = pb.CancelJobsRequest(job_ids=ids, user=user, states=state_list, signal=signal_name, names=name_list,
                                   partitions=partition_list, accounts=account_list)
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


def _cancel_steps(step_ids: list[str], signal_name: str) -> None:
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            for step_id in step_ids:
                client.call("CancelStep", pb.CancelStepRequest(step_id=step_id, signal=signal_name))
    except CliError as exc:
        fail("gcancel", exc)


def _split(values: tuple[str, ...], upper: bool = False) -> list[str]:
    items = [item for value in values for item in value.split(",") if item]
    return [item.upper() for item in items] if upper else items


def main() -> None:
    gcancel(prog_name="gcancel")


if __name__ == "__main__":
    main()
