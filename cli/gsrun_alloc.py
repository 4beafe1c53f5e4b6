"""gsrun outside a job: as srun does, first ask for an allocation, then run the step in it.

The allocation is a job that holds its resources and runs nothing of its own (its batch step sleeps); gsrun
submits it with the step's options as sbatch's (-N, -n, --ntasks-per-node, --gpus-per-task, -c, -w, -J, and
-t, -p, -A, -q, -G, --gpus-per-node, --mem), waits for it to start ("queued and waiting for resources"),
runs the step in it with its output streamed here, and cancels it when the step ends, so the resources are
free again at once. Interactive work therefore goes through the same queue, priorities and quotas as batch
work. A gsrun killed with SIGKILL cannot cancel its allocation: the job then ends at its time limit.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from garrison.cli.client import EXIT_USAGE, Client, CliError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

PROG = "gsrun"
HOLD_COMMAND = "exec sleep 2147483647"  # the allocation's batch step: hold the resources, do nothing
POLL_S = 0.2
# While the controller cannot be reached (a restart), how long the wait for the allocation and its release go
# on asking: the wait as long as gsrun takes a step up again after one (cli/gsrun.py), the release less, since
# the user is leaving.
WAIT_UNREACHABLE_S = 600.0
RELEASE_UNREACHABLE_S = 60.0
RETRY_S = 1.0


def allocation_options(args: argparse.Namespace) -> list[str]:
    """gsub's options for the allocation a step outside a job asks for."""
    options: list[str] = []
    for flag, value in (("-N", args.nodes), ("-n", args.ntasks), ("--ntasks-per-node", args.ntasks_per_node),
                        ("--gpus-per-task", args.gpus_per_task), ("-c", args.cpus_per_task), ("-t", args.time),
                        ("-p", args.partition), ("-A", args.account), ("-q", args.qos), ("-G", args.gpus),
                        ("--gpus-per-node", args.gpus_per_node), ("--mem", args.mem), ("--gres", args.gres)):
        if value not in (None, ""):
            options += [flag, str(value)]
    if args.nodelist:
        options += ["-w", args.nodelist]
    name = args.job_name or os.path.basename(args.command[0]) if args.command else "gsrun"
    return [*options, "-J", name or "gsrun", "-o", "/dev/null", "--wrap", HOLD_COMMAND]


def request_allocation(client: Client, args: argparse.Namespace) -> int:
    """Submit the allocation and wait until it runs; its job id."""
    from garrison.cmdline.parsing import UsageError
    from garrison.cmdline.submission import parse_submission, submit_request

    try:
        submission = parse_submission(allocation_options(args), os.environ, os.getcwd())
    except UsageError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    job_id = int(client.call_plain("SubmitJob", submit_request(submission)).job_id)
    try:
        return _wait_running(client, job_id)
    except BaseException:
        release_allocation(client, job_id)  # interrupted, or it ended: nothing of it may stay queued
        raise


def _asking_again(client: Client, method: str, request: dict[str, object], give_up_after_s: float) -> Any:
    """``client.call_plain``, asked again every RETRY_S while the controller cannot be reached (it is
    restarting: the allocation is in its queue all the same), saying so once, for up to ``give_up_after_s``."""
    unreachable_since: float | None = None
    while True:
        try:
            answer = client.call_plain(method, request)
        except CliError as error:
            if not error.retryable:
                raise
            now = time.monotonic()
            if unreachable_since is None:
                unreachable_since = now
                print(f"{PROG}: {error}; asking again", file=sys.stderr)
            elif now - unreachable_since > give_up_after_s:
                raise
            time.sleep(RETRY_S)
            continue
        if unreachable_since is not None:
            print(f"{PROG}: the controller answers again", file=sys.stderr)
        return answer


def _wait_running(client: Client, job_id: int) -> int:
    told = False
    while True:
        (job,) = _asking_again(client, "ListJobs", {"job_ids": [str(job_id)]}, WAIT_UNREACHABLE_S).jobs
        if job.state == "RUNNING":
            if told:
                print(f"{PROG}: job {job_id} has been allocated resources", file=sys.stderr)
            return job_id
        if job.state not in ("PENDING", "CONFIGURING"):
            raise CliError(f"job {job_id} ended before it ran: {job.state} {job.reason}".strip())
        if not told:
            reason = f" ({job.reason})" if job.reason else ""
            print(f"{PROG}: job {job_id} queued and waiting for resources{reason}", file=sys.stderr)
            told = True
        time.sleep(POLL_S)  # the queue's answer to "has it started?" is polled, as gsub --wait does


def release_allocation(client: Client, job_id: int) -> None:
    try:
        _asking_again(client, "CancelJobs", {"job_ids": [str(job_id)]}, RELEASE_UNREACHABLE_S)
    except CliError as exc:
        print(f"{PROG}: could not release job {job_id}: {exc}", file=sys.stderr)


class AllocationInterrupted(Exception):
    pass


def interruptible() -> None:
    """While waiting for the allocation, Ctrl-C and SIGTERM give up (and release it)."""
    def stop(signum: int, frame: object) -> None:
        raise AllocationInterrupted

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
