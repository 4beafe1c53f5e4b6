"""Slurm's write-side command names (sbatch, srun, scontrol, scancel) on a real local cluster, called by those
names through ``garrison slurm-path`` on PATH, as a Slurm user's scripts call them: a batch script using srun
and ``scontrol show hostnames | head -n1`` under pipefail, --parsable, slurm-%j.out, scancel by id, name and
user, scontrol hold/release/update/show job, and PyTorch Lightning's self-requeue (``scontrol requeue
$SLURM_JOB_ID`` from a SIGUSR1 handler inside the job) giving a second attempt that completes."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.polling import wait_until

from .conftest import BIN, TERMINAL, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(["dgx-a100", "dgx1v"])
    slurm_dir = subprocess.run([str(BIN / "garrison"), "slurm-path"], capture_output=True, text=True,
                               check=True).stdout.strip()
    c.env["PATH"] = f"{slurm_dir}:{c.env['PATH']}"
    try:
        yield c
    finally:
        stop_cluster(c)


def slurm(cluster: Cluster, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A Slurm command by its bare name, found on PATH as a user's shell finds it."""
    proc = subprocess.run(list(args), capture_output=True, text=True, env=cluster.env, input=input,
                          cwd=str(cluster.work), timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def sbatch(cluster: Cluster, *args: str) -> str:
    return slurm(cluster, "sbatch", "--parsable", *args).stdout.strip()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_an_sbatch_script_runs_srun_and_scontrol_by_their_slurm_names(cluster: Cluster) -> None:
    script = write(cluster.work / "two-nodes.sh", (
        "#!/bin/bash\n"
        "#SBATCH -N 2\n"
        "#SBATCH --gpus-per-node=1\n"
        "#SBATCH -t 5:00\n"
        "set -euo pipefail\n"
        'first=$(scontrol show hostnames | head -n1)\n'
        'echo "first=$first all=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr "\\n" " ")"\n'
        "srun --ntasks-per-node 1 bash -c 'echo task $SLURM_PROCID on $SLURMD_NODENAME' | sort\n"
        "echo done\n"
    ))
    proc = slurm(cluster, "sbatch", str(script))
    assert proc.stdout.startswith("Submitted batch job "), proc.stdout
    job_id = proc.stdout.split()[-1]
    job = cluster.wait_done(job_id)
    out = (cluster.work / f"slurm-{job_id}.out").read_text()  # sbatch's default output, not garrison-%j.out
    assert job["state"] == "COMPLETED", (job, out)
    nodes = job["nodes"]
    assert out.splitlines() == [
        f"first={nodes[0]} all={' '.join(nodes)} ",
        f"task 0 on {nodes[0]}",
        f"task 1 on {nodes[1]}",
        "done",
    ], out


def test_srun_multi_prog_runs_each_tasks_own_program(cluster: Cluster) -> None:
    (cluster.work / "mp.conf").write_text(
        "# rank 0 coordinates, the others work\n"
        "0    echo coordinator %t\n"
        "1-3  bash -c 'echo worker %t offset %o on $SLURMD_NODENAME; exit %o'\n"
    )
    script = write(cluster.work / "multi-prog.sh", (
        "#!/bin/bash\n"
        "#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-node=1\n"
        "srun -l --multi-prog mp.conf | sort\n"
        'echo "srun exit ${PIPESTATUS[0]}"\n'
    ))
    job_id = sbatch(cluster, str(script))
    job = cluster.wait_done(job_id)
    out = (cluster.work / f"slurm-{job_id}.out").read_text()
    nodes = job["nodes"]
    assert out.splitlines() == [
        # srun's own lines for the failed tasks, on its stderr before it exits (so before sort prints)
        f"srun: error: {nodes[1]}: task 2: Exited with exit code 1",
        f"srun: error: {nodes[1]}: task 3: Exited with exit code 2",
        "0: coordinator 0",
        f"1: worker 1 offset 0 on {nodes[0]}",
        f"2: worker 2 offset 1 on {nodes[1]}",
        f"3: worker 3 offset 2 on {nodes[1]}",
        "srun exit 2",  # each task's program is its own process: its exit code is the task's (srun's: the largest)
    ], out


def test_parsable_wrap_and_array_outputs(cluster: Cluster) -> None:
    job_id = sbatch(cluster, "-a", "1-2", "-o", "/dev/null", "--wrap", "true")
    assert job_id.isdigit(), job_id  # the id alone: no "Submitted", no ";cluster"
    array_id = sbatch(cluster, "-a", "1-2", "--wrap", "echo task $SLURM_ARRAY_TASK_ID")
    wait_until(lambda: all(j["state"] in TERMINAL for j in cluster.jobs(array_id)) and cluster.jobs(array_id),
               60, what="the array's tasks to end")
    for task in (1, 2):
        assert (cluster.work / f"slurm-{array_id}_{task}.out").read_text() == f"task {task}\n"
    stdin_job = slurm(cluster, "sbatch", "--parsable", "-o", "/dev/null",
                      input="#!/bin/sh\n#SBATCH -t 1:00\ntrue\n").stdout.strip()
    assert cluster.job(stdin_job)["name"] == "sbatch"
    quiet = slurm(cluster, "sbatch", "-Q", "--mail-type=END", "-o", "/dev/null", "--wrap", "true")
    assert (quiet.stdout, quiet.stderr) == ("", "")  # sbatch -Q: only errors


def test_a_script_killed_by_a_signal_is_told_from_one_that_exited_128_plus_n(cluster: Cluster) -> None:
    """As Slurm 22.05 shows them (checked on ../shared/slurm-anchor): a batch script that died of SIGKILL is
    FAILED with ExitCode=0:9, one that ran `exit 137` is FAILED with 137:0, and sbatch --wait exits 1 for the
    first and 137 for the second."""
    killed = sbatch(cluster, "-o", "/dev/null", "--wrap", "kill -9 $$")
    exited = sbatch(cluster, "-o", "/dev/null", "--wrap", "exit 137")
    for job_id, code in ((killed, "0:9"), (exited, "137:0")):
        assert cluster.wait_done(job_id)["state"] == "FAILED"
        assert f"ExitCode={code}" in slurm(cluster, "scontrol", "show", "job", job_id).stdout
        lines = slurm(cluster, "sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode").stdout.split()
        assert lines == [f"{job_id}|FAILED|{code}", f"{job_id}.batch|FAILED|{code}"]
    assert cluster.job(killed)["exit_code"] == -9
    detail = cluster.run("gjob", killed).stdout
    assert "ExitCode=-9(SIGKILL)" in detail and "rank 0 was killed by signal 9 (Killed)" in detail
    assert "rank 0 exited with 137" in cluster.run("gjob", exited).stdout
    waited = slurm(cluster, "sbatch", "--wait", "-o", "/dev/null", "--wrap", "kill -SEGV $$", check=False)
    assert waited.returncode == 1, waited.stderr
    waited = slurm(cluster, "sbatch", "--wait", "-o", "/dev/null", "--wrap", "exit 137", check=False)
    assert waited.returncode == 137, waited.stderr


def test_unknown_options_are_refused_and_queue_nothing(cluster: Cluster) -> None:
    before = {j["job_id"] for j in cluster.jobs()}
    for command in (["sbatch", "--frobnicate", "--wrap", "true"], ["scancel", "--frobnicate", "1"],
                    ["scontrol", "--frobnicate", "show", "job"], ["srun", "--frobnicate", "true"],
                    ["salloc", "--frobnicate", "true"]):
        proc = slurm(cluster, *command, check=False)
        assert proc.returncode != 0 and "--frobnicate" in proc.stderr, (command, proc.stderr)
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert {j["job_id"] for j in cluster.jobs()} == before


@pytest.mark.parametrize("transport", ["local", "grpc"])
def test_a_refused_submission_exits_1_under_slurms_names(cluster: Cluster, transport: str) -> None:
    """The controller refuses the job (an unknown partition, more GPUs than any node has): sbatch, srun and
    salloc say why in one line and exit 1, as Slurm's do for a failed submission or allocation (srun: "Unable
    to allocate resources", salloc: "Job submit/allocate failed"); Garrison's own names exit 2."""
    env = dict(cluster.env, GARRISON_TRANSPORT="grpc") if transport == "grpc" else cluster.env
    before = {j["job_id"] for j in cluster.jobs()}
    for options in (["-p", "nosuch"], ["--gres=gpu:99"]):
        for command, code, tail in (("sbatch", 1, ["--wrap", "true"]), ("gsub", 2, ["--wrap", "true"]),
                                    ("srun", 1, ["true"]), ("gsrun", 2, ["true"]),
                                    ("salloc", 1, ["true"]), ("galloc", 2, ["true"])):
            proc = subprocess.run([command, *options, *tail], capture_output=True, text=True, env=env,
                                  cwd=str(cluster.work), timeout=120, stdin=subprocess.DEVNULL)
            assert proc.returncode == code and proc.stderr.count("\n") == 1, (command, options, proc.stderr)
    assert {j["job_id"] for j in cluster.jobs()} == before


def test_scancel_by_id_name_and_user(cluster: Cluster) -> None:
    held = ["-H", "-o", "/dev/null", "--wrap", "sleep 600"]
    by_id = sbatch(cluster, "-J", "sc-id", *held)
    by_name = [sbatch(cluster, "-J", "sc-name", *held) for _ in range(2)]
    by_user = sbatch(cluster, "-J", "sc-user", *held)
    slurm(cluster, "scancel", by_id)
    assert cluster.job(by_id)["state"] == "CANCELLED"
    assert {cluster.job(j)["state"] for j in by_name + [by_user]} == {"PENDING"}
    slurm(cluster, "scancel", "-n", "sc-name")
    assert {cluster.job(j)["state"] for j in by_name} == {"CANCELLED"}
    assert cluster.job(by_user)["state"] == "PENDING"
    # -u takes a numeric uid too, as Slurm's commands do (cmmid/SA2UK's submitter ends with `squeue -u $UID`)
    uid = str(os.getuid())
    assert slurm(cluster, "squeue", "-u", uid, "-n", "sc-user", "-h", "-o", "%i %j").stdout.split() == [by_user, "sc-user"]
    assert by_user in slurm(cluster, "sacct", "-u", uid, "-n", "-X", "-o", "JobID").stdout.split()
    slurm(cluster, "scancel", "-u", uid, "-t", "PENDING", "-n", "sc-user")
    assert cluster.job(by_user)["state"] == "CANCELLED"
    # A running job: --signal signals without cancelling; the job ends of it with its own status.
    running = sbatch(cluster, "-o", "/dev/null", "--wrap", "trap 'exit 7' USR1; while true; do sleep 0.1; done")
    cluster.wait_state(running, {"RUNNING"})
    slurm(cluster, "scancel", "-s", "USR1", running)
    job = cluster.wait_done(running)
    assert (job["state"], job["exit_code"]) == ("FAILED", 7), job


def test_scontrol_hold_release_update_and_show_job(cluster: Cluster) -> None:
    job_id = sbatch(cluster, "-J", "ctl", "-t", "10:00", "-b", "now+1hour", "-o", "/dev/null", "--wrap", "true")
    slurm(cluster, "scontrol", "hold", job_id)
    # The reason is the scheduler's: BeginTime until its next cycle looks at the held job.
    wait_until(lambda: "Held" in cluster.job(job_id)["reason"], 30, what="the job's reason to say it is held")
    record = slurm(cluster, "scontrol", "show", "job", job_id).stdout
    assert record.startswith(f"JobId={job_id} JobName=ctl\n   UserId={getpass.getuser()}("), record
    assert "JobState=PENDING" in record and "TimeLimit=00:10:00" in record, record
    assert f"StdOut={Path('/dev/null')}" in record and f"WorkDir={cluster.work}" in record, record
    held_reason = next(w for w in record.split() if w.startswith("Reason="))
    assert held_reason == "Reason=JobHeldUser", record
    assert slurm(cluster, "squeue", "-h", "-j", job_id, "-o", "%r %R").stdout.split() == ["JobHeldUser", "(JobHeldUser)"]  # Slurm's word for a job its owner holds
    slurm(cluster, "scontrol", "release", job_id)
    assert "Held" not in cluster.job(job_id)["reason"]
    slurm(cluster, "scontrol", "update", f"JobId={job_id}", "TimeLimit=5:00")
    oneline = slurm(cluster, "scontrol", "-o", "show", "job", job_id).stdout
    assert oneline.count("\n") == 1 and "TimeLimit=00:05:00" in oneline and f"JobId={job_id} " in oneline
    slurm(cluster, "scontrol", "update", f"jobid={job_id}", "timelimit=-1:00")
    assert cluster.job(job_id)["time_limit_s"] == 4 * 60
    refused = slurm(cluster, "scontrol", "update", f"JobId={job_id}", "Frobnicate=1", check=False)
    assert refused.returncode == 1 and "Frobnicate" in refused.stderr
    slurm(cluster, "scancel", job_id)
    assert "JobState=CANCELLED" in slurm(cluster, "scontrol", "show", "job", job_id).stdout


def test_scontrol_update_dependency_name_and_comment_of_a_pending_job(cluster: Cluster) -> None:
    # A pipeline chaining a job after the fact: `scontrol update JobId=B Dependency=afterok:A`.
    first = sbatch(cluster, "-H", "-t", "5:00", "-o", "/dev/null", "--wrap", "true")
    second = sbatch(cluster, "-H", "-t", "5:00", "-o", "/dev/null", "--wrap", "true")
    slurm(cluster, "scontrol", "update", f"JobId={second}", f"Dependency=afterok:{first}", "JobName=chained",
          "Comment=after the first")
    slurm(cluster, "scontrol", "release", second)
    wait_until(lambda: cluster.job(second)["reason"] == "Dependency", 30, what="the second to wait on the first")
    record = slurm(cluster, "scontrol", "show", "job", second).stdout
    assert f"Dependency=afterok:{first}" in record and "JobName=chained" in record, record
    assert "Comment=after the first" in record, record
    bad = slurm(cluster, "scontrol", "update", f"JobId={second}", "Dependency=afterok:99999999", check=False)
    assert bad.returncode == 1 and "no such job" in bad.stderr, bad.stderr
    slurm(cluster, "scontrol", "release", first)
    assert cluster.wait_done(first)["state"] == "COMPLETED"
    assert cluster.wait_done(second)["state"] == "COMPLETED"


def test_scontrol_details_and_write_batch_script_from_inside_the_job(cluster: Cluster) -> None:
    # The idioms: `scontrol show jobid -dd $SLURM_JOB_ID | grep GRES` for the job's GPU indices, and `scontrol
    # write batch_script $SLURM_JOB_ID -` to keep the script beside the run's output.
    script = write(cluster.work / "details.sh", (
        "#!/bin/bash\n"
        "#SBATCH --gres=gpu:2 -c 2 -t 5:00\n"
        "scontrol show jobid -dd $SLURM_JOB_ID | grep -o 'GRES=gpu:2(IDX:[0-9,-]*)'\n"
        "scontrol write batch_script $SLURM_JOB_ID - | head -n 2 | tail -n 1\n"
        "scontrol write batch_script $SLURM_JOB_ID saved.sh && cmp saved.sh $0 && echo same\n"
    ))
    job_id = sbatch(cluster, "-o", "details-%j.out", str(script))
    job = cluster.wait_done(job_id)
    out = (cluster.work / f"details-{job_id}.out").read_text()
    assert job["state"] == "COMPLETED", (job, out)
    lines = out.splitlines()
    assert lines[0].startswith("GRES=gpu:2(IDX:") and lines[1:] == [
        "#SBATCH --gres=gpu:2 -c 2 -t 5:00", f"batch script for job {job_id} written to saved.sh", "same"], out


SELF_REQUEUE = """#!{python}
#SBATCH -J self-requeue
#SBATCH -t 1:00
#SBATCH --signal=SIGUSR1@55
#SBATCH -o requeue-{tag}.out
# PyTorch Lightning's SLURMEnvironment, as it does it: on SIGUSR1 run `scontrol requeue $SLURM_JOB_ID` and
# check its exit status; SIGTERM (the requeue's) is only noted.
import os, signal, subprocess, sys, time
marker = "requeue-{tag}.first"
if os.path.exists(marker):
    print("second attempt", flush=True)
    sys.exit(0)
open(marker, "w").close()
signal.signal(signal.SIGTERM, lambda *_: None)

def on_usr1(signum, frame):
    array_job_id = os.getenv("SLURM_ARRAY_JOB_ID")  # Lightning's way of naming the job
    if array_job_id is not None:
        job_id = f"{{array_job_id}}_{{os.environ['SLURM_ARRAY_TASK_ID']}}"
    else:
        job_id = os.environ["SLURM_JOB_ID"]
    code = subprocess.call(["scontrol", "requeue", job_id])
    with open("requeue-{tag}.rc", "w") as rc:
        rc.write(str(code))
    print("requeue exit", code, flush=True)

signal.signal(signal.SIGUSR1, on_usr1)
print("first attempt", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("how", ["plain", "array", "srun"])
def test_scontrol_requeue_from_inside_the_job_runs_it_again(cluster: Cluster, how: str) -> None:
    """As the batch script itself (plain, and an array task), and as Lightning's recipe has it: the batch
    script runs `srun python train.py`, and the step's task gets the signal and requeues the job."""
    tag, array = how, how == "array"
    script = write(cluster.work / f"self-requeue-{tag}.py", SELF_REQUEUE.format(python=sys.executable, tag=tag))
    if how == "srun":
        script = write(cluster.work / "self-requeue-srun.sh", (
            "#!/bin/bash\n#SBATCH -J self-requeue\n#SBATCH -t 1:00\n#SBATCH --signal=SIGUSR1@55\n"
            f"#SBATCH -o requeue-{tag}.out\nsrun {script}\n"))
    job_id = sbatch(cluster, *(["-a", "4"] if array else []), str(script))
    if array:
        job_id = f"{job_id}_4"
    job = cluster.wait_done(job_id, timeout=90)
    out = (cluster.work / f"requeue-{tag}.out").read_text()
    rc = cluster.work / f"requeue-{tag}.rc"
    assert rc.exists() and rc.read_text() == "0", (job, out)
    assert job["state"] == "COMPLETED" and job["restart_count"] >= 1, (job, out)
    assert "first attempt" in out and "second attempt" in out, out
    attempts = slurm(cluster, "scontrol", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in attempts and "Restarts=1" in attempts, attempts


def test_a_job_signal_reaches_an_srun_steps_tasks_once(cluster: Cluster) -> None:
    """`scancel -s USR1 JOB` reaches the step's task from the agent; srun in the batch script, which gets the
    job's signals too, must not forward it a second time. USR2 afterwards ends the task: by then a second
    USR1 would have come before it."""
    marks = cluster.work / "once-marks"
    script = write(cluster.work / "once.sh", (
        "#!/bin/bash\n"
        "#SBATCH -G 1\n"
        "#SBATCH -t 5:00\n"
        "#SBATCH -o /dev/null\n"
        "trap '' USR1 USR2\n"  # the batch shell lives on
        f"srun bash -c 'trap \"echo usr1 >> {marks}\" USR1; trap \"echo usr2 >> {marks}; exit 0\" USR2; "
        f"echo ready >> {marks}; while :; do sleep 0.1; done'\n"
    ))
    job_id = sbatch(cluster, str(script))
    wait_until(lambda: marks.exists() and "ready" in marks.read_text(), 60, what="the step's task to start")
    slurm(cluster, "scancel", "-s", "USR1", job_id)
    wait_until(lambda: "usr1" in marks.read_text(), 30, what="the task to get USR1")
    slurm(cluster, "scancel", "-s", "USR2", job_id)
    job = cluster.wait_done(job_id)
    assert marks.read_text().splitlines() == ["ready", "usr1", "usr2"], marks.read_text()
    assert job["state"] == "COMPLETED", job


def test_salloc_runs_its_command_with_srun_on_its_path(cluster: Cluster) -> None:
    """salloc's command runs here, with Slurm's names first on PATH even when the caller's PATH lacks them:
    its `srun` runs a step in the allocation."""
    env = dict(cluster.env)
    env["PATH"] = ":".join(entry for entry in env["PATH"].split(":") if "garrison-slurm" not in entry)
    proc = subprocess.run(
        [str(BIN / "garrison-salloc"), "-N", "2", "--gpus-per-node", "1", "-t", "2:00", "bash", "-c",
         'echo "srun=$(basename "$(command -v srun)")"; srun --ntasks-per-node 1 bash -c "echo \\$SLURMD_NODENAME" | sort'],
        capture_output=True, text=True, env=env, cwd=str(cluster.work), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("salloc: Pending job allocation "), proc.stderr
    assert lines[-1].startswith("salloc: Relinquishing job allocation "), proc.stderr
    job = cluster.job(lines[0].rsplit(" ", 1)[1])
    assert proc.stdout.splitlines() == ["srun=srun", *sorted(job["nodes"])], proc.stdout
    assert job["state"] == "COMPLETED", job


def test_scontrol_show_node_and_partition(cluster: Cluster) -> None:
    nodes = slurm(cluster, "scontrol", "show", "node").stdout
    names = [line.split()[0].removeprefix("NodeName=") for line in nodes.splitlines() if line.startswith("NodeName=")]
    assert len(names) == 2, nodes
    one = slurm(cluster, "scontrol", "-o", "show", "node", names[0]).stdout
    assert one.startswith(f"NodeName={names[0]} ") and one.count("\n") == 1 and " Gres=gpu:" in one, one
    partitions = slurm(cluster, "scontrol", "-o", "show", "partition").stdout
    assert partitions.startswith("PartitionName=") and "Default=YES" in partitions, partitions
    missing = slurm(cluster, "scontrol", "show", "node", "nosuchnode", check=False)
    assert missing.returncode == 1 and "nosuchnode not found" in missing.stderr


def test_srun_outside_a_job_gets_an_allocation_runs_and_gives_it_back(cluster: Cluster) -> None:
    env = {name: value for name, value in cluster.env.items() if not name.startswith(("SLURM_", "GARRISON_JOB"))}
    proc = subprocess.run(["srun", "-N", "2", "--gpus-per-node", "1", "-t", "1:00", "-l", "bash", "-c", "echo hi"],
                          capture_output=True, text=True, env=env, cwd=str(cluster.work), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["0: hi", "1: hi"], proc.stdout
    assert all(line.startswith("srun: ") for line in proc.stderr.splitlines()), proc.stderr


def test_sprio_by_its_name_prices_the_pending_jobs(cluster: Cluster) -> None:
    job_id = sbatch(cluster, "-H", "-t", "5:00", "-o", "/dev/null", "--wrap", "true")
    wait_until(lambda: slurm(cluster, "sprio", "-h", "-j", job_id, "-o", "%i %Y").stdout.split()[1:] != ["N/A"],
               30, what="a cycle to price the held job")
    row = slurm(cluster, "sprio", "-h", "-j", job_id, "-o", "%i %u %Y").stdout.split()
    assert row[0] == job_id and row[1] == getpass.getuser() and int(row[2]) >= 0, row
    weights = slurm(cluster, "sprio", "-w").stdout.splitlines()
    assert weights[0].split()[:3] == ["JOBID", "PARTITION", "PRIORITY"] and weights[1].split()[0] == "Weights"
    slurm(cluster, "scancel", job_id)


def test_scontrol_update_array_task_throttle_lets_more_tasks_run(cluster: Cluster) -> None:
    array = sbatch(cluster, "--array=0-3%1", "-t", "5:00", "-o", "/dev/null", "--wrap", "sleep 300")

    def running() -> int:
        return sum(1 for job in cluster.jobs() if str(job.get("array_job_id")) == array and job["state"] == "RUNNING")

    wait_until(lambda: running() == 1, 30, what="one task of the %1 array to run")
    slurm(cluster, "scontrol", "update", f"JobId={array}", "ArrayTaskThrottle=3")
    wait_until(lambda: running() == 3, 30, what="three tasks to run under the new limit")
    slurm(cluster, "scontrol", "update", f"JobId={array}", "ArrayTaskThrottle=0")
    wait_until(lambda: running() == 4, 30, what="every task to run without a limit")
    slurm(cluster, "scancel", array)
