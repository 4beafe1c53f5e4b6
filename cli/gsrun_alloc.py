"""gsrun outside a job: as srun does, first ask for an allocation, then run the step in it.

The allocation is an allocation job, galloc's kind (controller/allocations.py): it holds its resources and
runs nothing of its own. gsrun submits it with the step's options as sbatch's (-N, -n, --ntasks-per-node,
--gpus-per-task, -c, -w, -J, and -t, -p, -A, -q, -G, --gpus-per-node, --mem, --mem-per-cpu, --mem-per-gpu,
--cpus-per-gpu), waits for it to start ("queued and waiting for resources"), runs the step in it with its output streamed here and the allocation's job
variables in its tasks' environment (SLURM_JOB_NODELIST, SLURM_NODELIST, SLURM_NNODES, SLURM_JOB_PARTITION,
SLURM_SUBMIT_DIR, ...: what srun's tasks get from the allocation it made), and releases it with the step's
exit code when the step ends, so the job ends COMPLETED, or FAILED with that code, as srun's job does in
sacct, and the resources are free again at once. While the step runs, gsrun renews the allocation's lease
(KeepAllocation, every third of it); a gsrun killed with SIGKILL stops renewing it, and the controller
cancels the allocation when the lease lapses, as it does galloc's. Interactive work therefore goes through
the same queue, priorities and quotas as batch work.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from garrison.cli.client import EXIT_USAGE, Client, CliError, as_refusal

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

PROG = "gsrun"
# The exit status of an allocation the controller refuses (the request itself is wrong): gsrun's usage status;
# srun (cli/slurm/srun.py) sets 1, Slurm's srun's for "Unable to allocate resources".
REFUSED_EXIT = EXIT_USAGE
POLL_S = 0.2
POLL_RENEW_S = 10.0  # at most this long between the allocation's lease renewals, whatever the lease
QUIET_WAIT_S = 1.0  # an allocation granted within this is not reported as waiting (as srun's granted at once)
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
                        ("--gpus-per-node", args.gpus_per_node), ("--mem", args.mem), ("--gres", args.gres),
                        ("--mem-per-cpu", args.mem_per_cpu), ("--mem-per-gpu", args.mem_per_gpu),
                        ("--cpus-per-gpu", args.cpus_per_gpu)):
        if value not in (None, ""):
            options += [flag, str(value)]
    if args.nodelist:
        options += ["-w", args.nodelist]
    name = args.job_name or os.path.basename(args.command[0]) if args.command else "gsrun"
    # gsub's parser needs something to run; the allocation's spec then drops it (as galloc's does).
    return [*options, "-J", name or "gsrun", "--wrap", PROG]


class Granted:
    """The allocation gsrun holds: its job id, its lease, and the environment its tasks get from it."""

    def __init__(self, job_id: int, environment: dict[str, str], keepalive_s: float) -> None:
        self.job_id = job_id
        self.environment = environment
        self.keepalive_s = keepalive_s or 30.0
        self._stop = threading.Event()
        self._renewing: threading.Thread | None = None

    def keep_renewed(self) -> None:
        """Renew the lease every third of it on a thread of its own (with a client of its own), until released."""
        self._renewing = threading.Thread(target=self._renew, name="allocation-lease", daemon=True)
        self._renewing.start()

    def _renew(self) -> None:
        from garrison.protos.v1 import garrison_pb2 as pb

        with Client() as client:
            while not self._stop.wait(min(POLL_RENEW_S, self.keepalive_s / 3)):
                try:
                    client.call("KeepAllocation", pb.KeepAllocationRequest(job_id=self.job_id))
                except CliError as error:
                    if not error.retryable:
                        return  # it has gone (cancelled, ended): the step hears of it from its own stream
                    # the controller is restarting: it gives every allocation a full lease when it is back

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._renewing is not None:
            self._renewing.join(timeout=5)


def request_allocation(client: Client, args: argparse.Namespace) -> Granted:
    """Submit the allocation and wait until it runs."""
    from dataclasses import replace

    from garrison.cmdline.parsing import UsageError
    from garrison.cmdline.submission import parse_submission
    from garrison.model.domain import LaunchMode
    from garrison.wire.convert_spec import spec_to_plain

    try:
        submission = parse_submission(allocation_options(args), os.environ, os.getcwd())
    except UsageError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    spec = replace(submission.spec, script=None, command=(), launch=LaunchMode.ALLOCATION)
    try:
        job_id = int(client.call_plain("SubmitJob", {"spec": spec_to_plain(spec)}).job_id)
    except CliError as exc:
        raise as_refusal(exc, REFUSED_EXIT, "Unable to allocate resources: ") from None
    try:
        return _wait_running(client, job_id)
    except BaseException:
        release_allocation(client, job_id, 1)  # interrupted, or it ended: nothing of it may stay queued
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


def _wait_running(client: Client, job_id: int) -> Granted:
    told = False
    # srun says nothing of an allocation granted at once (slurmctld tries to start it as it is submitted); the
    # cycle here starts one within milliseconds, so gsrun speaks only of one still waiting after a moment.
    quiet_until = time.monotonic() + QUIET_WAIT_S
    while True:
        status = _asking_again(client, "KeepAllocation", {"job_id": job_id}, WAIT_UNREACHABLE_S)
        if status.state == "RUNNING":
            if told:
                print(f"{PROG}: job {job_id} has been allocated resources", file=sys.stderr)
            return Granted(job_id, dict(status.environment), float(status.keepalive_s))
        if status.outcome or status.state not in ("PENDING", "CONFIGURING"):
            raise CliError(f"job {job_id} ended before it ran: {status.outcome or status.state} {status.reason}".strip())
        if not told and time.monotonic() >= quiet_until:
            reason = f" ({status.reason})" if status.reason else ""
            print(f"{PROG}: job {job_id} queued and waiting for resources{reason}", file=sys.stderr)
            told = True
        time.sleep(POLL_S)  # the queue's answer to "has it started?" is polled, as galloc does


def release_allocation(client: Client, job_id: int, exit_code: int) -> None:
    """End the allocation with the step's exit code (COMPLETED for 0, else FAILED, as srun's job ends); one
    still pending is cancelled."""
    try:
        _asking_again(client, "ReleaseAllocation", {"job_id": job_id, "exit_code": exit_code},
                      RELEASE_UNREACHABLE_S)
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
