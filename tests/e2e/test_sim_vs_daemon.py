"""gsim and the daemon agree: a short trace replayed through gsim and through a real controller with a
fake-NVML agent (compressed time: jobs of a fraction of a second to two seconds) starts its jobs in the same
order.

Both run the daemon's default policy (gsim's ``garrison``: multifactor priority, fair share, backfill) from
the very configuration file the local cluster was started with, which compresses the time-limit factor's
bounds as the trace compresses time (tests/data/compressed_time.toml: 3 s and 60 s for 1 hour and 7 days). The first job holds the node until every
other job has been submitted (it waits for a file the test creates), so the scheduler sees the same queue
in both. The cluster is one 8-GPU node, so a job's GPUs come free at one moment in both (the daemon frees a
multi-node gang node by node, as each node reports). Durations are chosen so that the jobs' ends are at
least 0.5 s apart in the replay, far above the daemon's launch and reporting latency, and time limits are a
second or more above durations, so no decision rests on a race. The expected order differs under FIFO and
FIFO+EASY (see ORDERS), so agreement is not an accident of a trivial queue.
"""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import BIN, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

# (GPUs, duration s, time limit s), in submission order; the first is the blocker (its duration in gsim
# stands for "until everything is submitted").
TRACE = [
    (8, 1.0, 60),
    (4, 0.5, 5),
    (8, 0.8, 3),
    (2, 2.0, 3),
    (2, 0.8, 10),
    (1, 1.2, 3),
    (4, 1.8, 6),
    (2, 2.2, 6),
]
# What gsim makes of TRACE under each policy (job numbers in start order), for the record: FIFO+EASY
# backfills around the 8-GPU job 3; the daemon's default puts the shortest time limits first (job 3, then
# jobs 4 and 6 with job 2 beside them), so job 5, with the longest limit, starts last.
ORDERS = {
    "fifo": [1, 2, 3, 4, 5, 6, 7, 8],
    "fifo-easy": [1, 2, 4, 5, 6, 8, 7, 3],
    "garrison": [1, 3, 2, 4, 6, 7, 8, 5],
}
SAME_CYCLE_S = 0.2
COMPRESSED_TIME = Path(__file__).resolve().parents[1] / "data" / "compressed_time.toml"


@pytest.fixture(scope="module")
def one_node() -> Iterator[Cluster]:
    cluster = start_cluster(["dgx-a100"], ["--agents", "1", "--extra-config", str(COMPRESSED_TIME)])
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def sim_start_order(cluster: Cluster, tmp_path: Path, policy: str) -> list[int]:
    trace = tmp_path / "trace.csv"
    with trace.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "submit", "duration", "gpus", "account", "limit"])
        for i, (gpus, duration, limit) in enumerate(TRACE):
            writer.writerow([i + 1, f"{i * 0.01:.2f}", duration, gpus, "default", limit])
    out = tmp_path / f"out-{policy}"
    proc = subprocess.run(
        [str(BIN / "gsim"), str(trace), "--cluster", "1x8:dgx-a100", "--policy", policy,
         "--config", str(cluster.state_dir / "garrison.toml"), "--out", str(out),
         "--columns", "job_id=id,arrival=submit,duration=duration,gpus=gpus,account=account,time_limit=limit"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with (out / "jobs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert all(row["end_s"] for row in rows), "gsim left jobs unfinished"
    rows.sort(key=lambda r: (float(r["start_s"]), int(r["job_id"])))
    return [int(r["trace_job_id"]) for r in rows]


def daemon_start_order(cluster: Cluster) -> tuple[list[int], list[tuple[int, float, float]]]:
    """Job numbers in start order, and (job, start, end) relative to the first start for messages."""
    go = cluster.work / "go"
    ids: list[str] = []
    for i, (gpus, duration, limit) in enumerate(TRACE):
        command = f"while [ ! -e {go} ]; do sleep 0.05; done" if i == 0 else f"sleep {duration}"
        minutes, seconds = divmod(limit, 60)
        ids.append(cluster.submit("-J", f"trace-{i + 1}", "-G", str(gpus), "-t", f"{minutes}:{seconds:02d}",
                                  "--wrap", command))
    go.touch()
    jobs = [cluster.wait_done(job_id, timeout=120) for job_id in ids]
    assert [j["state"] for j in jobs] == ["COMPLETED"] * len(TRACE), [(j["job_id"], j["reason"]) for j in jobs]
    jobs.sort(key=lambda j: j["start_time"])
    # Jobs that one cycle starts together (as gsim does, at one instant) report start times a few
    # milliseconds apart, as their launches take; decisions are 0.5 s or more apart, so starts closer than
    # SAME_CYCLE_S are one moment, ordered by job number as gsim orders a moment's starts.
    moment, moment_start = 0, jobs[0]["start_time"]
    order_key: dict[str, tuple[int, int]] = {}
    for job in jobs:
        if job["start_time"] - moment_start > SAME_CYCLE_S:
            moment, moment_start = moment + 1, job["start_time"]
        order_key[job["job_id"]] = (moment, int(job["job_id"]))
    jobs.sort(key=lambda j: order_key[j["job_id"]])
    origin = jobs[0]["start_time"]
    timeline = [(ids.index(j["job_id"]) + 1, round(j["start_time"] - origin, 2), round(j["end_time"] - origin, 2))
                for j in jobs]
    return [ids.index(j["job_id"]) + 1 for j in jobs], timeline


def test_gsim_and_the_daemon_start_jobs_in_the_same_order(one_node: Cluster, tmp_path: Path) -> None:
    for policy, expected in ORDERS.items():
        assert sim_start_order(one_node, tmp_path, policy) == expected, policy
    order, timeline = daemon_start_order(one_node)
    cut_short = [(n, round(end - start, 2)) for n, start, end in timeline if n > 1 and end - start < TRACE[n - 1][1]]
    assert not cut_short, f"jobs that ended before their sleep did: {cut_short}"
    assert order == ORDERS["garrison"], f"daemon (job, start, end): {timeline}"
