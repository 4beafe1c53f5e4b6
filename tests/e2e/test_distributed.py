"""Distributed launch with real PyTorch (CPU, gloo) across two real agents: torchrun's environment,
gang restarts, and node failure. torch is a test dependency only."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

ALL_REDUCE = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
with open(sys.argv[1], "a") as out:
    out.write(f"{rank} {world} {os.environ['LOCAL_RANK']} {os.environ['GROUP_RANK']} {value.item():g}\\n")
dist.destroy_process_group()
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_gang_all_reduce_with_torchrun_environment(cluster: Cluster) -> None:
    script = write(cluster.work / "allreduce.py", ALL_REDUCE)
    result = cluster.work / "allreduce.txt"
    job_id = cluster.submit("--launch", "rank", "-N", "2", "--gpus-per-node", "2", "-t", "5:00", "-o", "ar-%j-%t.out",
                            "--wrap", f"exec {sys.executable} {script} {result}")
    job = cluster.wait_done(job_id, timeout=180)
    logs = "".join(p.read_text() for p in cluster.work.glob(f"ar-{job_id}-*.out"))
    assert job["state"] == "COMPLETED", logs
    lines = sorted(result.read_text().splitlines())
    # 4 ranks, world 4, local ranks 0/1 on each node, node ranks 0/1, and 1+2+3+4 everywhere.
    assert lines == ["0 4 0 0 10", "1 4 1 0 10", "2 4 0 1 10", "3 4 1 1 10"]


def test_torchrun_in_per_node_mode(cluster: Cluster) -> None:
    script = write(cluster.work / "allreduce_tr.py", ALL_REDUCE)
    result = cluster.work / "torchrun.txt"
    launcher = (
        f"exec {sys.executable} -m torch.distributed.run --nnodes $GARRISON_NNODES --node-rank $GARRISON_NODE_RANK "
        f"--nproc-per-node $GARRISON_GPUS_ON_NODE --master-addr $MASTER_ADDR --master-port $MASTER_PORT "
        f"{script} {result}"
    )
    job_id = cluster.submit("--launch", "node", "-N", "2", "--gpus-per-node", "2", "-t", "5:00",
                            "-o", "tr-%j-%n.out", "--wrap", launcher)
    job = cluster.wait_done(job_id, timeout=180)
    logs = "".join(p.read_text()[-3000:] for p in cluster.work.glob(f"tr-{job_id}-*.out"))
    assert job["state"] == "COMPLETED", logs
    assert sorted(line.split()[-1] for line in result.read_text().splitlines()) == ["10"] * 4


def test_killing_one_rank_restarts_the_gang(cluster: Cluster) -> None:
    pids = cluster.work / "pids"
    pids.mkdir(exist_ok=True)
    pids.chmod(0o777)
    # Attempt 0 waits to be killed; attempt 1 (TORCHELASTIC_RESTART_COUNT=1) finishes at once.
    body = (
        f'echo $$ > {pids}/$GARRISON_JOB_ID.$TORCHELASTIC_RESTART_COUNT.$RANK; '
        'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 300; fi; echo "restart $TORCHELASTIC_RESTART_COUNT rank $RANK"'
    )
    job_id = cluster.submit("--launch", "rank", "-N", "2", "--gpus-per-node", "1", "--max-restarts", "1", "-o", "restart-%j.out",
                            "--wrap", body)
    victim = pids / f"{job_id}.0.1"
    pid = int(wait_until(
        lambda: victim.exists() and victim.read_text().strip(),
        30, what="rank 1 of attempt 0",
    ))
    os.kill(pid, signal.SIGKILL)
    job = cluster.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1
    detail = cluster.run("gjob", job_id).stdout
    assert "Attempt 0: FAILED" in detail and "rank 1 was killed by signal 9 (Killed)" in detail and "Attempt 1: COMPLETED" in detail
    assert sorted((cluster.work / f"restart-{job_id}.out").read_text().splitlines()) == [
        "restart 1 rank 0", "restart 1 rank 1"]
    # The other rank of attempt 0 was stopped with the gang, not left running.
    other = int((pids / f"{job_id}.0.0").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(other, 0)


def test_failed_rank_reports_its_error_file(cluster: Cluster) -> None:
    script = write(cluster.work / "fails.py", (
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    raise ValueError('the learning rate is on fire')\n"
        "main()\n"
    ))
    job_id = cluster.submit("--launch", "rank", "-G", "1", "-o", "fails-%j.out", "--wrap", f"exec {sys.executable} {script}")
    job = cluster.wait_done(job_id, timeout=120)
    assert job["state"] == "FAILED" and job["exit_code"] == 1
    assert "the learning rate is on fire" in cluster.run("gjob", job_id).stdout


@pytest.fixture
def twin_cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx-a100"])
    try:
        yield c
    finally:
        stop_cluster(c)


def test_killing_an_agent_requeues_its_job_onto_the_other(twin_cluster: Cluster) -> None:
    c = twin_cluster
    marker = c.work / "first-attempt-pid"
    body = (f'if [ "$GARRISON_ATTEMPT" = 0 ]; then echo $$ > {marker}; exec sleep 300; fi; '
            'echo "ran on $GARRISON_NODENAME attempt $GARRISON_ATTEMPT"')
    job_id = c.submit("-N", "1", "--gpus-per-node", "8", "--launch", "node", "-o", "moved-%j.out", "--wrap", body)
    job = c.wait_state(job_id, {"RUNNING"})
    first_node = job["nodes"][0]
    stale_pid = int(wait_until(
        lambda: marker.exists() and marker.read_text().strip(),
        30, what="the first attempt",
    ))
    agent = "agent-" + first_node.removeprefix("node")
    os.kill(c.pid(agent), signal.SIGKILL)
    # The node lease (10 s in `garrison up`) runs out, the supervisor stops its ranks (SIGTERM, kill wait 5 s),
    # and only then is the job requeued and run elsewhere.
    job = c.wait_done(job_id, timeout=90)
    other = "node2" if first_node == "node1" else "node1"
    assert job["state"] == "COMPLETED" and job["nodes"] == [other]
    assert (c.work / f"moved-{job_id}.out").read_text() == f"ran on {other} attempt 1\n"
    assert "Attempt 0: NODE_FAIL" in c.run("gjob", job_id).stdout

    def stale_gone() -> bool:
        try:
            os.kill(stale_pid, 0)
        except ProcessLookupError:
            return True
        return False

    # Fencing: the old ranks were stopped by their own supervisor, with no agent, before the requeue.
    assert stale_gone(), "the first attempt still runs alongside its requeued copy"
    c.up()
    nodes = {line.split()[0]: line.split()[1] for line in c.run("ginfo").stdout.splitlines()[1:]}
    assert nodes[first_node] in ("IDLE", "MIXED")


def test_signal_before_time_limit_arrives_on_time(cluster: Cluster) -> None:
    log = cluster.work / "warned.log"
    job_id = cluster.submit(
        "--launch", "rank", "-G", "1", "-t", "0:06", "--signal", "USR1@3", "-o", "/dev/null", "--wrap",
        f"trap 'echo usr1 $(date +%s.%N) >> {log}' USR1; echo start $(date +%s.%N) >> {log}; "
        "while :; do sleep 0.05; done",
    )
    job = cluster.wait_done(job_id, timeout=30)
    assert job["state"] == "TIMEOUT"
    stamps = {line.split()[0]: float(line.split()[1]) for line in log.read_text().splitlines()}
    # USR1 three seconds before the 6 s limit, to within a second (ranks start a few ms after the attempt).
    assert 2.0 <= stamps["usr1"] - stamps["start"] <= 4.0, stamps


def test_gang_whose_launch_fails_on_one_node_is_requeued(cluster: Cluster) -> None:
    """Rank 0's node cannot host the rendezvous (its MASTER_PORT is taken): the attempt is torn down on
    every node and the job starts again as a new attempt, with another port."""
    import socket

    from garrison.controller.rendezvous import RendezvousPorts, port_secret

    # Ports are unpredictable without the controller's key (issue 20); root, here, may read it.
    key = (cluster.state_dir / "controller" / "credential.key").read_bytes()
    ports = RendezvousPorts(port_secret(key))

    def master_port(job_id: int, attempt: int) -> int:
        return ports.port_for(job_id, attempt)

    probe = cluster.submit("-G", "1", "-o", "/dev/null", "--wrap", "true")
    cluster.wait_done(probe)
    next_id = int(probe) + 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("0.0.0.0", master_port(next_id, 0)))
        blocker.listen()
        job_id = cluster.submit("--launch", "rank", "-N", "2", "--gpus-per-node", "1", "-o", "relaunch-%j.out", "--wrap",
                                'echo "attempt $GARRISON_ATTEMPT rank $RANK port $MASTER_PORT"')
        assert int(job_id) == next_id, "another job was submitted in between; the port guess is off"
        job = cluster.wait_done(job_id)
    assert job["state"] == "COMPLETED" and job["restart_count"] == 1
    lines = sorted((cluster.work / f"relaunch-{job_id}.out").read_text().splitlines())
    # All or nothing: rank 1's node held its ranks at the start barrier and was stopped before they ran.
    assert [f"attempt 1 rank {r} port {master_port(next_id, 1)}" for r in (0, 1)] == lines
    assert not any(line.startswith("attempt 0") for line in lines)
    detail = cluster.run("gjob", job_id).stdout
    assert "Attempt 0: FAILED" in detail and "is in use" in detail
