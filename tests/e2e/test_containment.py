"""Jobs contained by the kernel (issue 18), end to end: real agents put every attempt in its own cgroup v1
directories, and gsub, gcancel, gjob and gacct see the consequences.

Needs root and writable cgroup v1 controllers (as in CI); each local cluster has its own cgroup subtree
(`garrison up` gives every node one), removed again by `garrison down`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.nodeagent.containment.cgroup_v1 import CgroupV1
from garrison.nodeagent.containment.interface import ENFORCING

from .conftest import PREEMPTION_CONFIG, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow
PYTHON = "/usr/bin/python3"


def _contained_host() -> bool:
    probe = CgroupV1.probe(f"garrison-test-probe-{os.getpid()}")
    from garrison.nodeagent.containment.cgroup_v1 import remove_subtree

    remove_subtree(probe.cgroup_root)
    return set(probe.capabilities.enforced) == set(ENFORCING)


if os.geteuid() != 0 or not _contained_host():
    pytest.skip("needs root and writable cgroup v1 controllers", allow_module_level=True)


@pytest.fixture(scope="module")
def node() -> Iterator[Cluster]:
    """One DGX A100 node (its CPUs are this host's) with preemption's QoS, for the whole module."""
    c = start_cluster(["dgx-a100"], ["--agents", "1", "--extra-config", str(PREEMPTION_CONFIG)])
    try:
        yield c
    finally:
        stop_cluster(c)


def process_is_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def daemon_script(pid_file: Path, then: str) -> str:
    """A batch script that leaves a daemon behind the way users do: setsid, a double fork, nohup."""
    return (
        "#!/bin/bash\n"
        f"(setsid bash -c 'echo $$ > {pid_file}; exec nohup sleep 600 >/dev/null 2>&1' &)\n"
        f"while [ ! -s {pid_file} ]; do sleep 0.01; done\n"
        f"{then}\n"
    )


def test_the_agent_says_what_it_enforces_and_ginfo_does_not_call_it_unconfined(node: Cluster) -> None:
    log = (node.state_dir / "agent-1.log").read_text()
    assert "containment cgroup-v1: memory,cpuset,devices,pids,freezer" in log, log[-2000:]
    assert "unconfined" not in node.run("ginfo").stdout


@pytest.mark.parametrize("ending", ["completes", "gcancel", "time limit", "preemption"])
def test_a_jobs_daemons_do_not_outlive_it(node: Cluster, ending: str) -> None:
    pid_file = node.work / f"daemon-{ending.replace(' ', '-')}.pid"
    then = "exit 0" if ending == "completes" else "sleep 600"
    script = node.work / f"daemon-{ending.replace(' ', '-')}.sh"
    script.write_text(daemon_script(pid_file, then))
    options = ["-t", "0:04"] if ending == "time limit" else []
    if ending == "preemption":
        options = ["-q", "low", "-N", "1", "--gpus-per-node", "8"]
    job_id = node.submit(*options, "-o", f"{script.name}-%j.out", str(script))
    daemon = int(wait_until(lambda: pid_file.read_text().strip() if pid_file.exists() and pid_file.read_text().strip()
                            else None, 60, what="the daemon to start"))
    expected = {"completes": "COMPLETED", "gcancel": "CANCELLED", "time limit": "TIMEOUT"}.get(ending)
    if ending == "gcancel":
        node.run("gcancel", job_id)
    elif ending == "preemption":
        urgent = node.submit("-q", "urgent", "-N", "1", "--gpus-per-node", "8", "--wrap", "true")
        assert node.wait_done(urgent, timeout=120)["state"] == "COMPLETED"
        # The preempted job is requeued under its id; what its first attempt left must be gone already.
        assert process_is_gone(daemon)
        node.run("gcancel", job_id)
        node.wait_done(job_id, timeout=120)
        return
    job = node.wait_done(job_id, timeout=120)
    assert job["state"] == expected, job
    assert process_is_gone(daemon), f"the {ending} job's daemon {daemon} is still running"


def test_a_script_that_exits_without_waiting_for_its_background_work_ends_as_in_slurm(node: Cluster) -> None:
    """`monitor &` at the top of a script, never waited for: the job ends when the script does (COMPLETED,
    with the script's exit code), and the monitor is killed, as Slurm kills what a batch script leaves."""
    pid_file = node.work / "background-monitor.pid"
    job_id = node.submit("-t", "5:00", "-o", "background-%j.out", "--wrap",
                         f"sleep 600 & echo $! > {pid_file}; echo started")
    job = node.wait_done(job_id, timeout=60)
    assert job["state"] == "COMPLETED", job
    assert process_is_gone(int(pid_file.read_text()))


def test_a_job_past_its_memory_ends_out_of_memory_and_its_neighbour_completes(node: Cluster) -> None:
    hog = node.submit("--mem=100M", "-o", "hog-%j.out", "--wrap",
                      f"{PYTHON} -c 'x = bytearray(600 << 20); print(len(x))'")
    neighbour = node.submit("--mem=300M", "-o", "neighbour-%j.out", "--wrap",
                            f"{PYTHON} -c 'x = bytearray(150 << 20); print(\"fine\", len(x))'")
    hog_job = node.wait_done(hog, timeout=120)
    assert hog_job["state"] == "OUT_OF_MEMORY", hog_job
    detail = node.run("gjob", hog).stdout
    assert "out of memory" in detail, detail
    assert "oom_kill event" in (node.work / f"hog-{hog}.out").read_text()
    assert node.wait_done(neighbour, timeout=120)["state"] == "COMPLETED"
    assert (node.work / f"neighbour-{neighbour}.out").read_text().startswith("fine")
    state = node.run("gacct", "-j", hog, "-X", "-o", "JobID,State").stdout
    assert "OUT_OF_MEMORY" in state, state


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_job_cannot_widen_its_cpus(node: Cluster) -> None:
    probe = node.work / "affinity.py"
    probe.write_text(
        "import os\n"
        "mine = sorted(os.sched_getaffinity(0))\n"
        "try:\n"
        "    os.sched_setaffinity(0, set(range(os.cpu_count())))\n"
        "    widened = sorted(os.sched_getaffinity(0))\n"
        "except OSError as error:\n"
        "    widened = error.errno\n"
        "print(mine, widened)\n"
    )
    job_id = node.submit("-c", "1", "-o", "affinity-%j.out", "--wrap", f"{PYTHON} {probe}")
    assert node.wait_done(job_id, timeout=120)["state"] == "COMPLETED"
    mine, widened = (node.work / f"affinity-{job_id}.out").read_text().split("]", 1)
    assert len(json.loads(mine + "]")) == 1
    # sched_setaffinity keeps to the cpuset: asking for every CPU leaves the job its one.
    assert widened.strip() == mine + "]", widened


def test_a_job_opens_its_gpus_and_other_devices_but_not_the_nodes_other_gpus(node: Cluster) -> None:
    """The node's eight GPUs as device files (major 195, NVML's minors; no driver behind them, so an allowed
    open fails with ENXIO): a two-GPU job opens its two, gets EPERM for the other six, and opens a device that
    is not a GPU (an InfiniBand verbs node, as NCCL opens across nodes), as under Slurm's ConstrainDevices."""
    devices = node.work / "dev"
    devices.mkdir(exist_ok=True)
    names = [f"nvidia{minor}" for minor in range(8)] + ["uverbs0"]
    for name, number in zip(names, [*(os.makedev(195, m) for m in range(8)), os.makedev(231, 192)], strict=True):
        if not (devices / name).exists():
            os.mknod(devices / name, 0o666 | 0o020000, number)
    probe = node.work / "devices.py"
    probe.write_text(
        "import errno, os, sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n        os.close(os.open(path, os.O_RDWR)); print(os.path.basename(path), 'opened')\n"
        "    except OSError as e:\n        print(os.path.basename(path), errno.errorcode[e.errno])\n"
        "print('gpus', os.environ['SLURM_JOB_GPUS'], os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    job_id = node.submit("-G", "2", "-o", "devices-%j.out", "--wrap",
                         f"{PYTHON} {probe} " + " ".join(str(devices / name) for name in names))
    assert node.wait_done(job_id, timeout=120)["state"] == "COMPLETED"
    lines = dict(line.split(" ", 1) for line in (node.work / f"devices-{job_id}.out").read_text().splitlines())
    job_gpus, cuda = lines.pop("gpus").split()
    given = {int(gpu) for gpu in job_gpus.split(",")}
    assert len(given) == 2 and cuda == "0,1"
    assert lines == {**{f"nvidia{m}": "ENXIO" if m in given else "EPERM" for m in range(8)}, "uverbs0": "ENXIO"}


def test_gacct_shows_peak_memory_and_cpu_time_within_ten_percent(node: Cluster) -> None:
    job = node.work / "use.py"
    job.write_text(
        "import resource, time\n"
        "block = bytearray(300 << 20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "end = time.process_time() + 2.0\n"
        "while time.process_time() < end: pass\n"
        "usage = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print(usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)\n"
    )
    job_id = node.submit("--mem=1G", "-c", "1", "-o", "use-%j.out", "--wrap", f"exec {PYTHON} {job}")
    assert node.wait_done(job_id, timeout=120)["state"] == "COMPLETED"
    rss, cpu = (node.work / f"use-{job_id}.out").read_text().split()
    (record,) = json.loads(node.run("gacct", "--json", "-j", job_id).stdout)["jobs"]
    usage = record["attempts"][-1]["usage"]
    assert usage is not None, record
    assert abs(usage["max_rss_bytes"] - int(rss)) <= 0.1 * int(rss), (usage, rss)
    assert abs(usage["total_cpu_s"] - float(cpu)) <= 0.1 * float(cpu), (usage, cpu)
    assert usage["cpu_efficiency_pct"] is not None and usage["gpu_utilization_pct"] is None  # fake NVML: none
    table = node.run("gacct", "-j", job_id, "-X", "-o", "JobID,MaxRSS,TotalCPU,CPUEff").stdout
    assert "M" in table.splitlines()[-1], table
    assert "MaxRSS=" in node.run("gjob", job_id).stdout


def test_gjob_shows_what_a_running_job_has_used_so_far(node: Cluster) -> None:
    job_id = node.submit("--mem=1G", "-o", "running-%j.out", "--wrap",
                         f"exec {PYTHON} -c 'import time; x = bytearray(200 << 20); x[::4096] = b\"1\" * len(x[::4096]); "
                         "time.sleep(600)'")
    node.wait_state(job_id, {"RUNNING"})

    def reported_rss() -> float | None:
        detail = node.run("gjob", job_id).stdout
        for word in detail.split():
            if word.startswith("MaxRSS=") and word.endswith("M"):
                value = float(word.removeprefix("MaxRSS=").removesuffix("M"))
                return value if value >= 200 else None
        return None

    # The agent reports with its heartbeats (every 5 s here): sstat's role, while the job runs.
    assert 200 <= wait_until(reported_rss, 60, what="gjob to show the running job's MaxRSS") < 260
    node.run("gcancel", job_id)
    assert node.wait_done(job_id, timeout=120)["state"] == "CANCELLED"


def test_an_agent_crash_leaves_a_running_job_and_its_cgroup_alone(node: Cluster) -> None:
    import signal

    pid_file = node.work / "daemon-agent-crash.pid"
    script = node.work / "daemon-agent-crash.sh"
    script.write_text(daemon_script(pid_file, "sleep 600"))
    job_id = node.submit("-o", "agent-crash-%j.out", str(script))
    node.wait_state(job_id, {"RUNNING"})
    daemon = int(wait_until(lambda: pid_file.read_text().strip() if pid_file.exists() and pid_file.read_text().strip()
                            else None, 60, what="the daemon to start"))
    with open(f"/proc/{daemon}/cgroup") as own:
        (memory_path,) = [line.split(":", 2)[2] for line in own.read().splitlines() if ":memory:" in line]
    assert memory_path.endswith(f"/job_{job_id}_0"), memory_path
    log = node.state_dir / "agent-1.log"
    registered = log.read_text().count("registered with controller")
    agent = node.pid("agent-1")
    os.kill(agent, signal.SIGKILL)
    wait_until(lambda: process_is_gone(agent), 30, what="the agent to die")
    node.up()  # a new agent re-adopts the attempt through its job directory and its cgroup
    assert node.pid("agent-1") != agent
    wait_until(lambda: log.read_text().count("registered with controller") > registered, 60,
               what="the restarted agent to register")
    assert node.job(job_id)["state"] == "RUNNING"
    assert not process_is_gone(daemon)
    node.run("gcancel", job_id)
    assert node.wait_done(job_id, timeout=120)["state"] == "CANCELLED"
    assert process_is_gone(daemon)
