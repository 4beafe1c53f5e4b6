"""galloc: get an interactive allocation and run a command in it on this host (Slurm's salloc).

``galloc [sbatch-like options] [COMMAND [ARGS...]]`` submits a job that runs nothing on its nodes but holds
them (launch mode ``allocation``) through the same queue, priorities and quotas as batch work. While it
waits, galloc says where it stands on stderr; once granted it runs COMMAND (default: $SHELL) here, with the
allocation's environment (SLURM_JOB_ID, SLURM_JOB_NODELIST, GARRISON_JOB_ID, ...), and when the command
exits it releases the allocation, which ends COMPLETED (FAILED for a non-zero code) with the command's exit
code. galloc exits with that code too.

It renews the allocation's keep-alive lease all along (controller/allocations.py): killed, or cut off from
the controller for longer than the lease, it loses the allocation. When the allocation ends under it (time
limit, gcancel, preemption), the command's process group gets SIGHUP, then SIGTERM and SIGKILL if it does not
end, and galloc says why. Ctrl-C while waiting cancels the request; while the command runs, Ctrl-C is the
command's (galloc ignores it, as salloc does), and SIGTERM or SIGHUP sent to galloc go on to the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from garrison.cli.client import EXIT_USAGE, Client, CliError, as_refusal, fail, run_command
from garrison.cmdline.parsing import UsageError
from garrison.cmdline.submission import HelpRequested, _given_options, parse_submission
from garrison.model.jobspec import JobSpec, LaunchMode

PROG = "galloc"
# The exit status of an allocation the controller refuses: galloc's usage status; salloc (cli/slurm/salloc.py)
# sets 1, Slurm's salloc's for "Job submit/allocate failed".
REFUSED_EXIT = EXIT_USAGE
POLL_INTERVAL_S = 1.0  # how often galloc asks while it waits, and while the command runs (at most)
HANGUP_GRACE_S = 5.0  # after SIGHUP, before SIGTERM; then as long again before SIGKILL
RELEASE_RETRY_S = 30.0  # how long a release is retried while the controller is unreachable
JOB_NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+@:=,-")

# gsub's options that mean nothing for an allocation: refused with a one-line error.
NOT_FOR_ALLOCATIONS = {
    "array": "--array", "wrap": "--wrap", "launch": "--launch", "wait": "--wait", "test_only": "--test-only",
    "hold": "--hold", "parsable": "--parsable", "output": "--output", "error": "--error", "open_mode": "--open-mode",
}
# What galloc says when the allocation ends under its command, by where the job went.
REVOKED = {
    "TIMEOUT": "Job {job} has exceeded its time limit and its allocation has been revoked.",
    "CANCELLED": "Job allocation {job} has been revoked.",
    "PENDING": "Job allocation {job} has been revoked: preempted.",
    "NODE_FAIL": "Job allocation {job} has been revoked: a node failed.",
}


@dataclass(frozen=True)
class AllocationRequest:
    spec: JobSpec
    command: tuple[str, ...]  # empty: the user's shell


def input_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """salloc's input variables (SALLOC_ACCOUNT, ...; GALLOC_* take precedence) under the names gsub's
    option reader knows; sbatch's own (SBATCH_*, GSUB_*) are not galloc's and are left out."""
    found = {name: value for name, value in environ.items() if not name.startswith(("SBATCH_", "GSUB_"))}
    for prefix, target in (("SALLOC_", "SBATCH_"), ("GALLOC_", "GSUB_")):
        for name, value in environ.items():
            if name.startswith(prefix):
                found[target + name.removeprefix(prefix)] = value
    return found


def parse_allocation(argv: Sequence[str], environ: Mapping[str, str], cwd: str) -> AllocationRequest:
    """galloc's command line: gsub's resource options, then the command to run here (everything from the
    first word that is not an option on, as salloc reads it). UsageError for any mistake."""
    given = _given_options(list(argv))
    for name, flag in NOT_FOR_ALLOCATIONS.items():
        if name in given:
            raise UsageError(f"{flag} is not a galloc option (galloc runs its command here, in an allocation)")
    command: tuple[str, ...] = ()
    if "script" in given:
        command = (str(given["script"]), *(str(word) for word in given.get("script_args", ())))  # type: ignore[attr-defined]
    options = list(argv[: len(argv) - len(command)])
    if options and options[-1] == "--":
        options.pop()
    inputs = input_environment(environ)
    # gsub's parser needs something to run; the allocation's spec then drops it.
    submission = parse_submission([*options, "--wrap", PROG], inputs, cwd)
    spec = replace(submission.spec, script=None, command=(), launch=LaunchMode.ALLOCATION)
    if "export" not in given and not inputs.get("SBATCH_EXPORT") and not inputs.get("GSUB_EXPORT"):
        spec = replace(spec, env=dict(environ))
    if "job_name" not in given and not inputs.get("SBATCH_JOB_NAME") and not inputs.get("GSUB_JOB_NAME"):
        spec = replace(spec, name=default_job_name(command, environ))
    return AllocationRequest(spec=spec, command=command)


def allocation_help(gsub_help: str) -> str:
    """gsub's option help under galloc's usage: the options are gsub's, the positional words a command."""
    options = gsub_help[gsub_help.index("\noptions:") + 1:]
    refused = ", ".join(NOT_FOR_ALLOCATIONS.values())
    return (
        f"usage: {PROG} [OPTIONS] [COMMAND [ARGS...]]\n\n"
        "Get an interactive allocation and run COMMAND (default: $SHELL) on this host with its environment\n"
        "(SLURM_JOB_ID, SLURM_JOB_NODELIST, ...), as salloc does; the allocation is released when it exits.\n"
        f"The options are gsub's; not for {PROG}: {refused}.\n\n" + options
    )


