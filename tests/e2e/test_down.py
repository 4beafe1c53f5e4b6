"""garrison down tears the whole local cluster down, jobs included: jobs outlive a stopped agent by design,
so `down` has the agent's own program kill what the stopped agents left running."""

from __future__ import annotations

import os
import subprocess

import pytest
from helpers.polling import wait_until

from .conftest import BIN, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_down_stops_the_daemons_and_kills_running_jobs() -> None:
    cluster = start_cluster(["pcie4"], ["--agents", "1"])
    try:
        marker = cluster.work / "down-pid"
        job_id = cluster.submit("-G", "1", "--wrap", f"echo $$ > {marker}; exec sleep 300")
        cluster.wait_state(job_id, {"RUNNING"})
        pid = int(wait_until(lambda: marker.exists() and marker.read_text().strip(), 30, what="the job to write its pid"))
        daemons = [cluster.pid("controller"), cluster.pid("agent-1")]
        down = subprocess.run([str(BIN / "garrison"), "down", "--state-dir", str(cluster.state_dir)],
                              env=cluster.env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        wait_until(lambda: process_gone(pid), 30, what="the job's process to be killed")
        for daemon in daemons:
            wait_until(lambda daemon=daemon: process_gone(daemon), 30, what=f"daemon {daemon} to exit")  # type: ignore[misc]
    finally:
        stop_cluster(cluster)
