"""Job steps end to end (issue 16): gsrun inside batch jobs on two real agents, its output streamed back
through the controller, exit statuses, signals, cancellation, --kill-on-bad-exit, refusals, --pty through
a real pseudo-terminal, and the step views of gqueue -s and gacct --steps."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.polling import wait_until

from .conftest import BIN, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

ALL_REDUCE = """
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) == int(os.environ["SLURM_PROCID"])
assert world == int(os.environ["WORLD_SIZE"]) == int(os.environ["SLURM_STEP_NUM_TASKS"])
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
# One write per line: torchrun's workers on a node share their task's stdout, and print() writes the text and
# its newline apart when unbuffered, so two workers' lines could merge into one.
sys.stdout.write(f"rank {rank} world {world} local {os.environ['LOCAL_RANK']} node {os.environ['SLURM_NODEID']} "
                 f"sum {value.item():g} step {os.environ['SLURM_STEP_ID']} "
                 f"tpn {os.environ['SLURM_STEP_TASKS_PER_NODE']}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx1v"])
    try:
        yield c
    finally:
        stop_cluster(c)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def output_of(cluster: Cluster, job_id: str) -> str:
    path = cluster.work / f"garrison-{job_id}.out"
    return path.read_text() if path.exists() else ""


def steps(cluster: Cluster, *args: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = json.loads(cluster.run(*args, "--json").stdout)["steps"]
    return result


def running_job(cluster: Cluster, *options: str) -> str:
    job_id = cluster.submit(*options, "-t", "10:00", "--wrap", "sleep 600")
    cluster.wait_state(job_id, {"RUNNING"})
    return job_id


def gsrun(cluster: Cluster, job_id: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(BIN / "gsrun"), "--jobid", job_id, *args], env=cluster.env, cwd=str(cluster.work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_step_running(cluster: Cluster, step_id: str) -> None:
    wait_until(lambda: any(s["step_id"] == step_id and s["state"] == "RUNNING" for s in steps(cluster, "gqueue", "-s")),
               30, what=f"step {step_id} to run")


def test_batch_script_runs_gloo_all_reduce_across_two_nodes_and_labelled_steps(cluster: Cluster) -> None:
    pytest.importorskip("torch")
    script = write(cluster.work / "step_allreduce.py", ALL_REDUCE)
    batch = write(cluster.work / "steps.sh", f"""#!/bin/bash
#SBATCH -N 2 --gpus-per-node=2 -t 5:00
gsrun -n 4 --ntasks-per-node 2 {sys.executable} {script}
echo "allreduce exit $?"
gsrun --label hostname
echo "hostname exit $?"
gsrun -N 2 --label bash -c 'echo "$SLURM_PROCID/$SLURM_LOCALID/$SLURM_NODEID $SLURMD_NODENAME $SLURM_STEP_NODELIST gpus=$CUDA_VISIBLE_DEVICES"'
gsrun -N 1 -n 2 --gpus-per-task 1 --label bash -c 'echo "gpu=$CUDA_VISIBLE_DEVICES" >&2'
gsrun -n 1 bash -c 'exit 3'
echo "failing exit $?"
""")
    job_id = cluster.submit(str(batch))
    job = cluster.wait_done(job_id, timeout=180)
    out = output_of(cluster, job_id)
    assert job["state"] == "COMPLETED", out
    ranks = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert ranks == [
        "rank 0 world 4 local 0 node 0 sum 10 step 0 tpn 2(x2)",
        "rank 1 world 4 local 1 node 0 sum 10 step 0 tpn 2(x2)",
        "rank 2 world 4 local 0 node 1 sum 10 step 0 tpn 2(x2)",
        "rank 3 world 4 local 1 node 1 sum 10 step 0 tpn 2(x2)",
    ], out
    assert "allreduce exit 0" in out and "hostname exit 0" in out and "failing exit 3" in out
    # One task per node by default, each line labelled with its task number; as root, each fake node's tasks
    # see their node's name as their host name (nodeagent/fakehost.py), as on separate hosts.
    names = ["node1", "node2"] if os.geteuid() == 0 else [os.uname().nodename] * 2
    assert [f"0: {names[0]}", f"1: {names[1]}"] == sorted(line for line in out.splitlines()
                                                          if line in (f"0: {names[0]}", f"1: {names[1]}")), out
    assert "0: 0/0/0 node1 node[1-2] gpus=0,1" in out, out
    # Without --gpus-per-task a task sees the job's GPUs on its node (the scheduler's choice there).
    (node2,) = [line for line in out.splitlines() if line.startswith("1: 1/0/1 node2 node[1-2] gpus=")]
    assert len(node2.split("gpus=")[1].split(",")) == 2, out
    # --gpus-per-task: each task its own GPU (stderr, labelled too).
    assert "0: gpu=0" in out and "1: gpu=1" in out, out
    records = {s["step_id"]: s for s in steps(cluster, "gacct", "--steps", "-j", job_id)}
    assert [records[f"{job_id}.{n}"]["state"] for n in ("batch", "0", "1", "2", "3", "4")] == [
        "COMPLETED", "COMPLETED", "COMPLETED", "COMPLETED", "COMPLETED", "FAILED"]
    assert records[f"{job_id}.4"]["exit_code"] == 3 and records[f"{job_id}.0"]["ntasks"] == 4
    assert records[f"{job_id}.0"]["nodes"] == ["node1", "node2"] and records[f"{job_id}.3"]["gpus"] == 2


def test_two_steps_run_at_once(cluster: Cluster) -> None:
    flags = cluster.work / "concurrent"
    flags.mkdir()
    flags.chmod(0o777)
    # Each step waits for the other's flag: both end only if they run at the same time.
    wait_for = "touch {mine}; for i in $(seq 300); do [ -e {other} ] && exit 0; sleep 0.1; done; exit 9"
    batch = write(cluster.work / "concurrent.sh", f"""#!/bin/bash
#SBATCH -N 1 -G 2 -t 5:00
gsrun -n 1 --gpus-per-task 1 bash -c '{wait_for.format(mine=flags / "a", other=flags / "b")}' &
gsrun -n 1 --gpus-per-task 1 bash -c '{wait_for.format(mine=flags / "b", other=flags / "a")}' &
wait %1; first=$?
wait %2; second=$?
echo "steps $first $second"
""")
    job_id = cluster.submit(str(batch))
    job = cluster.wait_done(job_id, timeout=120)
    assert job["state"] == "COMPLETED" and "steps 0 0" in output_of(cluster, job_id), output_of(cluster, job_id)


def test_a_step_cancelled_alone_and_signals_reach_its_tasks(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    mark = cluster.work / f"usr1-{job_id}"
    step = gsrun(cluster, job_id, "bash", "-c", f"trap 'echo got-usr1 > {mark}' USR1; while :; do sleep 0.1; done")
    wait_step_running(cluster, f"{job_id}.0")
    step.send_signal(signal.SIGUSR1)
    wait_until(lambda: mark.exists(), 30, what="the task to get SIGUSR1 from gsrun")
    cluster.run("gcancel", f"{job_id}.0")
    _, err = step.communicate(timeout=60)
    assert step.returncode == 128 + signal.SIGTERM and "cancelled" in err, err
    assert cluster.job(job_id)["state"] == "RUNNING"  # the job goes on
    records = {s["step_id"]: s for s in steps(cluster, "gacct", "--steps", "-j", job_id)}
    assert records[f"{job_id}.0"]["state"] == "CANCELLED" and records[f"{job_id}.batch"]["state"] == "RUNNING"
    again = cluster.run("gsrun", "--jobid", job_id, "echo", "still here")
    assert again.stdout == "still here\n"
    # The same over gRPC, as from a host that is not the controller's (the local socket is the default here).
    remote = cluster.run("gsrun", "--jobid", job_id, "echo", "over grpc", env={**cluster.env, "GARRISON_TRANSPORT": "grpc"})
    assert remote.stdout == "over grpc\n"
    refused = cluster.run("gsrun", "--jobid", job_id, "--gpus-per-task", "5", "true", check=False,
                          env={**cluster.env, "GARRISON_TRANSPORT": "grpc"})
    assert refused.returncode == 2 and "need 5 GPUs" in refused.stderr, refused.stderr
    cluster.run("gcancel", job_id)


def test_ctrl_c_twice_cancels_the_step(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    step = gsrun(cluster, job_id, "sleep", "300")
    wait_step_running(cluster, f"{job_id}.0")
    step.send_signal(signal.SIGINT)
    assert step.stderr is not None
    first = step.stderr.readline()  # two signals sent at once would merge into one: wait for the first's answer
    step.send_signal(signal.SIGINT)
    _, err = step.communicate(timeout=60)
    err = first + err
    # SIGINT reaches the tasks first, then the step is terminated (SIGTERM): the sleep dies of either.
    assert step.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM) and "one more within 1 sec" in err, err
    records = {s["step_id"]: s for s in steps(cluster, "gacct", "--steps", "-j", job_id)}
    assert records[f"{job_id}.0"]["state"] == "CANCELLED"
    cluster.run("gcancel", job_id)


def test_kill_on_bad_exit_stops_the_other_tasks(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-N", "2", "--gpus-per-node", "1")
    started = time.monotonic()
    result = cluster.run("gsrun", "--jobid", job_id, "-n", "3", "--kill-on-bad-exit", "bash", "-c",
                         'if [ "$SLURM_PROCID" = 2 ]; then exit 4; fi; exec sleep 300', check=False)
    assert time.monotonic() - started < 60
    assert result.returncode == 128 + signal.SIGTERM, result.stderr  # the highest: tasks 0 and 1 were stopped
    assert "task 2 exited with exit code 4" in result.stderr and "--kill-on-bad-exit" in result.stderr
    cluster.run("gcancel", job_id)


def test_more_than_the_allocation_is_refused_in_one_line(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "2")
    before = [s["step_id"] for s in steps(cluster, "gacct", "--steps", "-j", job_id)]
    for args, message in (
        (["--gpus-per-task", "3", "true"], "need 3 GPUs; job"),
        (["-N", "2", "true"], "allocation has 1 node(s)"),
        (["-w", "node9", "true"], "-w node9: not a node of job"),
        (["--gpu-bind", "sideways", "true"], "--gpu-bind=sideways: expected one of"),
    ):
        result = cluster.run("gsrun", "--jobid", job_id, *args, check=False)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert [s["step_id"] for s in steps(cluster, "gacct", "--steps", "-j", job_id)] == before  # none stored
    other = cluster.submit("--wrap", "true")
    cluster.wait_done(other)
    result = cluster.run("gsrun", "--jobid", other, "true", check=False)
    assert result.returncode != 0 and "not RUNNING" in result.stderr
    cluster.run("gcancel", job_id)


def test_gsrun_outside_a_job_asks_for_an_allocation_first(cluster: Cluster) -> None:
    outside = {k: v for k, v in cluster.env.items() if k not in ("SLURM_JOB_ID", "GARRISON_JOB_ID")}
    result = cluster.run("gsrun", "-N", "2", "--gpus-per-node", "1", "--label", "bash", "-c",
                         'echo "$SLURM_STEP_NUM_NODES $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"', env=outside)
    lines = sorted(result.stdout.splitlines())
    assert len(lines) == 2 and lines[0].startswith("0: 2 node1 ") and lines[1].startswith("1: 2 node2 "), result
    (job,) = [j for j in cluster.jobs() if j["name"] == "bash"]
    # The allocation is given back when the step ends: its GPUs are free at once.
    cluster.wait_done(str(job["job_id"]))
    wait_until(lambda: "0/8" in cluster.run("ginfo").stdout.split("node2", 1)[1].split("\n", 1)[0], 30,
               what="node2's GPUs to be free")
    # --gres=gpu:0 outside a job: an allocation without GPUs, as a CPU job on a GPU partition asks for one.
    cpu_only = cluster.run("gsrun", "--gres=gpu:0", "-J", "cpuonly", "bash", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"',
                           env=outside)
    assert cpu_only.stdout == "[]\n", cpu_only
    (cpu_job,) = [j for j in cluster.jobs() if j["name"] == "cpuonly"]
    assert cluster.wait_done(str(cpu_job["job_id"]))["state"] == "COMPLETED"
    failing = cluster.run("gsrun", "--gpus-per-task", "99", "true", env=outside, check=False)
    assert failing.returncode == 2 and len(failing.stderr.strip().splitlines()) == 1, failing.stderr


def test_gsrun_outside_a_job_waits_for_its_allocation_through_a_controller_restart(cluster: Cluster) -> None:
    outside = {k: v for k, v in cluster.env.items() if k not in ("SLURM_JOB_ID", "GARRISON_JOB_ID")}
    flag = cluster.work / "holder-may-end"
    holder = cluster.submit("-w", "node1", "--gpus-per-node", "8", "-t", "10:00", "--wrap",
                            f"while [ ! -e {flag} ]; do sleep 0.1; done")
    cluster.wait_state(holder, {"RUNNING"})
    step = subprocess.Popen([str(BIN / "gsrun"), "-w", "node1", "--gpus-per-node", "8", "-J", "waits-through",
                             "echo", "ran"], env=outside, cwd=str(cluster.work), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(j["name"] == "waits-through" for j in cluster.jobs()), 60,
                   what="gsrun's allocation to be queued")
        os.kill(cluster.pid("controller"), signal.SIGKILL)
        cluster.up()
        flag.touch()
        out, err = step.communicate(timeout=120)
    finally:
        if step.poll() is None:
            step.kill()
    assert (step.returncode, out) == (0, "ran\n"), err
    assert "asking again" in err and "the controller answers again" in err, err
    (job,) = [j for j in cluster.jobs() if j["name"] == "waits-through"]
    # Given back once the step ended, with its exit code, as srun's job ends
    assert cluster.wait_done(str(job["job_id"]))["state"] == "COMPLETED"


def test_a_step_never_outlives_its_job(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    step = gsrun(cluster, job_id, "sleep", "300")
    wait_step_running(cluster, f"{job_id}.0")
    cluster.run("gcancel", job_id)
    _, err = step.communicate(timeout=60)
    assert step.returncode != 0 and f"job {job_id} ended" in err, err
    records = {s["step_id"]: s for s in steps(cluster, "gacct", "--steps", "-j", job_id)}
    assert records[f"{job_id}.0"]["state"] == "CANCELLED"
    wait_until(lambda: not any(s["step_id"].startswith(f"{job_id}.") for s in steps(cluster, "gqueue", "-s")), 30,
               what="the job's steps to leave gqueue -s")


class Terminal:
    """gsrun driven through a real pseudo-terminal, as a user at a terminal would."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.chdir(cluster.work)
            os.execve(str(BIN / "gsrun"), [str(BIN / "gsrun"), *args], cluster.env)
        self.buffer = b""
        self.resize(24, 80)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, token: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while token not in self.buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if not ready:
                raise AssertionError(f"no {token!r} on the terminal; it shows {self.buffer[-800:]!r}")
            try:
                self.buffer += os.read(self.fd, 4096)
            except OSError:
                raise AssertionError(f"the terminal closed; it showed {self.buffer[-800:]!r}") from None
        seen, self.buffer = self.buffer.split(token, 1)
        return seen + token

    def shows_soon(self, typed: bytes, token: bytes) -> bool:
        self.type(typed)
        try:
            self.expect(token, timeout=2.0)
        except AssertionError:
            return False
        return True

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            with_data, _, _ = select.select([self.fd], [], [], 0.1)
            if with_data:
                try:
                    self.buffer += os.read(self.fd, 4096)
                except OSError:
                    pass
        raise AssertionError("gsrun did not exit")


def test_pty_bash_is_an_interactive_shell_on_the_allocated_node(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "2")
    term = Terminal(cluster, "--jobid", job_id, "--pty", "bash", "--norc", "--noprofile", "-i")
    term.type(b"echo JOB=$SLURM_JOB_ID STEP=$SLURM_STEP_ID GPUS=$CUDA_VISIBLE_DEVICES TTY=$(tty); stty size\r")
    seen = term.expect(b"24 80\r\n")
    assert f"JOB={job_id} STEP=0 GPUS=0,1 TTY=/dev/pts/".encode() in seen, seen
    term.resize(40, 132)  # SIGWINCH at gsrun -> TIOCSWINSZ on the task's terminal
    # The signal and the typed bytes take different paths inside gsrun: ask again until the size shows.
    wait_until(lambda: term.shows_soon(b"stty size\r", b"40 132\r\n"), 30,
               what="the new window size to reach the task's terminal")
    term.type(b"sleep 317; echo slept\r")
    wait_until(lambda: subprocess.run(["pgrep", "-f", "^sleep 317$"], capture_output=True).returncode == 0, 30,
               what="the foreground sleep to start")
    term.type(b"\x03")  # Ctrl-C: a byte to the task's terminal, SIGINT to its foreground process
    term.type(b"echo status=$?\r")
    assert b"status=130" in term.expect(b"status=130")
    term.type(b"exit 5\r")
    assert term.wait() == 5
    records = {s["step_id"]: s for s in steps(cluster, "gacct", "--steps", "-j", job_id)}
    assert records[f"{job_id}.0"]["state"] == "FAILED" and records[f"{job_id}.0"]["exit_code"] == 5
    assert not any(s["step_id"] == f"{job_id}.0" for s in steps(cluster, "gqueue", "-s"))
    cluster.run("gcancel", job_id)


def test_srun_torchrun_one_task_per_node(cluster: Cluster) -> None:
    pytest.importorskip("torch")
    script = write(cluster.work / "step_torchrun.py", ALL_REDUCE.replace('os.environ["SLURM_PROCID"]', "rank")
                   .replace('== int(os.environ["SLURM_STEP_NUM_TASKS"])', ""))
    batch = write(cluster.work / "torchrun.sh", f"""#!/bin/bash
#SBATCH -N 2 --gpus-per-node=2 -t 5:00
gsrun --ntasks-per-node 1 bash -c '{sys.executable} -m torch.distributed.run --nnodes $SLURM_STEP_NUM_NODES \\
  --node-rank $SLURM_NODEID --nproc-per-node 2 --master-addr $MASTER_ADDR --master-port $MASTER_PORT {script}'
echo "torchrun exit $?"
""")
    job_id = cluster.submit(str(batch))
    job = cluster.wait_done(job_id, timeout=180)
    out = output_of(cluster, job_id)
    assert job["state"] == "COMPLETED" and "torchrun exit 0" in out, out
    # (The whole output in the message: twice a rank's line was missing, with every exit code 0, on a loaded
    # machine; the output says whether it was lost or merged into another line, and the daemons' logs whether
    # a link broke meanwhile: output queued on a broken link was lost until acknowledgements came in.)
    ranks = sorted(line.split()[1] for line in out.splitlines() if line.startswith("rank "))
    assert ranks == ["0", "1", "2", "3"], out + "\n" + "\n".join(link_events(cluster))
    assert all(" sum 10 " in line for line in out.splitlines() if line.startswith("rank ")), out


def link_events(cluster: Cluster) -> list[str]:
    """The daemons' log lines that say an agent's link broke (or output went missing on one)."""
    marks = ("link to controller", "missed heartbeats", "disconnected", "stream from", "alive again", "lost")
    return [f"{log.name}: {line}" for log in sorted(cluster.state_dir.glob("*.log"))
            for line in log.read_text(errors="replace").splitlines() if any(m in line for m in marks)]


def test_a_step_survives_an_agent_restart_and_its_output_resumes(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    flag = cluster.work / f"flag-{job_id}"
    step = gsrun(cluster, job_id, "bash", "-c", f"echo before; while [ ! -e {flag} ]; do sleep 0.1; done; "
                 "echo after; exit 6")
    assert step.stdout is not None and step.stdout.readline() == "before\n"
    agent = cluster.pid("agent-1")
    os.kill(agent, signal.SIGKILL)
    cluster.up()  # restarts only agent-1; the step's supervisor and task never noticed
    assert cluster.pid("agent-1") != agent
    flag.touch()
    out, err = step.communicate(timeout=60)
    assert (out, step.returncode) == ("after\n", 6), err
    cluster.run("gcancel", job_id)


def test_output_comes_in_whole_lines_and_with_u_as_it_is_written(cluster: Cluster) -> None:
    """srun's buffering: a line still being written waits for its newline (or its task's end); with -u the
    bytes go as they come, so a progress line without a newline is seen while the task still runs."""
    job_id = running_job(cluster, "-G", "1")
    flag = cluster.work / f"flag-u-{job_id}"
    step = gsrun(cluster, job_id, "-u", "bash", "-c",
                 f"printf 'epoch 1: '; while [ ! -e {flag} ]; do sleep 0.1; done; echo done")
    assert step.stdout is not None
    assert step.stdout.read(len("epoch 1: ")) == "epoch 1: "  # before the task goes on: it waits for the flag
    flag.touch()
    out, err = step.communicate(timeout=60)
    assert (out, step.returncode) == ("done\n", 0), err
    buffered = cluster.run("gsrun", "--jobid", job_id, "bash", "-c", "printf 'a'; printf 'b\\nc'")
    assert buffered.stdout == "ab\nc"  # the last partial line goes once its task has ended
    cluster.run("gcancel", job_id)


def test_a_step_outlives_a_controller_restart_and_its_gsrun_takes_it_up_again(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    flag = cluster.work / f"flag-{job_id}"
    step = gsrun(cluster, job_id, "bash", "-c",
                 f"echo before; while [ ! -e {flag} ]; do sleep 0.1; done; echo after; exit 3")
    assert step.stdout is not None and step.stdout.readline() == "before\n"
    os.kill(cluster.pid("controller"), signal.SIGKILL)
    cluster.up()
    flag.touch()
    out, err = step.communicate(timeout=60)
    assert (step.returncode, out) == (3, "after\n"), err  # srun's exit status: the task's
    assert "lost the controller's stream" in err and "took step" in err, err
    assert any(s["step_id"] == f"{job_id}.0" and s["state"] == "FAILED" and s["exit_code"] == 3
               for s in steps(cluster, "gacct", "--steps", "-j", job_id))
    cluster.run("gcancel", job_id)


def test_a_signal_for_the_job_reaches_its_steps_tasks(cluster: Cluster) -> None:
    job_id = cluster.submit("-G", "1", "-t", "10:00", "--wrap", "trap '' USR2; sleep 600")  # the batch shell lives on
    cluster.wait_state(job_id, {"RUNNING"})
    mark = cluster.work / f"job-usr2-{job_id}"
    step = gsrun(cluster, job_id, "bash", "-c", f"trap 'echo got > {mark}; exit 0' USR2; while :; do sleep 0.1; done")
    wait_step_running(cluster, f"{job_id}.0")
    cluster.run("gcancel", "-s", "USR2", job_id)  # as scancel -s: every step, not only the batch shell
    _, err = step.communicate(timeout=60)
    assert step.returncode == 0 and mark.read_text() == "got\n", err
    cluster.run("gcancel", job_id)


def test_a_step_wanting_gpus_other_steps_hold_is_refused_at_once(cluster: Cluster) -> None:
    job_id = running_job(cluster, "-G", "1")
    holder = gsrun(cluster, job_id, "--gpus-per-task", "1", "sleep", "300")
    wait_step_running(cluster, f"{job_id}.0")
    busy = cluster.run("gsrun", "--jobid", job_id, "--gpus-per-task", "1", "true", check=False)
    assert busy.returncode == 1 and "other steps hold the rest" in busy.stderr, busy.stderr
    assert len(busy.stderr.strip().splitlines()) == 1
    shared = cluster.run("gsrun", "--jobid", job_id, "bash", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert shared.stdout == "0\n"  # a step without --gpus-per-task holds none, so it runs beside
    # srun --gres=none (or gpu:0), as real scripts run a CPU-only step in a GPU job: it sees no GPU at all.
    for gres in ("none", "gpu:0"):
        blind = cluster.run("gsrun", "--jobid", job_id, f"--gres={gres}", "bash", "-c",
                            'echo "[$CUDA_VISIBLE_DEVICES] ${SLURM_GPUS_ON_NODE-unset} ${SLURM_STEP_GPUS-unset}"')
        assert blind.stdout == "[] unset unset\n", blind
    cluster.run("gcancel", f"{job_id}.0")
    holder.communicate(timeout=60)
    cluster.run("gcancel", job_id)


def test_behind_the_devices_cgroup_a_job_and_its_steps_number_their_gpus_from_0(cluster: Cluster) -> None:
    """CUDA numbers the GPUs a process may open from 0 in the node's order, so behind the attempt's devices
    cgroup a job on node1's last GPU is told CUDA_VISIBLE_DEVICES=0 (7 would name a device it cannot see), as
    Slurm's are under ConstrainDevices=yes; SLURM_JOB_GPUS and SLURM_STEP_GPUS keep the node's indices."""
    filler = running_job(cluster, "-w", "node1", "-G", "7")
    job_id = cluster.submit("-w", "node1", "-G", "1", "-t", "5:00", "--wrap",
                            'echo "batch $CUDA_VISIBLE_DEVICES $GPU_DEVICE_ORDINAL $SLURM_JOB_GPUS"; '
                            'gsrun bash -c \'echo "step $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS"\'; '
                            'gsrun --gpus-per-task 1 bash -c \'echo "held $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS"\'')
    assert cluster.wait_done(job_id, timeout=60)["state"] == "COMPLETED", output_of(cluster, job_id)
    cluster.run("gcancel", filler)
    lines = dict(line.split(" ", 1) for line in output_of(cluster, job_id).splitlines())
    cuda, ordinal, job_gpus = lines["batch"].split()
    assert (cuda, ordinal) == ("0", "0") and job_gpus != "0", lines  # GPU 0 is the filler's
    assert lines["step"].split() == ["0", job_gpus] and lines["held"].split() == ["0", job_gpus], lines


def test_a_steps_tasks_are_in_a_child_of_the_jobs_cgroup_on_every_node(cluster: Cluster) -> None:
    """Issue 18's containment holds steps too: on the batch script's node (its attempt has a supervisor) and
    on a node the job only holds (a placeholder), each task is in `<the attempt's cgroup>/step_N`, so the
    job's memory, CPU, device and task limits bound its steps, and the attempt's end kills them."""
    job_id = running_job(cluster, "-N", "2", "--gpus-per-node", "1")
    task = gsrun(cluster, job_id, "-N", "2", "--label", "bash", "-c", "grep -E '^[0-9]+:memory:' /proc/self/cgroup")
    out, err = task.communicate(timeout=60)
    assert task.returncode == 0, err
    lines = sorted(out.splitlines())
    assert len(lines) == 2, out
    for line in lines:
        assert line.split(":", 1)[1].strip().split(":")[-1].endswith(f"/job_{job_id}_0/step_0"), out
    cluster.run("gcancel", job_id)
    cluster.wait_done(job_id, timeout=60)