def default_job_name(command: Sequence[str], environ: Mapping[str, str]) -> str:
    """The command's name, as salloc names its job (the shell's when no command is given)."""
    program = command[0] if command else environ.get("SHELL") or "/bin/sh"
    name = os.path.basename(program)[:128]
    return name if name and set(name) <= JOB_NAME_CHARACTERS else PROG


def shell_command(environ: Mapping[str, str]) -> list[str]:
    return [environ.get("SHELL") or "/bin/sh"]


def waiting_line(status: Any) -> str:
    """``waiting for resources: position 3, estimated start 14:05`` (and the reason when it is not the
    resources), from one status reply."""
    parts = []
    if status.position:
        parts.append(f"position {status.position}")
    if status.HasField("estimated_start"):
        parts.append(f"estimated start {_clock_time(status.estimated_start, status.now)}")
    else:
        parts.append("no estimated start yet")
    why = f" ({status.reason})" if status.reason and status.reason not in ("Resources", "None") else ""
    return f"waiting for resources: {', '.join(parts)}{why}"


def _clock_time(when: float, now: float) -> str:
    """14:05 today, 2026-12-03 14:05 on another day."""
    moment = time.localtime(when)
    if time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M", moment)
    return time.strftime("%Y-%m-%d %H:%M", moment)


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP while galloc waits for the allocation."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


class Allocation:
    """One allocation held by this galloc: its status requests (which renew its lease) and its release."""

    def __init__(self, client: Client, job_id: int) -> None:
        self.client = client
        self.job_id = job_id
        self.keepalive_s = 30.0
        self.unreachable_since: float | None = None

    def status(self) -> Any | None:
        """The controller's answer, or None while it cannot be reached (said once)."""
        from garrison.protos.v1 import garrison_pb2 as pb

        try:
            reply = self.client.call("KeepAllocation", pb.KeepAllocationRequest(job_id=self.job_id))
        except CliError as error:
            if not error.retryable:
                raise
            if self.unreachable_since is None:
                self.unreachable_since = time.monotonic()
                say(f"{error}; retrying (the allocation is lost after {self.keepalive_s:g}s without contact)")
            return None
        if self.unreachable_since is not None:
            say("the controller answers again")
            self.unreachable_since = None
        self.keepalive_s = reply.keepalive_s or self.keepalive_s
        return reply

    def interval(self) -> float:
        return min(POLL_INTERVAL_S, self.keepalive_s / 3)

    def release(self, exit_code: int) -> None:
        from garrison.protos.v1 import garrison_pb2 as pb

        deadline = time.monotonic() + RELEASE_RETRY_S
        while True:
            try:
                self.client.call("ReleaseAllocation", pb.ReleaseAllocationRequest(job_id=self.job_id,
                                                                                  exit_code=exit_code))
                return
            except CliError as error:
                if not error.retryable or time.monotonic() > deadline:
                    say(f"could not release job allocation {self.job_id}: {error}")
                    return
            time.sleep(self.interval())  # the controller is unreachable: ask again, until the deadline

    def cancel(self) -> None:
        try:
            self.client.call_plain("CancelJobs", {"job_ids": [str(self.job_id)]})
        except CliError as error:
            say(f"could not cancel job {self.job_id}: {error}")


def wait_for_grant(allocation: Allocation) -> Any:
    """Poll until the allocation runs on its nodes; say where it stands whenever that changes. Returns the
    status that granted it; exits when it ended first."""
    shown = ""
    while True:
        status = allocation.status()
        if status is not None:
            if status.state == "RUNNING":
                return status
            if status.outcome or status.state == "COMPLETING":
                say(REVOKED.get(status.outcome, REVOKED["CANCELLED"]).format(job=allocation.job_id)
                    + (f" ({status.reason})" if status.reason else ""))
                sys.exit(1)
            if status.state == "PENDING" and status.position:
                line = waiting_line(status)
                if line != shown:
                    say(line)
                    shown = line
        time.sleep(allocation.interval())  # polling the controller: it has no push channel to galloc


