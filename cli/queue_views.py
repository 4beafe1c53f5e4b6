"""gqueue --start and --priority: pending jobs with their queue position, estimated start and priority
factors, from the controller's last scheduling cycle (like squeue --start and sprio). Pure functions from
the Admin service's QueueDetailsResponse to rows, so the views are testable as text."""

from __future__ import annotations

import json
import time
from typing import Any

START_COLUMNS = ("JOBID", "PARTITION", "NAME", "USER", "ACCOUNT", "POS", "START_TIME", "NODES(REASON)")
PRIORITY_COLUMNS = ("JOBID", "USER", "ACCOUNT", "PRIORITY", "AGE", "FAIRSHARE", "QOS", "JOBSIZE", "PARTITION",
                    "TIMELIMIT", "ADMIN", "NICE")


def _when(epoch: float, now: float) -> str:
    if epoch <= now:
        return "now"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def start_rows(response: Any) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for detail in response.jobs:
        job = detail.job
        start = _when(detail.estimated_start, response.now) if detail.HasField("estimated_start") else "N/A"
        rows.append((
            job.display_id, job.partition, job.name, job.user, job.account,
            str(detail.position) if detail.position else "-", start, f"({job.reason or 'None'})",
        ))
    return rows


def explain_text(response: Any) -> str:
    """gqueue --explain JOBID: each pending job's reason, queue position and estimated start, then why it
    waits, a sentence a line (from the last scheduling cycle)."""
    blocks = []
    for detail in response.jobs:
        job = detail.job
        where = f"position {detail.position}" if detail.position else "not yet in a cycle"
        start = _when(detail.estimated_start, response.now) if detail.HasField("estimated_start") else "unknown"
        lines = [f"{job.display_id} ({job.name}, {job.user}): pending ({job.reason or 'None'}), {where}, "
                 f"estimated start {start}"]
        lines += [f"  {sentence}" for sentence in detail.explanation] or ["  (no scheduling cycle has looked at it yet)"]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def priority_rows(response: Any) -> list[tuple[str, ...]]:
    """Each factor weighted (what it adds to the priority), like sprio."""
    w = response.weights
    rows: list[tuple[str, ...]] = []
    for detail in response.jobs:
        job, f = detail.job, detail.factors
        if not detail.HasField("factors"):
            rows.append((job.display_id, job.user, job.account, "-", "-", "-", "-", "-", "-", "-", "-", "-"))
            continue
        rows.append((
            job.display_id, job.user, job.account,
            str(detail.priority) if detail.HasField("priority") else "-",
            str(round(w.age * f.age)), str(round(w.fair_share * f.fair_share)), str(round(w.qos * f.qos)),
            str(round(w.job_size * f.job_size)), str(round(w.partition * f.partition)),
            str(round(w.time_limit * f.time_limit)), str(f.admin), str(f.nice),
        ))
    return rows


def details_json(response: Any) -> str:
    jobs = []
    for detail in response.jobs:
        f = detail.factors
        jobs.append({
            "job_id": detail.job.display_id,
            "user": detail.job.user,
            "account": detail.job.account,
            "state": detail.job.state,
            "reason": detail.job.reason,
            "position": detail.position or None,
            "estimated_start": detail.estimated_start if detail.HasField("estimated_start") else None,
            "priority": detail.priority if detail.HasField("priority") else None,
            "factors": {"age": f.age, "fair_share": f.fair_share, "qos": f.qos, "job_size": f.job_size,
                        "partition": f.partition, "time_limit": f.time_limit, "admin": f.admin,
                        "nice": f.nice}
            if detail.HasField("factors") else None,
        })
    w = response.weights
    weights = {"age": w.age, "fair_share": w.fair_share, "qos": w.qos, "job_size": w.job_size,
               "partition": w.partition, "time_limit": w.time_limit}
    return json.dumps({"jobs": jobs, "weights": weights, "cycle_time": response.cycle_time or None}, indent=2)
