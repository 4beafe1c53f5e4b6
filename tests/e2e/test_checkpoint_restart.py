"""A restarted controller still knows when running jobs last checkpointed: the agent sends the marks with
its registration, so the preemption victim chooser, which prefers the victim that loses the least work,
decides as it would have before the restart."""

from __future__ import annotations

import os
import signal

import pytest
from helpers.polling import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow


def test_checkpoint_marks_survive_a_controller_restart(preempting_cluster: Cluster) -> None:
    c = preempting_cluster
    go, saved = c.work / "go", c.work / "saved"
    # Job A starts first but checkpoints after B has started, so it has less unsaved work than B only if the
    # controller knows about the checkpoint; without it, B (started later) would be the cheaper victim.
    a = c.submit("-q", "low", "-G", "4", "-t", "10:00", "--wrap",
                 f"while [ ! -e {go} ]; do sleep 0.05; done; gcheckpoint && touch {saved}; sleep 300")
    c.wait_state(a, {"RUNNING"})
    b = c.submit("-q", "low", "-G", "4", "-t", "10:00", "--wrap", "sleep 300")
    c.wait_state(b, {"RUNNING"})
    go.touch()
    wait_until(saved.exists, 30, what="job A to mark its checkpoint")

    os.kill(c.pid("controller"), signal.SIGKILL)
    c.up()  # restarts only the controller, at the same address; the agent reconnects and registers again

    urgent = c.submit("-q", "urgent", "-G", "4", "--wrap", "true")
    assert c.wait_done(urgent, timeout=120)["state"] == "COMPLETED"
    assert "Attempt 0: PREEMPTED" in c.run("gjob", a).stdout
    assert c.job(b)["state"] == "RUNNING" and "Attempt 0: RUNNING" in c.run("gjob", b).stdout
    c.run("gcancel", a, b)
