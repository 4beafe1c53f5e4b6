"""The scheduling policy end to end, through the CLI on a real local cluster (a DGX A100 and a DGX-1V, 16 GPUs):
fair share between two teams that flood the queue, a quota that caps a team, and a backfilled short job
that does not delay the job with the reservation.

The cluster runs the shipped `garrison` policy with compressed time: a one-minute fair-share half-life and
one-second reservation resolution, set in the controller's configuration before it serves.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.polling import wait_until

from .conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

SCHEDULER = """
[controller.scheduler]
fairshare_half_life = 60
backfill_resolution = 1
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx1v"])
    try:
        # Stop the controller, add the scheduler settings, and let `garrison up` start it again (the agents
        # reconnect by themselves).
        pid = c.pid("controller")
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not _alive(pid), 30, what="the controller to stop")
        config = c.state_dir / "garrison.toml"
        config.write_text(config.read_text() + SCHEDULER)
        c.up()
        wait_until(
            lambda: all(
                line.split()[1] in ("IDLE", "MIXED", "ALLOCATED") for line in c.run("ginfo").stdout.splitlines()[1:]
            ),
            30, what="both nodes back",
        )
        yield c
    finally:
        stop_cluster(c)


def queue_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    return json.loads(cluster.run("gqueue", "--json", *args).stdout)


def array(cluster: Cluster, *args: str) -> list[dict[str, Any]]:
    first = cluster.submit(*args)
    return [j for j in cluster.jobs() if j["array_job_id"] == int(first)]


def done(cluster: Cluster, array_ids: list[int], timeout: float) -> list[dict[str, Any]]:
    def finished() -> list[dict[str, Any]] | None:
        jobs = [j for j in cluster.jobs() if j["array_job_id"] in array_ids]
        return jobs if jobs and all(j["state"] == "COMPLETED" for j in jobs) else None

    return wait_until(finished, timeout, what=f"arrays {array_ids} to complete")


def gpu_seconds(jobs: list[dict[str, Any]], start: float, end: float) -> float:
    return sum(j["gpus"] * max(0.0, min(j["end_time"], end) - max(j["start_time"], start)) for j in jobs)


