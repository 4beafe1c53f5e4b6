"""galloc (Slurm's salloc) end to end: a real controller and two agents, galloc run as users run it.

The allocation goes through the queue like any job, its command runs here with the allocation's environment,
its exit code becomes the job's, and a galloc that dies, or a time limit, ends the allocation and frees its
GPUs. The keep-alive lease is 3 s here (allocation_keepalive_s), so a vanished galloc is noticed quickly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import BIN, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

KEEPALIVE_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    extra = tmp_path_factory.mktemp("galloc") / "galloc.toml"
    extra.write_text(f"allocation_keepalive_s = {KEEPALIVE_S}\n")
    c = start_cluster(["dgx-a100", "dgx1v"], ["--extra-config", str(extra)])
    try:
        yield c
    finally:
        stop_cluster(c)


def galloc(c: Cluster, *args: str, stderr: Path) -> subprocess.Popen[bytes]:
    """galloc in the background, its stderr (the status lines) going to a file the test reads as it grows."""
    with open(stderr, "wb") as err:
        return subprocess.Popen([str(BIN / "galloc"), *args], env=c.env, cwd=c.work, stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL)


def allocated_gpus(c: Cluster) -> dict[str, int]:
    """Each node's allocated GPUs, from ginfo's GPUS(A/T) column."""
    header, *rows = c.run("ginfo").stdout.splitlines()
    column = header.split().index("GPUS(A/T)")
    return {row.split()[0]: int(row.split()[column].split("/")[0]) for row in rows}


def job_of(stderr: Path) -> str | None:
    for line in stderr.read_text().splitlines():
        if line.startswith("galloc: Pending job allocation "):
            return line.rsplit(" ", 1)[1]
    return None


def test_galloc_runs_its_command_with_the_allocations_environment(cluster: Cluster) -> None:
    c = cluster
    env_file = c.work / "galloc-env.txt"
    proc = c.run("galloc", "-N", "2", "-G", "2", "-J", "interactive", "sh", "-c", f"env > {env_file}; exit 3",
                 check=False)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.splitlines()
    job_id = lines[0].removeprefix("galloc: Pending job allocation ")
    assert f"galloc: Granted job allocation {job_id}" in lines, lines
    assert lines[-1] == f"galloc: Relinquishing job allocation {job_id}", lines
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert env["SLURM_JOB_ID"] == env["GARRISON_JOB_ID"] == job_id
    assert env["SLURM_JOB_NODELIST"] == "node[1-2]" and env["SLURM_NNODES"] == "2"
    assert env["SLURM_JOB_NAME"] == "interactive" and env["GARRISON_NODELIST"] == "node1,node2"
    assert env["SLURM_JOB_GPUS"] == "0" and env["SLURM_SUBMIT_DIR"] == str(c.work)
    assert "CUDA_VISIBLE_DEVICES" not in env or env["CUDA_VISIBLE_DEVICES"] == os.environ.get("CUDA_VISIBLE_DEVICES")
    # The command's exit code is the job's; a non-zero one fails it, as salloc's job does.
    job = c.wait_done(job_id)
    assert (job["state"], job["exit_code"]) == ("FAILED", 3), job
    # gacct reads the store on a pool of its own: once seen in gqueue, the record is there or about to be.
    wait_until(lambda: '"FAILED"' in c.run("gacct", "-j", job_id, "--json").stdout, 10, what="gacct's record")
    detail = c.run("gjob", job_id).stdout
    assert "Launch=allocation" in detail and "Command=(galloc on " in detail and "StdOut=(galloc)" in detail, detail
    wait_until(lambda: set(allocated_gpus(c).values()) == {0}, 60, what="the allocation's GPUs to be free")

    ok = c.run("galloc", "-G", "1", "true")
    job_id = ok.stderr.splitlines()[0].rsplit(" ", 1)[1]
    assert (c.wait_done(job_id)["state"], c.job(job_id)["exit_code"]) == ("COMPLETED", 0)


def test_galloc_refuses_what_is_not_an_allocation_option(cluster: Cluster) -> None:
    proc = cluster.run("galloc", "--array", "1-3", "true", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (
        2, "galloc: error: --array is not a galloc option (galloc runs its command here, in an allocation)")
    bad = cluster.run("galloc", "-G", "nine", "true", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("galloc: error: --gpus") and len(bad.stderr.splitlines()) == 1


def test_galloc_waits_behind_a_busy_cluster_then_starts(cluster: Cluster) -> None:
    c = cluster
    release = c.work / "busy-release"
    busy = c.submit("-N", "2", "--gpus-per-node", "8", "--wrap", f"while [ ! -e {release} ]; do sleep 0.1; done")
    c.wait_state(busy, {"RUNNING"})
    stderr, ran = c.work / "waiting.err", c.work / "waiting.ran"
    proc = galloc(c, "-G", "8", "sh", "-c", f"echo $SLURM_JOB_ID > {ran}", stderr=stderr)
    try:
        wait_until(lambda: "galloc: waiting for resources: position 1, estimated start " in stderr.read_text(),
                   60, what="galloc to show its queue position and estimated start")
        job_id = job_of(stderr)
        assert job_id is not None and c.job(job_id)["state"] == "PENDING"
        assert not ran.exists()
        release.touch()
        assert proc.wait(timeout=120) == 0, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ran.read_text().strip() == job_id
    assert f"galloc: Granted job allocation {job_id}" in stderr.read_text()
    assert c.wait_done(job_id)["state"] == "COMPLETED"


def test_ctrl_c_while_waiting_cancels_the_request(cluster: Cluster) -> None:
    c = cluster
    release = c.work / "busy2-release"
    busy = c.submit("-N", "2", "--gpus-per-node", "8", "--wrap", f"while [ ! -e {release} ]; do sleep 0.1; done")
    try:
        c.wait_state(busy, {"RUNNING"})
        stderr = c.work / "ctrlc.err"
        proc = galloc(c, "-G", "8", "true", stderr=stderr)
        job_id = wait_until(lambda: job_of(stderr), 30, what="galloc to submit")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 1
        assert c.wait_done(job_id)["state"] == "CANCELLED"
        assert f"galloc: Job allocation {job_id} has been revoked" in stderr.read_text()
    finally:
        release.touch()
    c.wait_done(busy)


def test_a_killed_galloc_loses_its_allocation(cluster: Cluster) -> None:
    c = cluster
    stderr, pid_file = c.work / "killed.err", c.work / "killed.pid"
    proc = galloc(c, "-G", "4", "sh", "-c", f"echo $$ > {pid_file}; exec sleep 300", stderr=stderr)
    try:
        wait_until(pid_file.exists, 60, what="the command to start")
        job_id = job_of(stderr)
        assert job_id is not None and c.job(job_id)["state"] == "RUNNING"
        assert sum(allocated_gpus(c).values()) == 4
        proc.kill()
        proc.wait()
        # Within the keep-alive lease (3 s) and a check, not at the time limit (an hour).
        job = c.wait_done(job_id, timeout=30)
        assert job["state"] == "CANCELLED" and "keep-alive" in job["reason"], job
        wait_until(lambda: sum(allocated_gpus(c).values()) == 0, 30, what="the GPUs to be free again")
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.exists():  # the command outlives a SIGKILLed galloc, as salloc's does
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_time_limit_ends_a_galloc(cluster: Cluster) -> None:
    c = cluster
    stderr, hup = c.work / "timeout.err", c.work / "timeout.hup"
    proc = galloc(c, "-G", "1", "-t", "0:04", "sh", "-c",
                  f"trap 'echo hangup > {hup}; exit 0' HUP; while :; do sleep 0.1; done", stderr=stderr)
    try:
        assert proc.wait(timeout=60) == 0, stderr.read_text()  # the command's status: its trap exits 0
    finally:
        if proc.poll() is None:
            proc.kill()
    job_id = job_of(stderr)
    assert job_id is not None
    assert hup.read_text() == "hangup\n"
    text = stderr.read_text()
    assert f"galloc: Job {job_id} has exceeded its time limit and its allocation has been revoked." in text, text
    assert "Relinquishing" not in text
    assert c.wait_done(job_id)["state"] == "TIMEOUT"


class Terminal:
    """galloc on a real pseudo-terminal, as its controlling terminal, the way a user runs it."""

    def __init__(self, c: Cluster, *args: str) -> None:
        import fcntl
        import termios

        self.master, slave = os.openpty()

        def take_terminal() -> None:  # runs in the child, after setsid
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([str(BIN / "galloc"), *args], env=c.env, cwd=c.work, stdin=slave,
                                     stdout=slave, stderr=slave, start_new_session=True, preexec_fn=take_terminal)
        os.close(slave)
        self.output = b""

    def read_until(self, text: str, timeout: float = 120.0) -> None:
        import select

        def seen() -> bool:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 4096)
                except OSError:
                    pass
            return text.encode() in self.output

        wait_until(seen, timeout, what=f"{text!r} on galloc's terminal")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def test_on_a_terminal_ctrl_c_belongs_to_the_command_and_while_waiting_cancels(cluster: Cluster) -> None:
    c = cluster
    # Granted: the command is the terminal's foreground group, so Ctrl-C interrupts it, not galloc, which then
    # releases the allocation with the command's status.
    term = Terminal(c, "-G", "1", "sh", "-c", "echo command-ready; exec sleep 300")
    try:
        term.read_until("command-ready")
        term.type(b"\x03")
        assert term.proc.wait(timeout=30) == 130
        term.read_until("Relinquishing job allocation")
    finally:
        term.close()
    job_id = term.output.decode().split("Pending job allocation ", 1)[1].split()[0]
    job = c.wait_done(job_id)
    assert (job["state"], job["exit_code"]) == ("FAILED", 130)

    # Waiting: galloc is the foreground group; Ctrl-C cancels the request.
    release = c.work / "busy3-release"
    busy = c.submit("-N", "2", "--gpus-per-node", "8", "--wrap", f"while [ ! -e {release} ]; do sleep 0.1; done")
    try:
        c.wait_state(busy, {"RUNNING"})
        term = Terminal(c, "-G", "8", "true")
        try:
            term.read_until("waiting for resources: position")
            term.type(b"\x03")
            assert term.proc.wait(timeout=30) == 1
            term.read_until("has been revoked")
        finally:
            term.close()
        waiting_id = term.output.decode().split("Pending job allocation ", 1)[1].split()[0]
        assert c.wait_done(waiting_id)["state"] == "CANCELLED"
    finally:
        release.touch()
    c.wait_done(busy)


def test_a_preempted_galloc_is_told_and_its_allocation_cancelled(preempting_cluster: Cluster) -> None:
    c = preempting_cluster
    stderr, hup = c.work / "preempted.err", c.work / "preempted.hup"
    proc = galloc(c, "-q", "low", "-G", "8", "sh", "-c",
                  f"trap 'echo hangup > {hup}; exit 0' HUP; echo $$ > {hup}.pid; while :; do sleep 0.1; done",
                  stderr=stderr)
    try:
        wait_until(lambda: (c.work / "preempted.hup.pid").exists(), 60, what="the command to start")
        job_id = job_of(stderr)
        assert job_id is not None
        urgent = c.submit("-q", "urgent", "-G", "8", "--wrap", "true")
        assert proc.wait(timeout=60) == 0, stderr.read_text()
        assert c.wait_done(urgent, timeout=60)["state"] == "COMPLETED"
    finally:
        if proc.poll() is None:
            proc.kill()
    assert hup.read_text() == "hangup\n"
    assert f"galloc: Job allocation {job_id} has been revoked: preempted." in stderr.read_text()
    job = c.wait_done(job_id)
    assert job["state"] == "CANCELLED" and job["reason"] == "preempted", job


def test_galloc_keeps_its_allocation_through_a_controller_restart(cluster: Cluster) -> None:
    c = cluster
    stderr, started, release = c.work / "restart.err", c.work / "restart.started", c.work / "restart.release"
    proc = galloc(c, "-G", "2", "sh", "-c", f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done",
                  stderr=stderr)
    try:
        wait_until(started.exists, 60, what="the command to start")
        job_id = job_of(stderr)
        assert job_id is not None
        os.kill(c.pid("controller"), signal.SIGKILL)
        c.up()  # the same address and database; every allocation gets a full lease from the restart
        # galloc says "the controller answers again" only if one of its keep-alives fell in the outage; the
        # release below needs the restarted controller either way.
        assert c.job(job_id)["state"] == "RUNNING"
        release.touch()
        assert proc.wait(timeout=60) == 0, stderr.read_text()
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
    assert f"galloc: Relinquishing job allocation {job_id}" in stderr.read_text()
    assert c.wait_done(job_id)["state"] == "COMPLETED"


def test_gsrun_inside_galloc_runs_a_step_on_every_allocated_node(cluster: Cluster) -> None:
    """salloc, then srun in it: galloc's command finds its allocation in SLURM_JOB_ID, and gsrun starts a job
    step on the allocation's nodes (which run nothing but hold the resources); the step is in gacct."""
    c = cluster
    stderr, out = c.work / "steps-in-galloc.err", c.work / "steps-in-galloc.out"
    proc = galloc(c, "-N", "2", "--gpus-per-node", "1", "sh", "-c",
                  f"{BIN / 'gsrun'} -N 2 --label bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES' > {out}",
                  stderr=stderr)
    assert proc.wait(timeout=120) == 0, stderr.read_text()
    job_id = job_of(stderr)
    lines = sorted(out.read_text().split("\n")[:-1])
    assert [line.split()[:2] for line in lines] == [["0:", "node1"], ["1:", "node2"]], lines
    assert c.wait_done(str(job_id))["state"] == "COMPLETED"
    recorded = json.loads(c.run("gacct", "--steps", "-j", str(job_id), "--json").stdout)["steps"]
    assert [s["state"] for s in recorded if s["step_id"] == f"{job_id}.0"] == ["COMPLETED"], recorded


