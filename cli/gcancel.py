"""gcancel: cancel jobs (scancel's counterpart)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

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
    if me:
        import getpass

        if user and user != getpass.getuser():
            fail("gcancel", CliError("--me and -u name different users", EXIT_USAGE))
        user = getpass.getuser()
    cancel_jobs("gcancel", job_ids, user=user, states=states, names=names, partitions=partitions,
                accounts=accounts, signal_name=signal_name, quiet=quiet)


def cancel_jobs(prog: str, job_ids: Sequence[str], *, user: str = "", states: Sequence[str] = (),
                names: Sequence[str] = (), partitions: Sequence[str] = (), accounts: Sequence[str] = (),
                signal_name: str = "", quiet: bool = False, usage_exit: int = EXIT_USAGE,
                verbose: bool = False) -> None:
    """gcancel's work, and scancel's (cli/slurm/scancel.py): cancel (or, with ``signal_name``, signal) the jobs
    named by id (``12``, ``12_3``; ``12.3`` is a step) and every job matching the filters. Exits on failure."""
    from garrison.cli.slurm.fields import state_names
    from garrison.cmdline.usage import UsageError
    from garrison.protos.v1 import garrison_pb2 as pb

    try:  # Slurm's short codes (PD, R, CG) as scancel -t reads them, and the long names
        state_list = [name for name in state_names(_split(states, upper=True)) if name != "ALL"]
    except UsageError as exc:
        fail(prog, CliError(str(exc), usage_exit))
    ids = _split(job_ids)
    name_list, partition_list, account_list = _split(names), _split(partitions), _split(accounts)
    verb = "signal" if signal_name else "cancel"
    step_ids = [ref for ref in ids if "." in ref]  # JOBID.STEP: that step only (scancel 12.3)
    ids = [ref for ref in ids if "." not in ref]
    if step_ids:
        _cancel_steps(prog, step_ids, signal_name)
        if verbose:
            print(f"{prog}: {'signalled' if signal_name else 'cancelled'} step(s) {', '.join(step_ids)}",
                  file=sys.stderr)
        if not ids:
            return
    if not ids and not (user or state_list or name_list or partition_list or account_list):
        fail(prog, CliError(f"nothing to {verb}: give job ids, or filters (-u, --me, -t, -n, -p, -A)", usage_exit))
    request = pb.CancelJobsRequest(job_ids=ids, user=user, states=state_list, signal=signal_name, names=name_list,
                                   partitions=partition_list, accounts=account_list)
    try:
        with Client() as client:
            response = client.call("CancelJobs", request)
    except CliError as exc:
        fail(prog, exc)
    if signal_name:
        if verbose and response.signalled:
            print(f"{prog}: signalled job(s) {', '.join(map(str, response.signalled))}", file=sys.stderr)
        if response.not_running:
            # As scancel: the others were signalled; these could not be, and the exit status says so.
            fail(prog, CliError(f"not running, so not signalled: {', '.join(response.not_running)}"))
        return
    if verbose and response.cancelled:
        print(f"{prog}: cancelled job(s) {', '.join(map(str, response.cancelled))}", file=sys.stderr)
    if not quiet and not response.cancelled and ids:
        print(f"{prog}: nothing to cancel (jobs already finished)", file=sys.stderr)


def _cancel_steps(prog: str, step_ids: list[str], signal_name: str) -> None:
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            for step_id in step_ids:
                client.call("CancelStep", pb.CancelStepRequest(step_id=step_id, signal=signal_name))
    except CliError as exc:
        fail(prog, exc)


def _split(values: Sequence[str], upper: bool = False) -> list[str]:
    items = [item for value in values for item in value.split(",") if item]
    return [item.upper() for item in items] if upper else items


def main() -> None:
    gcancel(prog_name="gcancel")


if __name__ == "__main__":
    main()
