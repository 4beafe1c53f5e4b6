"""A node whose agent cannot write its state directory: the agent's side (nodeagent/health.py: which errors
are the disk's, and the probe that clears the fault) and the controller's (controller/reconcile.py
``node_fault``: the node drained for it, resumed when it is gone, an admin's drain left alone). The whole
path, with a real full disk, is tests/e2e/test_agent_faults.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from test_cluster_state import connect, new_state

from garrison.controller.reconcile import NODE_FAULT_REASON
from garrison.model.domain import NodeState
from garrison.nodeagent.health import StateDirHealth


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'c.db'}"


def test_only_the_state_directorys_file_system_failing_is_a_node_fault(tmp_path: Path) -> None:
    health = StateDirHealth(tmp_path)
    assert not health.record(OSError(errno.EACCES, "denied", str(tmp_path / "x")), "launching job 1")
    assert not health.record(OSError(errno.ENOSPC, "full", "/home/ann/out.log"), "launching job 1")
    assert not health.record(ValueError("not an OSError"), "launching job 1")
    assert health.fault == ""
    assert health.record(OSError(errno.ENOSPC, "No space left on device"), "renewing the node lease")
    assert health.fault == f"cannot write its state directory {tmp_path} (renewing the node lease): No space left on device"
    assert health.record(OSError(errno.EROFS, "ro", str(tmp_path / "jobs" / "1-0" / "launch.json")), "launching job 1")
    assert "Read-only file system" in health.fault


def test_the_probe_clears_the_fault_once_the_directory_takes_a_write(tmp_path: Path) -> None:
    health = StateDirHealth(tmp_path)
    health.probe()  # nothing to clear: no I/O
    assert list(tmp_path.iterdir()) == []
    health.record(OSError(errno.ENOSPC, "full"), "renewing the node lease")
    health.probe()
    assert health.fault == "" and list(tmp_path.iterdir()) == []


def test_a_node_fault_drains_the_node_until_the_agent_no_longer_reports_it(db: str) -> None:
    state = new_state(db)
    connect(state, "n1", "n2")
    assert state.node_fault("n1", "") is None  # healthy and up: nothing changes, nothing is written
    drained = state.node_fault("n1", "cannot write its state directory /var/lib/garrison: No space left on device")
    assert drained is not None and drained.state == NodeState.DRAIN
    assert state.nodes["n1"].reason == NODE_FAULT_REASON + "cannot write its state directory /var/lib/garrison: " \
        "No space left on device"
    assert state.node_fault("n1", "cannot write its state directory /var/lib/garrison: No space left on device") is None
    # Across a controller restart the drain stands (it is stored), and the first healthy heartbeat lifts it.
    again = new_state(db)
    connect(again, "n1", "n2")
    assert again.nodes["n1"].state == NodeState.DRAIN
    resumed = again.node_fault("n1", "")
    assert resumed is not None and resumed.state == NodeState.UP and resumed.reason == ""


def test_an_admins_drain_is_never_lifted_by_a_healthy_agent(db: str) -> None:
    state = new_state(db)
    connect(state, "n1")
    state.set_drain("n1", True, "bad DIMM")
    assert state.node_fault("n1", "") is None
    assert state.node_fault("n1", "cannot write its state directory /x: No space left on device") is None
    assert (state.nodes["n1"].state, state.nodes["n1"].reason) == (NodeState.DRAIN, "bad DIMM")
