"""gsub --test-only on a real cluster: the controller checks the job, runs the scheduling core on the cluster
as it is with the job added, and says when and where it would start; nothing is submitted."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from .conftest import Cluster, start_cluster, stop_cluster

ESTIMATE = re.compile(r"^gsub: job would start at (\S+) on (\S+) in partition main \(not submitted\)$")


@pytest.fixture
def one_node() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100"], ["--agents", "1"])
    try:
        yield c
    finally:
        stop_cluster(c)


def estimate(cluster: Cluster, *args: str) -> tuple[float, str]:
    proc = cluster.run("gsub", "--test-only", *args, "--wrap", "true")
    assert proc.stdout == "", proc.stdout
    match = ESTIMATE.match(proc.stderr.strip())
    assert match, proc.stderr
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")), match.group(2)


def test_test_only_estimates_without_submitting(one_node: Cluster) -> None:
    cluster = one_node
    before = time.time()
    start, nodes = estimate(cluster, "-G", "8", "-t", "10")
    assert nodes == "node1" and before - 1 <= start <= time.time() + 1  # an idle node: now
    assert cluster.jobs() == []  # nothing was submitted

    # The node busy for up to 20 minutes: a job that needs it waits for that time limit to end.
    busy = cluster.submit("-G", "8", "-t", "20", "--wrap", "sleep 300")
    started = cluster.wait_state(busy, {"RUNNING"})["start_time"]
    start, nodes = estimate(cluster, "-G", "4", "-t", "10")
    assert nodes == "node1" and abs(start - (started + 1200)) <= 61  # reservations are rounded to the minute
    waiting = cluster.run("gsub", "--test-only", "-G", "1", "-d", f"afterok:{busy}", "--wrap", "true")
    assert waiting.stderr.strip() == ("gsub: job would wait (Dependency) in partition main; no start can be "
                                      "planned for it now (not submitted)")
    assert [j["job_id"] for j in cluster.jobs()] == [busy]

    # A job that could never run is refused as its submission would be.
    refused = cluster.run("gsub", "--test-only", "-G", "16", "-N", "1", "--wrap", "true", check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    cluster.run("gcancel", busy)