def test_gsrun_outside_a_job_renews_its_allocation_and_ends_it_with_the_steps_exit_code(cluster: Cluster) -> None:
    """srun outside a job holds an allocation as salloc's (its lease renewed while the step runs, here for
    longer than the lease), its tasks get the allocation's job variables, and the job ends with the step's
    exit code (FAILED 3), as srun's does in sacct."""
    c = cluster
    outside = {k: v for k, v in c.env.items() if not k.startswith(("SLURM_", "GARRISON_JOB"))}
    result = subprocess.run(
        [str(BIN / "gsrun"), "-N", "2", "--gpus-per-node", "1", "-J", "leased", "bash", "-c",
         f"sleep {2 * KEEPALIVE_S}; echo $SLURM_JOB_NODELIST $SLURM_NNODES $SLURM_JOB_PARTITION $SLURM_SUBMIT_DIR;"
         " exit 3"],
        env=outside, cwd=c.work, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == [f"node[1-2] 2 main {c.work}"] * 2, result.stdout
    (job,) = [j for j in c.jobs() if j["name"] == "leased"]
    done = c.wait_done(str(job["job_id"]))
    assert (done["state"], done["exit_code"]) == ("FAILED", 3), done
    wait_until(lambda: sum(allocated_gpus(c).values()) == 0, 30, what="the GPUs to be free again")


def test_a_killed_gsrun_outside_a_job_loses_its_allocation(cluster: Cluster) -> None:
    c = cluster
    outside = {k: v for k, v in c.env.items() if not k.startswith(("SLURM_", "GARRISON_JOB"))}
    step = subprocess.Popen([str(BIN / "gsrun"), "-G", "2", "-J", "killed-step", "sleep", "300"], env=outside,
                            cwd=c.work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        job = wait_until(lambda: next((j for j in c.jobs() if j["name"] == "killed-step" and j["state"] == "RUNNING"),
                                      None), 60, what="gsrun's allocation to run")
        step.kill()
        step.wait()
        # Within the keep-alive lease (3 s) and a check, not at the time limit.
        done = c.wait_done(str(job["job_id"]), timeout=30)
        assert done["state"] == "CANCELLED" and "keep-alive" in done["reason"], done
        wait_until(lambda: sum(allocated_gpus(c).values()) == 0, 30, what="the GPUs to be free again")
    finally:
        if step.poll() is None:
            step.kill()