def _terminal_fd() -> int | None:
    """Our controlling terminal's descriptor (stdin), when galloc runs interactively."""
    try:
        return 0 if os.isatty(0) else None
    except OSError:
        return None


def _take_terminal(fd: int | None, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground process group (ignoring SIGTTOU, which a background caller
    would get)."""
    if fd is None:
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass  # no longer our terminal: nothing to hand over
    finally:
        signal.signal(signal.SIGTTOU, previous)


@dataclass(frozen=True)
class CommandEnded:
    exit_code: int  # 128+N for signal N, as a shell reports it
    revoked: bool  # the allocation ended under the command: there is nothing left to release


def run_command_in(allocation: Allocation, command: Sequence[str], environment: Mapping[str, str]) -> CommandEnded:
    """Run the command with the allocation's environment in its own process group (the terminal's foreground
    group, interactively), renewing the lease while it runs."""
    terminal = _terminal_fd()

    def child_setup() -> None:
        os.setpgid(0, 0)
        _take_terminal(terminal, os.getpgrp())
        for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_DFL)

    forwarded: list[int] = []
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda signum, frame: forwarded.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's
    try:
        child = subprocess.Popen(list(command), env=command_environment(environment), preexec_fn=child_setup)
    except OSError as error:
        say(f"cannot run {command[0]}: {error.strerror or error}")
        return CommandEnded(127 if isinstance(error, FileNotFoundError) else 126, revoked=False)
    revoked_at: float | None = None
    escalation = [signal.SIGHUP, signal.SIGTERM, signal.SIGKILL]
    try:
        while True:
            try:
                code = child.wait(timeout=allocation.interval())
                break
            except subprocess.TimeoutExpired:
                pass
            while forwarded:
                _signal_group(child.pid, forwarded.pop(0))
            now = time.monotonic()
            if revoked_at is None:
                try:
                    status = allocation.status()
                    gone = status is not None and status.state != "RUNNING"
                    why = REVOKED.get(status.outcome, REVOKED["CANCELLED"]) if status is not None and gone else ""
                except CliError as error:  # the controller refuses to say (the job is unknown to it): it is lost
                    gone, why = True, f"Job allocation {{job}} is lost: {error}"
                if gone:
                    say(why.format(job=allocation.job_id))
                    revoked_at = now
                    _signal_group(child.pid, escalation.pop(0))
            elif escalation and now >= revoked_at + HANGUP_GRACE_S * (3 - len(escalation)):
                _signal_group(child.pid, escalation.pop(0))
    finally:
        _take_terminal(terminal, os.getpgrp())
    return CommandEnded(code if code >= 0 else 128 - code, revoked=revoked_at is not None)


def command_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: ours, the allocation's, and Slurm's command names (``garrison slurm-path``)
    first on its PATH, as every job and step has them: ``srun`` in a galloc/salloc shell runs a step."""
    from garrison.slurmpath import ensure_slurm_path, with_slurm_path

    directory = ensure_slurm_path()
    return with_slurm_path({**os.environ, **environment}, str(directory) if directory is not None else None)


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass  # the command's group has emptied meanwhile


def main(argv: list[str] | None = None) -> None:
    run_command(_galloc, argv)


def _galloc(args: list[str]) -> None:
    try:
        request = parse_allocation(args, os.environ, os.getcwd())
    except HelpRequested as help_text:
        print(allocation_help(help_text.text))
        sys.exit(0)
    except UsageError as exc:
        fail(PROG, CliError(str(exc), EXIT_USAGE))
    command = list(request.command) or shell_command(os.environ)
    from garrison.wire.convert_spec import spec_to_plain

    with Client() as client:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, _raise_interrupted)
        allocation: Allocation | None = None
        try:
            try:
                response = client.call_plain("SubmitJob", {"spec": spec_to_plain(request.spec)})
            except CliError as exc:
                fail(PROG, as_refusal(exc, REFUSED_EXIT, "Job submit/allocate failed: "))
            allocation = Allocation(client, int(response.job_id))
            say(f"Pending job allocation {allocation.job_id}")
            say(f"job {allocation.job_id} queued and waiting for resources")
            granted = wait_for_grant(allocation)
        except Interrupted as interrupt:
            if allocation is not None:
                allocation.cancel()
                say(f"Job allocation {allocation.job_id} has been revoked ({interrupt} while waiting).")
            sys.exit(1)
        except CliError as exc:
            if allocation is not None:
                allocation.cancel()
            fail(PROG, exc)
        say(f"Granted job allocation {allocation.job_id}")
        say(f"Nodes {granted.environment.get('SLURM_JOB_NODELIST', ','.join(granted.nodes))} are ready for job")
        try:
            ended = run_command_in(allocation, command, dict(granted.environment))
        except CliError as exc:
            fail(PROG, exc)
        if not ended.revoked:
            say(f"Relinquishing job allocation {allocation.job_id}")
            allocation.release(ended.exit_code)
    sys.exit(ended.exit_code)


if __name__ == "__main__":
    main()
