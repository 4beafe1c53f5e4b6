"""Slurm's write-side command names (cli/slurm/): sbatch's defaults over gsub's parser, scancel's and scontrol's
command lines, host names, Slurm's record formats, and the supervisor sparing srun from a job signal."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.polling import wait_until

from garrison.cli.slurm import sbatch, scancel, scontrol
from garrison.cmdline.submission import parse_submission, with_default_output
from garrison.nodeagent.supervisor.core import is_torchrun_agent
from garrison.protos.v1 import garrison_pb2 as pb


def test_sbatch_defaults_to_slurm_output_names(tmp_path: Path) -> None:
    plain = parse_submission(["--wrap", "true"], {}, str(tmp_path), prog="sbatch")
    array = parse_submission(["-a", "1-3", "--wrap", "true"], {}, str(tmp_path), prog="sbatch")
    named = parse_submission(["-o", "mine-%j.log", "--wrap", "true"], {}, str(tmp_path), prog="sbatch")
    defaults = (sbatch.DEFAULT_OUTPUT, sbatch.DEFAULT_ARRAY_OUTPUT)
    assert with_default_output(plain, *defaults).spec.output == "slurm-%j.out"
    assert with_default_output(array, *defaults).spec.output == "slurm-%A_%a.out"
    assert with_default_output(named, *defaults).spec.output == "mine-%j.log"
    assert with_default_output(plain, None, None).spec.output is None  # gsub: the agent's garrison-%j.out


def test_sbatch_names_a_script_on_stdin_after_itself(tmp_path: Path) -> None:
    script = b"#!/bin/sh\n#SBATCH -t 5\ntrue\n"
    assert parse_submission([], {}, str(tmp_path), stdin=lambda: script, prog="sbatch").spec.name == "sbatch"
    assert parse_submission([], {}, str(tmp_path), stdin=lambda: script).spec.name == "gsub"
    with pytest.raises(Exception, match="sbatch \\[OPTIONS\\] SCRIPT"):
        parse_submission([], {}, str(tmp_path), stdin=lambda: b"", prog="sbatch")


def test_scancel_command_line() -> None:
    args = scancel.parser().parse_args(["-u", "ann", "-n", "a,b", "-t", "PENDING", "-s", "USR1", "-q", "-v", "12_3",
                                        "13.1", "14"])
    assert (args.user, args.names, args.states, args.signal, args.quiet, args.verbose) == (
        "ann", ["a,b"], ["PENDING"], "USR1", True, 1)
    assert args.job_ids == ["12_3", "13.1", "14"]
    assert scancel.parser().parse_args(["--batch", "--signal=TERM", "5"]).batch
    assert scancel.states(["pd,R", "running"]) == ["PENDING", "RUNNING", "RUNNING"]
    with pytest.raises(Exception, match="unrecognized arguments: --frob"):
        scancel.parser().parse_args(["--frob", "1"])


@pytest.mark.parametrize(("nodelist", "names"), [
    ("node[1-3,5]", "node1\nnode2\nnode3\nnode5\n"),
    ("gpu[01-02],login", "gpu01\ngpu02\nlogin\n"),
    ("single", "single\n"),
])
def test_show_hostnames_expands_host_lists(nodelist: str, names: str) -> None:
    assert scontrol.hostnames_text(nodelist) == names


def test_show_hostnames_refuses_a_bad_list() -> None:
    with pytest.raises(scontrol.ScontrolError, match="invalid host list"):
        scontrol.hostnames_text("node[1-3")


def test_show_hostnames_under_pipefail_with_head_exits_zero(tmp_path: Path) -> None:
    """One write of many names into a pipe that `head -n1` closes: no error, exit 0, nothing on stderr."""
    command = (f"set -o pipefail; SLURM_JOB_NODELIST='n[1-9000]' {sys.executable} -m garrison.cli.slurm.scontrol "
               "show hostnames | head -n1")
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "n1\n", "")


def test_slurm_durations() -> None:
    assert scontrol.slurm_duration(0) == "UNLIMITED"
    assert scontrol.slurm_duration(59) == "00:00:59"
    assert scontrol.slurm_duration(3600 + 61) == "01:01:01"
    assert scontrol.slurm_duration(2 * 86400 + 5) == "2-00:00:05"


def test_update_parses_slurm_keys_case_insensitively() -> None:
    assert scontrol.parse_update(["jobid=12,13", "TimeLimit=1:00:00", "QOS=high"]) == (
        ["12", "13"], {"timelimit": "1:00:00", "qos": "high"})
    with pytest.raises(scontrol.ScontrolError, match="NumNodes cannot be changed"):
        scontrol.parse_update(["JobId=1", "NumNodes=3"])
    with pytest.raises(scontrol.ScontrolError, match="give JobId"):
        scontrol.parse_update(["TimeLimit=5"])
    with pytest.raises(scontrol.ScontrolError, match="nothing to change"):
        scontrol.parse_update(["JobId=5"])


def _job() -> pb.JobInfo:
    job = pb.JobInfo(
        job_id=42, display_id="42", name="train", user="ann", uid=1000, account="physics", partition="gpu",
        state="RUNNING", priority=1200, submit_time=1000.0, start_time=1010.0, now=1010.0 + 3725,
        time_limit_s=2 * 3600, gpus=8, nodes=2, node_list=["node1", "node2"], restart_count=1,
    )
    job.spec.workdir = "/home/ann/run"
    job.spec.output = "logs/%x-%j.out"
    job.spec.qos = "normal"
    job.spec.launch = "single"
    attempt = job.attempts.add(attempt=1, state="RUNNING", start_time=1010.0)
    attempt.allocation.add(node="node1", gpus=[0, 1, 2, 3], cpus=[0, 1, 2, 3], mem_mb=8192)
    attempt.allocation.add(node="node2", gpus=[0, 1, 2, 3], cpus=[0, 1, 2, 3], mem_mb=8192)
    return job


def test_show_job_record_in_slurm_form() -> None:
    record = scontrol.job_record(_job())
    lines = record.splitlines()
    assert lines[0] == "JobId=42 JobName=train"
    assert all(line.startswith("   ") for line in lines[1:])
    fields = dict(word.split("=", 1) for line in lines for word in line.split() if "=" in word)
    assert fields["UserId"] == "ann(1000)" and fields["Account"] == "physics" and fields["QOS"] == "normal"
    assert (fields["JobState"], fields["Reason"], fields["Restarts"], fields["ExitCode"]) == ("RUNNING", "None", "1", "0:0")
    assert (fields["RunTime"], fields["TimeLimit"]) == ("01:02:05", "02:00:00")
    assert (fields["NodeList"], fields["BatchHost"], fields["NumNodes"], fields["NumCPUs"]) == ("node[1-2]", "node1", "2", "8")
    assert fields["TRES"] == "cpu=8,mem=16G,node=2,gres/gpu=8"
    assert fields["WorkDir"] == "/home/ann/run"
    assert fields["StdOut"] == fields["StdErr"] == "/home/ann/run/logs/train-42.out"
    assert fields["SubmitTime"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1000.0))
    oneline = scontrol.job_record(_job(), oneliner=True)
    assert "\n" not in oneline and oneline.startswith("JobId=42 JobName=train UserId=ann(1000) ")


def test_show_job_counts_tasks_as_slurm_does() -> None:
    # Slurm 22.05: -n as given, else --ntasks-per-node on every node, else a task per node (skypilot's
    # `--nodes=2 --ntasks-per-node=1` and alpaca_baselines' `--nodes=2` show NumTasks=2; they showed 1 here).
    job = _job()
    def tasks() -> str:
        return dict(w.split("=", 1) for w in scontrol.job_record(job, oneliner=True).split() if "=" in w)["NumTasks"]
    assert tasks() == "2"
    job.spec.ntasks_per_node = 4
    assert tasks() == "8"
    job.spec.ntasks = 6
    assert tasks() == "6"


def test_show_job_details_give_each_nodes_cpus_memory_and_gpu_indices() -> None:
    # scontrol show job -d, which scripts grep for GRES=...(IDX:...): nodes holding alike share a line.
    job = _job()
    record = scontrol.job_record(job, details=True).splitlines()
    assert "   DerivedExitCode=0:0" in record
    at = record.index("   JOB_GRES=gpu:8")
    assert record[at - 1].startswith("   TRES=")
    assert record[at + 1] == "     Nodes=node[1-2] CPU_IDs=0-3 Mem=8192 GRES=gpu:4(IDX:0-3)"
    del job.attempts[0].allocation[1]
    job.attempts[0].allocation.add(node="node2", gpus=[4, 6], cpus=[8, 9, 10, 12], mem_mb=8192)
    job.spec.gpu_type = "a100"
    record = scontrol.job_record(job, details=True).splitlines()
    assert record[record.index("   JOB_GRES=gpu:a100:8") + 2] == \
        "     Nodes=node2 CPU_IDs=8-10,12 Mem=8192 GRES=gpu:a100:2(IDX:4,6)"
    oneline = scontrol.job_record(job, oneliner=True, details=True)
    assert " JOB_GRES=gpu:a100:8 Nodes=node1 CPU_IDs=0-3 " in oneline
    assert "JOB_GRES" not in scontrol.job_record(job)


@pytest.mark.parametrize(("argv", "words", "oneliner", "details"), [
    (["show", "jobid", "-dd", "12"], ["show", "jobid", "12"], False, True),
    (["-d", "show", "job", "12"], ["show", "job", "12"], False, True),
    (["show", "job", "-od", "12"], ["show", "job", "12"], True, True),
    (["--details", "--oneliner", "show", "job"], ["show", "job"], True, True),
    (["write", "batch_script", "12", "-"], ["write", "batch_script", "12", "-"], False, False),
])
def test_options_go_anywhere_and_bundle_as_getopt_reads_them(argv: list[str], words: list[str], oneliner: bool,
                                                             details: bool) -> None:
    got, flags = scontrol.parse_command_line(argv)
    assert (got, flags.oneliner, flags.details) == (words, oneliner, details)
    with pytest.raises(scontrol.ScontrolError, match="unrecognized option '-x'"):
        scontrol.parse_command_line(["show", "job", "-x"])


def test_show_job_exit_code_as_code_and_signal() -> None:
    job = _job()
    job.state, job.exit_code = "FAILED", 3
    assert " ExitCode=3:0" in scontrol.job_record(job)
    # A batch script that exited 137 itself (its last command was killed) is 137:0, as sacct and Slurm show it;
    # a job stopped from outside whose process died of the signal is 0:N.
    job.exit_code = 128 + 9
    assert " ExitCode=137:0" in scontrol.job_record(job)
    job.state, job.exit_code = "CANCELLED", 128 + 15
    assert " ExitCode=0:15" in scontrol.job_record(job)


def test_show_node_and_partition_records() -> None:
    node = pb.NodeInfo(name="node1", state="UP", allocated_gpus=[0, 1], allocated_cpus=16, allocated_memory_mb=1024,
                       partitions=["gpu"])
    node.inventory.cpus, node.inventory.memory_mb = 64, 512000
    for index in range(8):
        node.inventory.gpus.add(index=index, name="NVIDIA A100-SXM4-80GB")
    record = scontrol.node_record(node)
    assert record.startswith("NodeName=node1 ")
    assert "CPUAlloc=16 CPUTot=64" in record and "Gres=gpu:NVIDIA_A100-SXM4-80GB:8" in record
    assert "State=MIXED" in record and "Partitions=gpu" in record and "RealMemory=512000 AllocMem=1024" in record
    partition = pb.PartitionSummary(name="gpu", default=True, max_time_s=86400)
    text = scontrol.partition_record(partition, [node], oneliner=True)
    assert text.startswith("PartitionName=gpu Default=YES DefaultTime=NONE MaxTime=1-00:00:00 Nodes=node1 ")
    assert "TotalCPUs=64 TotalNodes=1" in text


def test_the_supervisor_spares_srun_from_a_job_signal(tmp_path: Path) -> None:
    """srun in a batch script: the agent signals the step's tasks itself, so srun must not get (and forward)
    the job's signal too. A real process whose program is named srun is spared; one named otherwise is not."""
    for name, spared in (("srun", True), ("gsrun", True), ("garrison-srun", True), ("train.py", False)):
        program = tmp_path / name
        program.write_text("import sys; sys.stdin.read()\n")
        process = subprocess.Popen([sys.executable, str(program)], stdin=subprocess.PIPE)
        try:
            cmdline = Path(f"/proc/{process.pid}/cmdline")
            started = str(program).encode()
            wait_until(lambda c=cmdline, s=started: s in c.read_bytes(), 10, what=f"{name} to start")
            assert is_torchrun_agent(process.pid) is spared, name
        finally:
            process.communicate(b"", timeout=10)


def test_own_job_ids_name_an_array_task_both_ways() -> None:
    assert scontrol.own_job_ids({"SLURM_JOB_ID": "12"}) == {"12"}
    assert scontrol.own_job_ids({"SLURM_JOB_ID": "13", "GARRISON_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "10",
                                 "SLURM_ARRAY_TASK_ID": "3"}) == {"13", "10_3"}
    assert scontrol.own_job_ids({}) == set()
