"""A step's output reaches gsrun completely and exactly once whatever breaks between agent and controller.

The agent queues output on its link, and a link that breaks (its TCP connection reset, the agent killed)
loses what was queued or in flight. The controller acknowledges output by offset and the agent sends again
from the acknowledged offset on its next link; the controller drops what it already has
(docs/steps.md, "Exactly once").

Each test stops the controller (SIGSTOP) while the task prints, so that the agent's reads pile up in its
outbox and in the connection's buffers, unacknowledged; then breaks the link; then lets the controller go
on. The task numbers its lines, so a lost line or a repeated one shows.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from helpers.polling import wait_until

from .conftest import BIN, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

FIRST = 1000  # lines printed before the fault, read by the test: the step's stream is up
TOTAL = 100_000  # 1.1 MB: what the agent reads while the controller is stopped is past its acknowledgements

PRINTER = f"""
import os, sys, time
go, printed, end = sys.argv[1:4]
out = sys.stdout
def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)
for i in range(1, {FIRST} + 1):
    out.write(f"line {{i}}\\n")
out.flush()
wait_for(go)
for i in range({FIRST} + 1, {TOTAL} + 1):
    out.write(f"line {{i}}\\n")
out.flush()
open(printed, "w").close()
wait_for(end)
print("last")
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100"], ["--agents", "1"])
    try:
        yield c
    finally:
        stop_cluster(c)


class Reader:
    """gsrun's stdout, read as it comes (gsrun must never be slow to read: the controller would drop)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.stream = process.stdout
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.stream:
            self.lines.append(line)


def controller_port(cluster: Cluster) -> str:
    return cluster.env["GARRISON_CONTROLLER"].rpartition(":")[2]


def reset_agent_links(cluster: Cluster) -> None:
    """Destroy the TCP connections between the agents and the controller (both ends: what their buffers
    hold is gone), as a network fault would; the agent reconnects on its own."""
    port = controller_port(cluster)
    killed = subprocess.run(["ss", "-K", "-t", "-n", f"( dport = :{port} or sport = :{port} )"],
                            capture_output=True, text=True, timeout=30)
    if killed.returncode != 0 or "ESTAB" not in killed.stdout:
        pytest.skip(f"cannot reset TCP connections here (ss -K): {killed.stderr.strip() or killed.stdout.strip()}")


def kill_agent(cluster: Cluster) -> None:
    os.kill(cluster.pid("agent-1"), signal.SIGKILL)


@dataclass
class PrintingStep:
    """A running job and a gsrun step in it running PRINTER, with the files that pace it."""

    job_id: str
    process: subprocess.Popen[str]
    reader: Reader
    go: str  # created by the test: the task prints the rest of its lines
    printed: str  # created by the task once it has printed them
    end: str  # created by the test: the task prints its last line and exits


@contextmanager
def printing_step(cluster: Cluster, label: str, env: dict[str, str] | None = None) -> Iterator[PrintingStep]:
    """A one-GPU job and a gsrun step in it that has printed its first FIRST lines; on the way out, the step
    is awaited (after the test created ``end``) or killed, and the job cancelled."""
    job_id = cluster.submit("-G", "1", "-t", "10:00", "--wrap", "sleep 600")
    cluster.wait_state(job_id, {"RUNNING"})
    base = cluster.work / f"{label}-{job_id}"
    go, printed, end = (f"{base}.{name}" for name in ("go", "printed", "end"))
    process = subprocess.Popen(
        [str(BIN / "gsrun"), "--jobid", job_id, sys.executable, "-c", PRINTER, go, printed, end],
        env=env or cluster.env, cwd=str(cluster.work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    step = PrintingStep(job_id, process, Reader(process), go, printed, end)
    try:
        wait_until(lambda: len(step.reader.lines) >= FIRST, 60, what="the step's first lines at gsrun")
        yield step
        process.wait(timeout=120)
        step.reader.thread.join(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        cluster.run("gcancel", job_id, check=False)


def run_through_fault(cluster: Cluster, fault: Callable[[Cluster], None], restart_agent: bool = False) -> None:
    with printing_step(cluster, "fault") as step:
        controller = cluster.pid("controller")
        os.kill(controller, signal.SIGSTOP)
        try:
            open(step.go, "w").close()
            wait_until(lambda: os.path.exists(step.printed), 60,
                       what="the task to print while the controller is stopped")
            fault(cluster)
        finally:
            os.kill(controller, signal.SIGCONT)
        if restart_agent:  # `garrison up` waits for the controller: once it runs again
            cluster.up()
        open(step.end, "w").close()
    assert_every_line_once(step.process, step.reader)


def assert_every_line_once(step: subprocess.Popen[str], reader: Reader) -> str:
    """gsrun printed every line of PRINTER once, in order, and exited 0; returns what it said on stderr."""
    err = step.stderr.read() if step.stderr is not None else ""
    expected = [f"line {i}\n" for i in range(1, TOTAL + 1)] + ["last\n"]
    if reader.lines != expected:
        seen = [int(line.split()[1]) for line in reader.lines if line.startswith("line ")]
        missing = sorted(set(range(1, TOTAL + 1)) - set(seen))
        repeated = len(seen) - len(set(seen))
        raise AssertionError(f"{len(reader.lines)} lines, {len(missing)} missing (first {missing[:5]}), "
                             f"{repeated} repeated, in order: {seen == sorted(seen)}; gsrun said: {err.strip()}")
    assert step.returncode == 0, err
    return err


def test_output_survives_a_reset_of_the_agents_link_exactly_once(cluster: Cluster) -> None:
    if shutil.which("ss") is None:
        pytest.skip("no ss to reset TCP connections with")
    run_through_fault(cluster, reset_agent_links)


def test_output_survives_the_agent_killed_and_restarted_exactly_once(cluster: Cluster) -> None:
    run_through_fault(cluster, kill_agent, restart_agent=True)


@pytest.mark.parametrize("transport", ["local", "grpc"])
def test_a_step_and_its_output_survive_a_controller_restart_exactly_once(cluster: Cluster, transport: str) -> None:
    """The controller is killed (SIGKILL: what it had acknowledged to the agent but not yet written to gsrun's
    stream is gone with it) while the task prints, and started again: the task runs on, gsrun takes the step
    up again on a new stream (the local socket, or gRPC), and every line arrives once, in order; the step
    ends with the task's exit code, as srun's would across a slurmctld restart."""
    env = dict(cluster.env, GARRISON_TRANSPORT="grpc") if transport == "grpc" else cluster.env
    with printing_step(cluster, "restart", env) as step:
        open(step.go, "w").close()
        wait_until(lambda: len(step.reader.lines) > FIRST, 60, what="the task's lines after the first")
        os.kill(cluster.pid("controller"), signal.SIGKILL)
        wait_until(lambda: os.path.exists(step.printed), 60, what="the task to print while the controller is down")
        cluster.up()
        open(step.end, "w").close()
    err = assert_every_line_once(step.process, step.reader)
    assert "took step" in err, err  # gsrun says so on its stderr, as it says it lost the stream
