"""Job steps as gqueue -s (squeue -s) and gacct --steps show them: JOBID.batch, then JOBID.0, JOBID.1, ...

The batch step stands for the job's batch script (or command): it runs while the job runs, on the job's
first node, and ends with the job. The numbered steps are gsrun's, from the controller's store.
"""

from __future__ import annotations

import json
import time
from typing import Any

from garrison.cli.render import format_duration

STEP_COLUMNS = ("STEPID", "NAME", "USER", "STATE", "START", "TIME", "TASKS", "GPUS", "NODELIST", "EXITCODE")


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch)) if epoch else "-"


def batch_of_job(job: Any) -> dict[str, Any]:
    """The batch step of a job as ListJobs gives it (gqueue)."""
    nodes = list(job.node_list)
    return _batch(job, int(job.gpus), nodes[:1])


def batch_of_record(record: Any) -> dict[str, Any]:
    """The batch step of a job as the accounting records give it (gacct)."""
    last = record.attempts[-1] if record.attempts else None
    nodes = [n.node for n in last.allocation][:1] if last is not None else []
    gpus = sum(len(n.gpus) for n in last.allocation) if last is not None else int(record.requested_gpus)
    return _batch(record, gpus, nodes)


def _batch(job: Any, gpus: int, nodes: list[str]) -> dict[str, Any]:
    return {
        "job_id": int(job.job_id), "step_id": f"{job.job_id}.batch", "name": "batch", "user": job.user,
        "state": job.state, "start_time": job.start_time, "end_time": job.end_time or None, "ntasks": 1,
        "gpus": gpus, "nodes": nodes, "exit_code": job.exit_code if job.HasField("exit_code") else None,
    }


def step_records(batches: list[dict[str, Any]], steps: list[Any], now: float) -> list[dict[str, Any]]:
    """One record per step, each job's batch step first, in job order (a job never started has none)."""
    by_job: dict[int, list[Any]] = {}
    for step in steps:
        by_job.setdefault(int(step.job_id), []).append(step)
    records: list[dict[str, Any]] = []
    for batch in batches:
        job_id = batch.pop("job_id")
        if batch["start_time"]:
            batch["elapsed_s"] = max(0.0, (batch["end_time"] or now) - batch["start_time"])
            records.append(batch)
        records.extend(_step_record(step, now) for step in by_job.pop(job_id, []))
    for rest in by_job.values():
        records.extend(_step_record(step, now) for step in rest)
    return records


def _step_record(step: Any, now: float) -> dict[str, Any]:
    return {
        "step_id": f"{step.job_id}.{step.step_id}", "name": step.name, "user": step.user, "state": step.state,
        "start_time": step.start_time, "end_time": step.end_time or None,
        "elapsed_s": max(0.0, (step.end_time or now) - step.start_time), "ntasks": int(step.ntasks),
        "gpus": int(step.gpus), "nodes": list(step.nodes),
        "exit_code": step.exit_code if step.HasField("exit_code") else None,
    }


def step_rows(records: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    from garrison.model.hostlist import compress_hostlist

    return [(
        r["step_id"], r["name"], r["user"], r["state"], _clock(r["start_time"]), format_duration(r["elapsed_s"]),
        str(r["ntasks"]), str(r["gpus"]), compress_hostlist(r["nodes"]) if r["nodes"] else "-",
        "-" if r["exit_code"] is None else f"{r['exit_code']}:0",
    ) for r in records]


def steps_json(records: list[dict[str, Any]]) -> str:
    return json.dumps({"steps": records}, indent=2)
