"""squeue, sinfo, sacct and sstat end to end: jobs submitted with gsub to one real local cluster (controller and
two agents), read back through the garrison-squeue/-sinfo/-sacct/-sstat console scripts and through Slurm's
own names on `garrison slurm-path`, including submitit's exact sacct call parsed as submitit parses it."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.polling import wait_until
from helpers.submitit_like import read_info_like_submitit

from .conftest import BIN, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@dataclass
class Jobs:
    running: str
    held: str
    completed: str
    failed: str
    array: str  # held: its tasks stay pending
    done_array: str
    stepped: str  # gsrun step 0 has completed, step 1 runs
    cancelled: str


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx1v"])
    try:
        yield c
    finally:
        stop_cluster(c)


@pytest.fixture(scope="module")
def jobs(cluster: Cluster) -> Jobs:
    running = cluster.submit("-J", "runner", "-G", "1", "--wrap", "sleep 600")
    held = cluster.submit("-J", "waiter", "-H", "-G", "1", "--wrap", "true")
    completed = cluster.submit("-J", "ok", "-G", "1", "--wrap", "true")
    failed = cluster.submit("-J", "bad", "-G", "1", "--wrap", "exit 3")
    array = cluster.submit("-J", "sweep", "-H", "-a", "0-3", "--wrap", "true")
    done_array = cluster.submit("-J", "pair", "-a", "0-1", "--wrap", "true")
    stepped = cluster.submit("-J", "steps", "-G", "1", "--wrap", "gsrun -n 2 true && gsrun -n 1 sleep 600")
    cancelled = cluster.submit("-J", "gone", "-H", "--wrap", "true")
    cluster.run("gcancel", cancelled)
    for job in (completed, failed, f"{done_array}_0", f"{done_array}_1", cancelled):
        cluster.wait_done(job)
    cluster.wait_state(running, {"RUNNING"})
    wait_until(lambda: f"{stepped}.1|RUNNING" in sacct(cluster, "-j", stepped, "-o", "JobID,State", "-P").stdout,
               60, what=f"step {stepped}.1 to run")
    return Jobs(running, held, completed, failed, array, done_array, stepped, cancelled)


def run(cluster: Cluster, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.run(f"garrison-{name}", *args, check=check)


def sacct(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run(cluster, "sacct", *args)


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_squeue_default_columns_and_states(cluster: Cluster, jobs: Jobs) -> None:
    out = run(cluster, "squeue").stdout.splitlines()
    assert out[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
    by_id = {line.split()[0]: line.split() for line in out[1:]}
    assert by_id[jobs.running][4] == "R" and re.fullmatch(r"node\d", by_id[jobs.running][7])
    assert by_id[jobs.held][4] == "PD" and by_id[jobs.held][7].startswith("(")
    assert by_id[f"{jobs.array}_[0-3]"][4] == "PD"  # the array's pending tasks on one line
    assert jobs.completed not in by_id  # squeue shows pending and running jobs by default
    # Also with -j, as Slurm 22.05's: a script waits for a job to leave the queue with `squeue -h -j ID`.
    assert run(cluster, "squeue", "-h", "-j", jobs.completed).stdout == ""
    assert run(cluster, "squeue", "-h", "-j", jobs.completed, "-t", "all", "-o", "%t").stdout == "CD\n"
    date, header, *_ = run(cluster, "squeue", "-l").stdout.splitlines()
    assert re.fullmatch(r"\w{3} \w{3} \d\d \d\d:\d\d:\d\d \d{4}", date)
    assert header.split() == ["JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "TIME_LIMI", "NODES",
                              "NODELIST(REASON)"]
    expanded = run(cluster, "squeue", "-r", "-h", "-j", jobs.array, "-o", "%i %t %K %F").stdout.splitlines()
    assert expanded == [f"{jobs.array}_{i} PD {i} {jobs.array}" for i in range(4)]


def test_squeue_formats_filters_and_steps(cluster: Cluster, jobs: Jobs) -> None:
    out = run(cluster, "squeue", "-t", "CD,F,CA", "-h", "-o", "%.6i|%-4j|%T|%t").stdout.splitlines()
    assert f"{jobs.completed:>6}|ok  |COMPLETED|CD" in out
    assert f"{jobs.failed:>6}|bad |FAILED|F" in out
    assert f"{jobs.cancelled:>6}|gone|CANCELLED|CA" in out
    assert run(cluster, "squeue", "-h", "-n", "runner", "-o", "%j %u %D").stdout.split() == [
        "runner", _user(), "1"]
    long = run(cluster, "squeue", "-O", "jobid:10,name:8,state:.10", "-j", jobs.running).stdout.splitlines()
    assert long == ["JOBID     NAME         STATE", f"{jobs.running:<10}runner     RUNNING"]
    steps = rows(run(cluster, "squeue", "-s", "-j", jobs.stepped).stdout)
    assert steps[0] == ["STEPID", "NAME", "PARTITION", "USER", "TIME", "NODELIST"]
    assert [r[0] for r in steps[1:]] == [f"{jobs.stepped}.batch", f"{jobs.stepped}.1"]
    start = rows(run(cluster, "squeue", "--start").stdout)
    assert start[0][5] == "START_TIME" and {r[4] for r in start[1:]} == {"PD"}
    assert {r[0] for r in start[1:]} == {jobs.held, f"{jobs.array}_[0-3]"}
    bad = run(cluster, "squeue", "--nonsense", check=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--nonsense" in bad.stderr  # as Slurm 22.05


def test_squeue_and_sinfo_json_have_slurms_records(cluster: Cluster, jobs: Jobs) -> None:
    """squeue --json and sinfo --json: Slurm 22.05's documents (OpenAPI v0.0.38), every key Slurm writes, in
    its order (checked against ../shared/slurm-anchor), with Slurm's units: epoch seconds, minutes, the raw
    wait status as exit_code; array tasks one by one; jobs that ended lately still listed."""
    import json

    document = json.loads(run(cluster, "squeue", "--json").stdout)
    assert document["meta"]["Slurm"]["release"] == "22.05.8" and document["errors"] == []
    by_id = {job["job_id"]: job for job in document["jobs"]}
    first = next(iter(by_id.values()))
    assert list(first)[:6] == ["account", "accrue_time", "admin_comment", "array_job_id", "array_task_id",
                               "array_max_tasks"]
    running = by_id[int(jobs.running)]
    assert running["job_state"] == "RUNNING" and running["name"] == "runner" and running["user_name"] == _user()
    assert running["nodes"] == running["batch_host"] and running["job_resources"]["allocated_hosts"] == 1
    assert running["gres_detail"] == [f"gpu:1(IDX:{running['gres_detail'][0].split('IDX:')[1]}"]
    assert running["time_limit"] == 60 and running["start_time"] > 0 and running["exit_code"] == 0
    record = cluster.run("garrison-scontrol", "show", "job", jobs.running).stdout
    assert f"StdOut={running['standard_output']}\n" in record and running["standard_output"].startswith("/")
    held = by_id[int(jobs.held)]
    assert held["job_state"] == "PENDING" and held["start_time"] == 0 and "job_resources" not in held
    tasks = sorted(job["array_task_id"] for job in document["jobs"] if job["array_job_id"] == int(jobs.array))
    assert tasks == [0, 1, 2, 3]
    failed = by_id[int(jobs.failed)]
    assert failed["job_state"] == "FAILED" and failed["exit_code"] == 3 << 8  # the wait status of exit 3
    only = json.loads(run(cluster, "squeue", "--json", "-t", "running").stdout)["jobs"]
    assert {job["job_state"] for job in only} == {"RUNNING"}
    nodes = json.loads(run(cluster, "sinfo", "--json").stdout)["nodes"]
    assert [(node["name"], node["gres"]) for node in nodes] == [("node1", "gpu:a100:8"), ("node2", "gpu:v100:8")]
    assert all(node["partitions"] == ["main"] and node["state"] in ("idle", "mixed", "allocated") for node in nodes)


def _user() -> str:
    import getpass

    return getpass.getuser()


def test_sinfo(cluster: Cluster, jobs: Jobs) -> None:
    out = run(cluster, "sinfo").stdout.splitlines()
    assert out[0] == "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
    assert all(line.split()[0] == "main*" and line.split()[1] == "up" for line in out[1:])
    assert sum(int(line.split()[3]) for line in out[1:]) == 2
    nodes = run(cluster, "sinfo", "-N", "-h", "-o", "%N %G %c").stdout.splitlines()
    assert [line.rsplit(" ", 1)[0] for line in nodes] == ["node1 gpu:a100:8", "node2 gpu:v100:8"]
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in nodes)
    partition, counts, names = run(cluster, "sinfo", "-s", "-h", "-o", "%P %F %N").stdout.split()
    allocated, idle, other, total = map(int, counts.split("/"))
    assert (partition, names, allocated + idle, other, total) == ("main*", "node[1-2]", 2, 0, 2)
    assert allocated >= 1  # the running jobs' node(s)
    bad = run(cluster, "sinfo", "--nonsense", check=False)
    assert bad.returncode == 1 and "--nonsense" in bad.stderr  # as Slurm 22.05


def test_sacct_lines_states_and_exit_codes(cluster: Cluster, jobs: Jobs) -> None:
    ids = ",".join([jobs.completed, jobs.failed, jobs.cancelled, jobs.stepped])
    out = sacct(cluster, "-j", ids, "-o", "JobID,JobName,State,ExitCode", "-P").stdout.splitlines()
    assert out[0] == "JobID|JobName|State|ExitCode"
    lines = set(out[1:])
    assert {f"{jobs.completed}|ok|COMPLETED|0:0", f"{jobs.completed}.batch|batch|COMPLETED|0:0",
            f"{jobs.failed}|bad|FAILED|3:0", f"{jobs.failed}.batch|batch|FAILED|3:0",
            f"{jobs.cancelled}|gone|CANCELLED by {os.getuid()}|0:0",
            f"{jobs.stepped}|steps|RUNNING|0:0", f"{jobs.stepped}.batch|batch|RUNNING|0:0",
            f"{jobs.stepped}.0|true|COMPLETED|0:0", f"{jobs.stepped}.1|sleep|RUNNING|0:0"} <= lines
    table = sacct(cluster, "-j", jobs.completed).stdout.splitlines()
    assert table[0] == "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode "
    assert table[1] == "------------ ---------- ---------- ---------- ---------- ---------- -------- "
    assert table[2].split()[:2] == [jobs.completed, "ok"] and table[2].split()[-2:] == ["COMPLETED", "0:0"]
    parsable = sacct(cluster, "-j", jobs.failed, "-X", "-n", "-p", "-o", "JobID,State,NodeList,Elapsed").stdout
    (only,) = parsable.splitlines()
    assert re.fullmatch(rf"{jobs.failed}\|FAILED\|node\d\|00:00:\d\d\|", only)
    brief = sacct(cluster, "-j", f"{jobs.stepped}.0", "-b", "-n").stdout.split()
    assert brief == [f"{jobs.stepped}.0", "COMPLETED", "0:0"]
    named = sacct(cluster, "--name", "bad", "-s", "F", "-X", "-n", "-o", "JobID").stdout.split()
    assert named == [jobs.failed]
    bad = run(cluster, "sacct", "--nonsense", check=False)
    assert bad.returncode == 1 and "--nonsense" in bad.stderr  # as Slurm 22.05


def test_submitits_sacct_call_under_slurms_name(cluster: Cluster, jobs: Jobs) -> None:
    slurm_dir = cluster.run("garrison", "slurm-path").stdout.strip()
    env = dict(cluster.env, PATH=f"{slurm_dir}:{cluster.env['PATH']}")
    # SlurmInfoWatcher._make_command: ["sacct", "-o", "JobID,State,NodeList", "--parsable2"] + ["-j", id] each.
    command = ["sacct", "-o", "JobID,State,NodeList", "--parsable2"]
    for job in (jobs.running, jobs.completed, jobs.failed, jobs.array, jobs.done_array, jobs.cancelled):
        command += ["-j", job]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(cluster.work), timeout=60,
                          check=True)
    info = read_info_like_submitit(proc.stdout)
    states = {job_id: stats["State"] for job_id, stats in info.items()}
    assert states == {
        jobs.running: "RUNNING", jobs.completed: "COMPLETED", jobs.failed: "FAILED",
        **{f"{jobs.array}_{i}": "PENDING" for i in range(4)},
        f"{jobs.done_array}_0": "COMPLETED", f"{jobs.done_array}_1": "COMPLETED",
        jobs.cancelled: f"CANCELLED by {os.getuid()}",
    }
    assert re.fullmatch(r"node\d", info[jobs.completed]["NodeList"])
    assert Path(slurm_dir, "squeue").exists() and Path(slurm_dir, "sstat").exists()


def test_sstat_running_steps(cluster: Cluster, jobs: Jobs) -> None:
    default = rows(run(cluster, "sstat", "-j", jobs.stepped, "-o", "JobID,NTasks").stdout)
    assert default == [["JobID", "NTasks"], ["------------", "--------"], [f"{jobs.stepped}.1", "1"]]
    every = run(cluster, "sstat", "-a", "-P", "-n", "-j", jobs.stepped, "-o", "JobID,NTasks,MaxRSS").stdout
    lines = every.splitlines()
    assert [line.split("|")[:2] for line in lines] == [[f"{jobs.stepped}.batch", "1"], [f"{jobs.stepped}.1", "1"]]
    assert lines[0].split("|")[2] == lines[1].split("|")[2]  # the job's figures, on each of its steps
    done = run(cluster, "sstat", "-j", jobs.completed, check=False)
    assert done.returncode == 1 and "not running" in done.stderr
    bad = run(cluster, "sstat", "--nonsense", "-j", jobs.stepped, check=False)
    assert bad.returncode == 1 and "--nonsense" in bad.stderr  # as Slurm 22.05


def test_console_scripts_exist() -> None:
    for name in ("squeue", "sinfo", "sacct", "sstat"):
        assert (BIN / f"garrison-{name}").exists()


def test_sacct_requeued_job_and_duplicates(cluster: Cluster, jobs: Jobs) -> None:
    job = cluster.submit("-J", "again", "--wrap", "sleep 600")
    cluster.wait_state(job, {"RUNNING"})
    cluster.run("gcontrol", "requeue", job)

    def runs() -> list[str] | None:
        out = sacct(cluster, "-j", job, "-D", "-X", "-n", "-P", "-o", "JobID,State").stdout.splitlines()
        return out if len(out) == 2 else None

    earlier, current = wait_until(runs, 60, what=f"job {job}'s second run in sacct -D")
    assert earlier == f"{job}|REQUEUED"
    assert current in (f"{job}|PENDING", f"{job}|RUNNING")
    assert sacct(cluster, "-j", job, "-X", "-n", "-P", "-o", "JobID").stdout.split() == [job]  # -D alone shows both
    cluster.run("gcancel", job)
