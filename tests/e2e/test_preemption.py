"""Preemption end to end with real PyTorch: an urgent job preempts a low-QoS training job, which saves a
checkpoint on SIGUSR1, is requeued under the same id, resumes, and ends with exactly the weights of an
uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ddp_checkpoint.py"


def test_preempted_training_resumes_to_identical_weights(preempting_cluster: Cluster, tmp_path: Path) -> None:
    c = preempting_cluster
    reference = tmp_path / "reference.txt"
    env = dict(os.environ, GARRISON_CHECKPOINT_DIR=str(tmp_path / "ref-ckpt"), STEP_SLEEP_S="0")
    env.pop("GARRISON_CHECKPOINT_MARK", None)
    subprocess.run([sys.executable, str(EXAMPLE), str(reference)], env=env, check=True, timeout=300)

    weights = c.work / "preempted-weights.txt"
    low = c.submit("-q", "low", "-N", "1", "--gpus-per-node", "8", "--launch", "node", "-t", "10:00",
                   "-o", "low-%j.out", "--export", "ALL,STEP_SLEEP_S=0.03,CHECKPOINT_EVERY=50",
                   "--wrap", f"exec {sys.executable} {EXAMPLE} {weights}")
    checkpoint = c.work / ".garrison" / "checkpoints" / low / "ckpt.pt"
    c.wait_state(low, {"RUNNING"})
    wait_until(checkpoint.exists, 120, what="the first periodic checkpoint")

    urgent = c.submit("-q", "urgent", "-N", "1", "--gpus-per-node", "8", "--launch", "node",
                      "-o", "urgent-%j.out", "--wrap", "echo urgent ran on $CUDA_VISIBLE_DEVICES")
    assert c.wait_done(urgent, timeout=120)["state"] == "COMPLETED"
    job = c.wait_done(low, timeout=300)
    log = (c.work / f"low-{low}.out").read_text()
    assert job["state"] == "COMPLETED", log
    assert job["restart_count"] == 1
    detail = c.run("gjob", low).stdout
    assert "Attempt 0: PREEMPTED" in detail and "Attempt 1: COMPLETED" in detail, detail
    assert "checkpointed at step" in log and "resumed at step" in log, log
    assert weights.read_text() == reference.read_text()
