"""gjob: every detail of one job, its attempts included (scontrol show job's counterpart)."""

from __future__ import annotations

import click
from garrison.cli.client import Client, CliError, fail
from garrison.cli.render import job_detail


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id")
def gjob(job_id: str) -> None:
    """Show one job (12, or 12_3 for an array task)."""
    from garrison.protos.v1 import garrison_pb2 as pb

    try:
        with Client() as client:
            job = client.call("GetJob", pb.GetJobRequest(job_id=job_id))
    except CliError as exc:
        fail("gjob", exc)
    click.echo(job_detail(job))


def main() -> None:
    gjob(prog_name="gjob")


if __name__ == "__main__":
    main()
