"""scancel: gcancel under Slurm's name, on the same cancel code (``gcancel.cancel_jobs``).

``scancel ID [ID...]`` (``12``, ``12_3`` an array task, ``12.3`` a step), filters ``-u -n -t -p -A --me``,
``-s/--signal SIG`` to signal without cancelling, ``-b/--batch`` (accepted: Garrison's signal reaches the
whole batch step), ``-q`` and ``-v``. Errors exit 1, as scancel's do.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from garrison.cli.client import EXIT_FAILURE, CliError, fail
from garrison.cli.gcancel import cancel_jobs
from garrison.cli.slurm import answer_version
from garrison.cli.slurm.fields import user_names
from garrison.cmdline.argparser import Parser, UsageError

PROG = "scancel"
# squeue's short state names, which scancel -t takes too (scancel -t PD).
SHORT_STATES = {"PD": "PENDING", "R": "RUNNING", "CF": "CONFIGURING", "CG": "COMPLETING"}


def states(values: list[str]) -> list[str]:
    """-t's values, each a comma list, in Garrison's long upper-case names."""
    names = [name.strip().upper() for value in values for name in value.split(",") if name.strip()]
    return [SHORT_STATES.get(name, name) for name in names]


def parser() -> Parser:
    parser = Parser(prog=PROG, description="Cancel jobs or job steps, or send them a signal (gcancel's work).")
    add = parser.add_argument
    add("job_ids", nargs="*", metavar="JOB_ID[_TASK][.STEP]", help="Jobs, array tasks or steps.")
    add("-u", "--user", default="", help="Every job of this user.")
    add("--me", action="store_true", help="Only my jobs.")
    add("-n", "--name", "--jobname", dest="names", action="append", default=[], help="Only jobs with this name.")
    add("-t", "--state", dest="states", action="append", default=[], help="Only jobs in this state (PENDING, ...).")
    add("-p", "--partition", dest="partitions", action="append", default=[], help="Only jobs in this partition.")
    add("-A", "--account", dest="accounts", action="append", default=[], help="Only jobs of this account.")
    add("-s", "--signal", default="", metavar="SIG", help="Send SIG to the running jobs instead of cancelling.")
    add("-b", "--batch", action="store_true", help="Signal the batch step (Garrison: the job's processes).")
    add("-f", "--full", action="store_true", help="With --batch: every process of the batch step (Garrison's way).")
    add("-q", "--quiet", action="store_true", help="Print nothing for jobs already ended.")
    add("-v", "--verbose", action="count", default=0, help="Say what was cancelled or signalled.")
    add("-i", "--interactive", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    answer_version(argv)
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.interactive:
            raise UsageError("--interactive is not supported")
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_FAILURE))
    user = user_names([args.user])[0] if args.user else ""
    if args.me:
        if user and user != getpass.getuser():
            fail(PROG, CliError("--me and -u name different users", EXIT_FAILURE))
        user = getpass.getuser()
    # --batch alone cancels the job (its batch step ends it), with --signal it signals the job's processes.
    cancel_jobs(PROG, args.job_ids, user=user, states=states(args.states), names=args.names, partitions=args.partitions,
                accounts=args.accounts, signal_name=args.signal, quiet=args.quiet, usage_exit=EXIT_FAILURE,
                verbose=bool(args.verbose))


if __name__ == "__main__":
    main()
