"""A real torchrun launcher (CPU, gloo, ``--launch node``, 2 nodes, 2 workers each) preempted by an urgent job.

torchrun dies of SIGUSR1 and starts its workers in sessions of their own, so a warning sent to its process
group alone would kill it, miss the workers and leave them running with parent 1. Here the supervisor sends
the warning to the workers and spares torchrun: the workers checkpoint, torchrun ends cleanly with them, the
job is requeued, resumes from the checkpoint and completes, and no process of the first attempt is left.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import PREEMPTION_CONFIG, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

TRAIN = Path(__file__).resolve().parents[1] / "data" / "torchrun_checkpoint.py"


@pytest.fixture
def two_nodes() -> Iterator[Cluster]:
    c = start_cluster(["pcie4", "pcie4"], ["--extra-config", str(PREEMPTION_CONFIG)])
    try:
        yield c
    finally:
        stop_cluster(c)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def submit_torchrun_job(c: Cluster, records: Path, *options: str, export: str = "") -> str:
    """A --launch node job of 2 nodes, each running torchrun with 2 workers; it runs until its first workers
    have done three steps. Returns its id."""
    torchrun = Path(sys.executable).parent / "torchrun"
    records.mkdir()
    job = c.submit(
        *options, "-N", "2", "--gpus-per-node", "4", "--launch", "node", "-t", "10:00", "-o", "low-%j-%n.out",
        "--export", f"ALL,OMP_NUM_THREADS=1{export}", "--wrap",
        f"exec {torchrun} --nnodes 2 --nproc_per_node 2 --node_rank $GARRISON_NODE_RANK "
        f"--master_addr $MASTER_ADDR --master_port $MASTER_PORT {TRAIN} {records}",
    )
    c.wait_state(job, {"RUNNING"})
    wait_until(lambda: (records / "progress-0").exists() and int((records / "progress-0").read_text() or 0) >= 3,
               240, what="the first attempt's workers to run three steps")
    return job


def first_attempt_processes(records: Path) -> tuple[list[int], list[int]]:
    """(the first attempt's workers, its torchrun agents), as the workers recorded them."""
    first = [tuple(int(p) for p in (records / f"pids-0-{rank}").read_text().split()) for rank in range(4)]
    workers = [pid for pid, _ in first]
    agents = sorted({parent for _, parent in first})
    assert len(agents) == 2  # one torchrun agent per node, each the parent of its two workers
    return workers, agents


def test_preempted_torchrun_job_checkpoints_is_requeued_and_leaves_nothing(two_nodes: Cluster) -> None:
    c = two_nodes
    records = c.work / "records"
    low = submit_torchrun_job(c, records, "-q", "low")
    workers, agents = first_attempt_processes(records)

    urgent = c.submit("-q", "urgent", "-N", "2", "--gpus-per-node", "4", "--launch", "node", "--wrap", "true")
    assert c.wait_done(urgent, timeout=240)["state"] == "COMPLETED"
    job = c.wait_done(low, timeout=300)
    logs = "".join((c.work / f"low-{low}-{node}.out").read_text() for node in (0, 1))
    assert job["state"] == "COMPLETED", logs
    assert job["restart_count"] == 1
    detail = c.run("gjob", low).stdout
    assert "Attempt 0: PREEMPTED" in detail and "Attempt 1: COMPLETED" in detail, detail
    assert "checkpointed at step" in logs and "resumed at step" in logs and "finished at step" in logs, logs
    # torchrun never saw SIGUSR1 (it would have died of it, exit 138, and said so).
    assert "SIGUSR1" not in logs, logs
    # Nothing of the first attempt is left on either node: not its workers, not its torchrun agents.
    left = [pid for pid in workers + agents if not _gone(pid)]
    assert left == [], left


def test_a_warned_torchrun_job_checkpoints_and_requeues_itself(two_nodes: Cluster) -> None:
    # gcancel -s USR1, as a user asks a job to checkpoint now; the job then requeues itself as Lightning's
    # auto_requeue does (gcontrol requeue for scontrol requeue). Before, torchrun died of the signal and the job
    # ended FAILED with its workers left running.
    c = two_nodes
    records = c.work / "records"
    job_id = submit_torchrun_job(c, records, export=",REQUEUE_ON_WARNING=1")
    workers, agents = first_attempt_processes(records)
    c.run("gcancel", "-s", "USR1", job_id)
    job = c.wait_done(job_id, timeout=300)
    logs = "".join((c.work / f"low-{job_id}-{node}.out").read_text() for node in (0, 1))
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1, logs
    assert "checkpointed at step" in logs and "requeueing itself" in logs and "resumed at step" in logs, logs
    assert "SIGUSR1" not in logs, logs
    left = [pid for pid in workers + agents if not _gone(pid)]
    assert left == [], left


def test_preempted_torchrun_step_checkpoints_is_requeued_and_leaves_nothing(two_nodes: Cluster) -> None:
    """The same through a job step, as Slurm users write it: the batch script runs `gsrun --ntasks-per-node 1
    torchrun ...` across both nodes. The preemption's warning reaches the step's workers (never the batch
    shell without B:, never torchrun), they checkpoint, the step and then the script end, the job is
    requeued, and its second attempt resumes from the checkpoint."""
    c = two_nodes
    records = c.work / "records"
    records.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    script = c.work / "step-torchrun.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH -N 2 --gpus-per-node=4 -t 10:00 -q low -o low-%j.out
gsrun --ntasks-per-node 1 --export ALL,OMP_NUM_THREADS=1 bash -c 'exec {torchrun} --nnodes 2 \\
  --node_rank $SLURM_NODEID --nproc_per_node 2 --master_addr $MASTER_ADDR --master_port $MASTER_PORT \\
  {TRAIN} {records}'
echo "step exit $?"
""")
    low = c.submit(str(script))
    c.wait_state(low, {"RUNNING"})
    wait_until(lambda: (records / "progress-0").exists() and int((records / "progress-0").read_text() or 0) >= 3,
               240, what="the first attempt's workers to run three steps")
    workers, agents = first_attempt_processes(records)

    urgent = c.submit("-q", "urgent", "-N", "2", "--gpus-per-node", "4", "--launch", "node", "--wrap", "true")
    assert c.wait_done(urgent, timeout=240)["state"] == "COMPLETED"
    job = c.wait_done(low, timeout=300)
    logs = (c.work / f"low-{low}.out").read_text()
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1, logs
    detail = c.run("gjob", low).stdout
    assert "Attempt 0: PREEMPTED" in detail and "Attempt 1: COMPLETED" in detail, detail
    assert "checkpointed at step" in logs and "resumed at step" in logs and "finished at step" in logs, logs
    assert "SIGUSR1" not in logs and "step exit 0" in logs, logs
    left = [pid for pid in workers + agents if not _gone(pid)]
    assert left == [], left
