"""gjob: every detail of one job, its attempts included (scontrol show job's counterpart)."""

from __future__ import annotations

import time

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.render import job_detail

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until the job (every task of an array) has ended; print its state.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="With --wait: give up after SECONDS (exit 1).")
def gjob(job_id: str, wait: bool, timeout: float | None) -> None:
    """Show one job (12, or 12_3 for an array task)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            if not wait:
                click.echo(job_detail(client.call("GetJob", pb.GetJobRequest(job_id=job_id))))
                return
            deadline = None if timeout is None else time.monotonic() + timeout
            delay = 0.05
            while True:
                jobs = client.call("ListJobs", pb.ListJobsRequest(job_ids=[job_id])).jobs
                if jobs and all(j.state in TERMINAL for j in jobs):
                    states = sorted({j.state for j in jobs})
                    click.echo(states[0] if len(states) == 1 else ",".join(states))
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise CliError(f"job {job_id} has not ended after {timeout:g}s")
                time.sleep(delay)  # polling the controller, bounded by the deadline
                delay = min(delay * 1.5, 0.5)
    except CliError as exc:
        fail("gjob", exc)


def main() -> None:
    gjob(prog_name="gjob")


if __name__ == "__main__":
    main()