def test_a_quota_caps_a_team(cluster: Cluster) -> None:
    cluster.run("gadmin", "account", "add", "capped")
    cluster.run("gadmin", "quota", "set", "-A", "capped", "--max-gpus", "2")
    assert "gpus=2" in cluster.run("gadmin", "quota", "show", "-A", "capped").stdout
    first = int(cluster.submit("--array", "1-6", "-A", "capped", "-G", "1", "-t", "0:30", "--wrap", "sleep 2"))
    waiting = wait_until(
        lambda: [
            j for j in cluster.jobs() if j["array_job_id"] == first and j["state"] == "PENDING"
            and j["reason"] == "QuotaGPUs"
        ],
        30, what="a task held back by the quota",
    )
    assert waiting
    jobs = done(cluster, [first], timeout=60)
    # Never more than 2 GPUs at once, though 16 were free.
    events = sorted([(j["start_time"], 1) for j in jobs] + [(j["end_time"], -1) for j in jobs],
                    key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2


def test_two_teams_with_equal_shares_each_get_about_half(cluster: Cluster) -> None:
    for team in ("teamA", "teamB"):
        cluster.run("gadmin", "account", "add", team, "--shares", "1")
    # Both teams' queues are full before any GPU is free: drain, flood, resume.
    for node in ("node1", "node2"):
        cluster.run("gadmin", "node", "drain", node, "--reason", "fair share test")
    a = int(cluster.submit("--array", "1-32", "-A", "teamA", "-G", "1", "-t", "0:30", "--wrap", "sleep 4"))
    b = int(cluster.submit("--array", "1-32", "-A", "teamB", "-G", "1", "-t", "0:30", "--wrap", "sleep 4"))
    for node in ("node1", "node2"):
        cluster.run("gadmin", "node", "resume", node)
    jobs = done(cluster, [a, b], timeout=120)
    team_a = [j for j in jobs if j["array_job_id"] == a]
    team_b = [j for j in jobs if j["array_job_id"] == b]
    # While both teams still had jobs waiting, each got about half of the GPU time.
    begin = min(j["start_time"] for j in jobs)
    end = min(max(j["start_time"] for j in team_a), max(j["start_time"] for j in team_b))
    share_a = gpu_seconds(team_a, begin, end) / (gpu_seconds(team_a, begin, end) + gpu_seconds(team_b, begin, end))
    assert 0.35 <= share_a <= 0.65, (share_a, begin, end)
    # Arrival order alone would have run every teamA task before any teamB one.
    assert min(j["start_time"] for j in team_b) < max(j["start_time"] for j in team_a)
    usage = cluster.run("gadmin", "usage", "-A", "teamA", "-A", "teamB").stdout
    assert "teamA" in usage and "teamB" in usage


def test_a_backfilled_short_job_does_not_delay_the_top_job(cluster: Cluster) -> None:
    # The long job holds one whole node until its time limit (it sleeps longer and is stopped at 0:20).
    long = cluster.submit("-N", "1", "--gpus-per-node", "8", "-t", "0:20", "--wrap", "sleep 120")
    long_job = cluster.wait_state(long, {"RUNNING"})
    top = cluster.submit("-N", "2", "--gpus-per-node", "8", "-t", "0:30", "--wrap", "sleep 1")
    estimate = wait_until(
        lambda: next(
            (j["estimated_start"] for j in queue_json(cluster, "--start")["jobs"]
             if j["job_id"] == top and j["estimated_start"]), None),
        30, what="the top job's reservation",
    )
    assert abs(estimate - (long_job["start_time"] + 20)) <= 2.0
    short = cluster.submit("-G", "1", "-t", "0:05", "--wrap", "sleep 1")
    late = cluster.submit("-G", "1", "-t", "5:00", "--wrap", "sleep 1")
    short_job = cluster.wait_done(short, timeout=30)
    assert short_job["state"] == "COMPLETED"
    # The long one would overlap the reservation: it waits, with a reservation of its own after the top job's.
    assert cluster.job(top)["state"] == "PENDING"
    late_estimate = wait_until(
        lambda: next(
            (j["estimated_start"] for j in queue_json(cluster, "--start")["jobs"]
             if j["job_id"] == late and j["estimated_start"]), None),
        30, what="the late job's reservation",
    )
    assert late_estimate >= estimate
    top_job = cluster.wait_state(top, {"RUNNING", "COMPLETING", "COMPLETED"}, timeout=60)
    late_job = cluster.wait_done(late, timeout=60)
    assert cluster.wait_done(long)["state"] == "TIMEOUT"
    assert short_job["start_time"] < top_job["start_time"] and short_job["end_time"] <= top_job["start_time"]
    assert top_job["start_time"] <= estimate + 3.0  # not delayed by the backfilled job
    assert late_job["start_time"] >= top_job["start_time"]


def test_job_control_and_priority_views(cluster: Cluster, tmp_path: Path) -> None:
    cluster.run("gadmin", "node", "drain", "node1", "--reason", "maintenance")
    cluster.run("gadmin", "node", "drain", "node2", "--reason", "maintenance")
    try:
        info = cluster.run("ginfo").stdout
        assert info.count("DRAIN") == 2 and "maintenance" in info
        header, *partitions = cluster.run("ginfo", "-s").stdout.splitlines()
        assert header.split() == ["PARTITION", "TIMELIMIT", "NODES(A/I/O/T)", "GPUS(A/I/O/T)", "NODELIST"]
        default = next(line.split() for line in partitions if line.split()[0].endswith("*"))
        assert default[2] == "0/0/2/2" and default[3].startswith("0/0/") and default[4] == "node[1-2]"  # drained
        job = cluster.submit("-G", "1", "-q", "high", "--wrap", "true")
        cluster.run("gcontrol", "hold", job)
        wait_until(lambda: cluster.job(job)["reason"] == "Held", 30, what="the hold")
        cluster.run("gcontrol", "release", job)
        cluster.run("gcontrol", "update", job, "--time-limit", "10:00", "--priority", "7")
        details = wait_until(
            lambda: next(
                (j for j in queue_json(cluster, "--priority")["jobs"] if j["job_id"] == job and j["priority"]), None),
            30, what="priority factors",
        )
        assert details["factors"]["admin"] == 7 and details["factors"]["qos"] > 0
        table = cluster.run("gqueue", "--priority", "-j", job).stdout
        assert table.split("\n")[0].split()[:4] == ["JOBID", "USER", "ACCOUNT", "PRIORITY"]
        assert cluster.job(job)["time_limit_s"] == 600
        bad = cluster.run("gcontrol", "update", job, "--qos", "nonesuch", check=False)
        assert bad.returncode == 2 and "unknown QoS 'nonesuch'" in bad.stderr
    finally:
        cluster.run("gadmin", "node", "resume", "node1")
        cluster.run("gadmin", "node", "resume", "node2")
    assert cluster.wait_done(job)["state"] == "COMPLETED"


def _node_columns(cluster: Cluster) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in cluster.run("ginfo").stdout.splitlines()[1:]}


def test_ginfo_shows_the_cpus_and_memory_a_job_holds(cluster: Cluster, tmp_path: Path) -> None:
    header = cluster.run("ginfo").stdout.splitlines()[0].split()
    assert header[:5] == ["NODE", "STATE", "GPUS(A/T)", "CPUS(A/T)", "MEM(A/T)"]
    release = tmp_path / "release"
    job = cluster.submit("-G", "1", "--cpus-per-gpu", "1", "--mem", "300", "-t", "1:00",
                         "--wrap", f"while [ ! -e {release} ]; do sleep 0.1; done")
    (node,) = cluster.wait_state(job, {"RUNNING"})["nodes"]
    held = wait_until(
        lambda: (
            (cols := _node_columns(cluster)[node])[3].startswith("1/") and cols),
        30, what="ginfo to show the job's CPU",
    )
    assert held[4].startswith("<1/") and held[4].endswith("G")
    detail = cluster.run("gjob", job).stdout
    assert "CpusPerGpu=1 MemPerNode=300M" in detail
    assert re.search(rf"Attempt 0: RUNNING .*{node}:gpus=\d+:cpus=\d+:mem=300M", detail), detail
    release.touch()
    assert cluster.wait_done(job)["state"] == "COMPLETED"
    freed = wait_until(
        lambda: (
            (cols := _node_columns(cluster)[node])[3].startswith("0/") and cols),
        30, what="ginfo to show the CPU free",
    )
    assert freed[4].startswith("0/")
