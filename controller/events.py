"""Job event log lines: one line per job state change, with the job's id and its nodes.

Installed as a ClusterState job observer, so every change that reaches the store is logged once, whatever
path made it (a submission, the scheduler, an agent's report, a timer, a cancel, a preemption).

One exception, at DEBUG rather than INFO: an array task that never ran being submitted or cancelled. A
100,000-task array would otherwise write 100,000 lines twice (and spend seconds of the event loop on them);
the engine's one line per submission (``submitted job=12 tasks=100000``) and per cancel stands for them.
"""

from __future__ import annotations

import logging

from garrison.logs import kv
from garrison.model.domain import Job, JobState

log = logging.getLogger("garrison.controller.jobs")


def job_nodes(job: Job) -> str:
    """The nodes of the job's current attempt, comma-separated, or "-" if it never ran."""
    attempt = job.current_attempt
    if attempt is None or not attempt.allocation.nodes:
        return "-"
    return ",".join(attempt.allocation.node_names)


def _never_ran_array_task(before: Job | None, after: Job) -> bool:
    return (after.array_job_id is not None and not after.attempts
            and after.state in (JobState.PENDING, JobState.CANCELLED)
            and (before is None or before.state == JobState.PENDING))


def log_job_change(before: Job | None, after: Job) -> None:
    if before is not None and before.state == after.state:
        return
    if _never_ran_array_task(before, after) and not log.isEnabledFor(logging.DEBUG):
        return
    fields: dict[str, object] = {
        "job": after.job_id,  # the numeric id, as the agents log it; array tasks also get array=12_3
        "node": job_nodes(after),
        "state": after.state.value,
        "from": before.state.value if before is not None else "-",
        "user": after.user,
        "account": after.account,
    }
    if after.array_job_id is not None:
        fields["array"] = after.display_id
    if after.current_attempt is not None:
        fields["attempt"] = after.current_attempt.attempt
    if after.exit_code is not None and after.state.is_terminal:
        fields["exit_code"] = after.exit_code
    if after.reason:
        fields["reason"] = after.reason
    log.log(logging.DEBUG if _never_ran_array_task(before, after) else logging.INFO, "job event %s", kv(**fields))
