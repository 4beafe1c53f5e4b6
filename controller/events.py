"""Job event log lines: one line per job state change, with the job's id and its nodes.

Installed as a ClusterState job observer, so every change that reaches the store is logged once, whatever
path made it (a submission, the scheduler, an agent's report, a timer, a cancel, a preemption).
"""

from __future__ import annotations

import logging

from garrison.logs import kv
from garrison.model.domain import Job

log = logging.getLogger("garrison.controller.jobs")


def job_nodes(job: Job) -> str:
    """The nodes of the job's current attempt, comma-separated, or "-" if it never ran."""
    attempt = job.current_attempt
    if attempt is None or not attempt.allocation.nodes:
        return "-"
    return ",".join(attempt.allocation.node_names)


def log_job_change(before: Job | None, after: Job) -> None:
    if before is not None and before.state == after.state:
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
    log.info("job event %s", kv(**fields))
