"""gsub: submit a batch job (sbatch's counterpart)."""

from __future__ import annotations

import os
import sys

from garrison.cli.client import EXIT_USAGE, Client, CliError, as_refusal, fail, run_command
from garrison.cmdline.parsing import UsageError
from garrison.cmdline.submission import HelpRequested, parse_submission, submit_request, with_default_output

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def main(argv: list[str] | None = None) -> None:
    run_command(_gsub, argv)


def _gsub(args: list[str]) -> None:
    submit(args, "gsub")


def submit(args: list[str], prog: str, usage_exit: int = EXIT_USAGE, default_output: str | None = None,
           default_array_output: str | None = None, honour_quiet: bool = False) -> None:
    """gsub, or sbatch (cli/slurm/sbatch.py) under its name: ``prog`` names the command in its messages and a
    script read from standard input; a usage error exits ``usage_exit``; without -o the job writes to
    ``default_output`` (``default_array_output`` for an array), where gsub leaves the agent's default. With
    ``honour_quiet``, -Q/--quiet is acted on as sbatch does: no warnings, no ``Submitted batch job`` line."""
    try:
        submission = parse_submission(args, os.environ, os.getcwd(), stdin=_script_on_stdin(), prog=prog)
    except HelpRequested as help_text:
        print(help_text.text.replace("gsub", prog) if prog != "gsub" else help_text.text)
        sys.exit(0)
    except UsageError as exc:
        fail(prog, CliError(str(exc), usage_exit))
    submission = with_default_output(submission, default_output, default_array_output)
    quiet = honour_quiet and "--quiet" in submission.ignored
    if submission.ignored and not quiet:
        print(f"{prog}: warning: ignoring {', '.join(submission.ignored)}: Garrison does not act on "
              f"{'it' if len(submission.ignored) == 1 else 'them'}", file=sys.stderr)
    try:
        with Client() as client:
            response = client.call_plain("SubmitJob", submit_request(submission))
    except CliError as exc:
        # The controller refused the request itself (EXIT_USAGE): as a usage error (sbatch: 1, as all its errors)
        fail(prog, as_refusal(exc, usage_exit))
    if submission.test_only:
        print(f"{prog}: {estimate_line(response)} (not submitted)", file=sys.stderr)
        return
    if submission.parsable:
        print(response.job_id)
    elif not quiet:
        print(f"Submitted batch job {response.job_id}")
    if submission.wait:
        _wait(str(response.job_id), prog)


def _wait(job_id: str, prog: str = "gsub") -> None:
    """sbatch --wait: block until the job has ended, exit with its exit code."""
    from garrison.cli.waiting import exit_status, wait_for_job

    sys.stdout.flush()  # the job id first, for the scripts that read it
    try:
        jobs = wait_for_job(job_id)
    except CliError as exc:
        fail(prog, exc)
    except KeyboardInterrupt:
        cancel = "gcancel" if prog == "gsub" else "scancel"
        print(f"{prog}: stopped waiting; job {job_id} goes on ({cancel} {job_id} ends it)", file=sys.stderr)
        sys.exit(130)
    sys.exit(exit_status(jobs))


def _script_on_stdin() -> Callable[[], bytes] | None:
    """A reader of the script on standard input (``gsub <<EOF``), as sbatch reads one; None on a terminal,
    where waiting for a script nobody is typing would only look like a hang."""
    try:
        if sys.stdin is None or sys.stdin.isatty():
            return None
    except ValueError:  # stdin closed
        return None
    return sys.stdin.buffer.read


def estimate_line(response: Any) -> str:
    """What --test-only found, in one line, as sbatch --test-only says it."""
    import time

    where = f" on {','.join(response.nodes)}" if response.nodes else ""
    if response.HasField("estimated_start"):
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(response.estimated_start))
        return f"job would start at {when}{where} in partition {response.partition}"
    why = f" ({response.reason})" if response.reason else ""
    return f"job would wait{why} in partition {response.partition}; no start can be planned for it now"


if __name__ == "__main__":
    main()
