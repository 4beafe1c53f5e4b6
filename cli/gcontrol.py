"""gcontrol: control jobs (scontrol's job side): hold, release, requeue, update.

A job's owner, its account's coordinators and admins may control it; raising a time limit takes a
coordinator or an admin, setting a priority an admin. The controller checks and says why it refuses.
"""

from __future__ import annotations

from typing import Any

import click

from garrison.cli.client import EXIT_USAGE, Client, CliError, fail
from garrison.cmdline.parsing import UsageError, parse_nice, parse_time_limit, slurm_dependency

CONTEXT = {"help_option_names": ["-h", "--help"]}


def _ids(job_ids: tuple[str, ...]) -> list[str]:
    return [i for value in job_ids for i in value.split(",") if i]


def _control(action: str, job_ids: tuple[str, ...], quiet: bool = False, **fields: Any) -> None:
    from garrison.protos.v1 import admin_pb2 as adminpb
    from garrison.protos.v1 import admin_pb2_grpc

    ids = _ids(job_ids)
    if not ids:
        fail("gcontrol", CliError(f"nothing to {action}: give job ids", EXIT_USAGE))
    request = adminpb.JobControlRequest(action=action, job_ids=ids)
    for name, value in fields.items():
        if value is not None:
            setattr(request, name, value)
    try:
        with Client() as client:
            response = client.service_call(admin_pb2_grpc.AdminStub, "ControlJobs", request)
    except CliError as exc:
        fail("gcontrol", exc)
    if not response.job_ids and not quiet:
        why = {"hold": "not pending", "release": "not held", "requeue": "not running"}.get(action, "unchanged")
        fail("gcontrol", CliError(f"no job to {action} ({why})"))


@click.group(context_settings=CONTEXT)
def gcontrol() -> None:
    """Control jobs: gcontrol hold|release|requeue|update JOB..."""


@gcontrol.command()
@click.argument("job_ids", nargs=-1)
def hold(job_ids: tuple[str, ...]) -> None:
    """Keep pending jobs from starting (a hold by an admin or coordinator only they may release)."""
    _control("hold", job_ids)


@gcontrol.command()
@click.argument("job_ids", nargs=-1)
def release(job_ids: tuple[str, ...]) -> None:
    """Let held jobs start again."""
    _control("release", job_ids)


@gcontrol.command()
@click.argument("job_ids", nargs=-1)
def requeue(job_ids: tuple[str, ...]) -> None:
    """Stop running jobs and put them back in the queue."""
    _control("requeue", job_ids)


@gcontrol.command()
@click.argument("job_ids", nargs=-1)
@click.option("-t", "--time-limit", default=None, metavar="TIME",
              help="New time limit (owners may only lower it): M, M:S, H:M:S, D-H[:M[:S]].")
@click.option("--priority", type=int, default=None, help="Admins: an adjustment added to the computed priority.")
@click.option("-q", "--qos", default=None, help="New QoS, among those the job's account and partition allow.")
@click.option("--nice", "nice_text", default=None, metavar="N",
              help="New nice value, subtracted from the priority (negative: admins only).")
@click.option("-J", "--name", default=None, help="New job name.")
@click.option("--comment", default=None, help="New comment (empty: none).")
@click.option("-d", "--dependency", default=None, metavar="LIST",
              help="New dependency list of a pending job, as gsub -d takes it (empty: none).")
@click.option("--array-task-throttle", type=click.IntRange(min=0), default=None, metavar="N",
              help="An array's tasks running at once (its %%N); 0: no limit.")
def update(job_ids: tuple[str, ...], time_limit: str | None, priority: int | None, qos: str | None,
           nice_text: str | None, name: str | None, comment: str | None, dependency: str | None,
           array_task_throttle: int | None) -> None:
    """Change a job's time limit, priority, QoS, nice value, name, comment or dependency."""
    seconds = nice = None
    if nice_text is not None:
        try:
            nice = parse_nice(nice_text)
        except UsageError as exc:
            fail("gcontrol", CliError(f"--nice: {exc}", EXIT_USAGE))
    if time_limit is not None:
        try:
            seconds = parse_time_limit(time_limit)
        except UsageError as exc:
            fail("gcontrol", CliError(f"--time-limit: {exc}", EXIT_USAGE))
    if dependency:
        try:
            dependency = slurm_dependency(dependency)
        except UsageError as exc:
            fail("gcontrol", CliError(f"--dependency: {exc}", EXIT_USAGE))
    if all(value is None for value in (seconds, priority, qos, nice, name, comment, dependency, array_task_throttle)):
        fail("gcontrol", CliError("nothing to update: give --time-limit, --priority, --qos, --nice, --name, "
                                  "--comment, --dependency or --array-task-throttle", EXIT_USAGE))
    _control("update", job_ids, time_limit_s=seconds, priority=priority, qos=qos, nice=nice, name=name,
             comment=comment, dependency=dependency, array_task_throttle=array_task_throttle)


def main() -> None:
    gcontrol(prog_name="gcontrol")


if __name__ == "__main__":
    main()
