"""gjob: every detail of one job, its attempts included (scontrol show job's counterpart)."""

from __future__ import annotations

import click

from garrison.cli.client import Client, CliError, fail
from garrison.cli.fastpath import WHY_NOT_LOOKED_AT
from garrison.cli.render import job_detail


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until the job (every task of an array) has ended; print its state. "
              "On a terminal a live line shows its state, reason and elapsed time; a controller restart is waited out.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="With --wait: give up after SECONDS (exit 1).")
def gjob(job_id: str, wait: bool, timeout: float | None) -> None:
    """Show one job (12, or 12_3 for an array task)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        if not wait:
            with Client() as client:
                job = client.call("GetJob", pb.GetJobRequest(job_id=job_id))
                click.echo(job_detail(job))
                if job.state == "PENDING":
                    click.echo(_why_pending(client, job_id))
            return
        from garrison.cli.waiting import wait_for_job

        jobs = wait_for_job(job_id, timeout_s=timeout)
        states = sorted({j.state for j in jobs})
        click.echo(states[0] if len(states) == 1 else ",".join(states))
    except CliError as exc:
        fail("gjob", exc)


def _why_pending(client: Client, job_id: str) -> str:
    """The scheduler's explanation of a pending job (gqueue --explain's), as gjob's last lines."""
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    response = client.service_call(admin_pb2_grpc.AdminStub, "QueueDetails",
                                   adminpb.QueueDetailsRequest(job_ids=[job_id], explain=True))
    sentences = [s for detail in response.jobs for s in detail.explanation]
    return "   Why=" + ("; ".join(sentences) if sentences else WHY_NOT_LOOKED_AT)


def main() -> None:
    gjob(prog_name="gjob")


if __name__ == "__main__":
    main()
