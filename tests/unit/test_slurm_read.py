"""squeue, sinfo, sacct and sstat under Slurm's names: format parsing, widths and justification, state names,
exit codes and parsable output, over real protobuf messages with fixed values; and their --version."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.submitit_like import read_info_like_submitit

from garrison.cli.slurm import sacct, sinfo, sprio, squeue, sstat
from garrison.cli.slurm.fields import (
    FieldList,
    PercentFormat,
    exit_code_text,
    fit,
    parse_long_format,
    sacct_duration,
    sacct_state,
    short_state,
    state_names,
)
from garrison.cmdline.argparser import UsageError
from garrison.model.gputype import gpu_matches, slurm_gpu_type
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import garrison_pb2 as pb

NOW = 1_700_000_000.0


def clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def running() -> pb.JobInfo:
    return pb.JobInfo(job_id=12, display_id="12", name="a-very-long-job-name", user="ana", uid=1000,
                      account="vision", partition="main", state="RUNNING", time_limit_s=7200, gpus=8, nodes=2,
                      node_list=["node1", "node2"], submit_time=NOW - 600, start_time=NOW - 65, now=NOW,
                      priority=4321)


def pending_task(task: int = 3) -> pb.JobInfo:
    return pb.JobInfo(job_id=17 + task, display_id=f"19_{task}", name="sweep", user="bo", uid=1001,
                      account="nlp", partition="main", state="PENDING", reason="Resources", gpus=1, nodes=1,
                      submit_time=NOW - 5, now=NOW, array_job_id=19, array_task_id=task)


# --- fields.py ---------------------------------------------------------------------------------------------


def test_states_short_long_and_sacct_words() -> None:
    expected = {"PENDING": "PD", "RUNNING": "R", "COMPLETING": "CG", "COMPLETED": "CD", "FAILED": "F",
                "CANCELLED": "CA", "TIMEOUT": "TO", "PREEMPTED": "PR", "NODE_FAIL": "NF", "OUT_OF_MEMORY": "OOM"}
    for long, short in expected.items():
        assert short_state(long) == short
    assert state_names(["pd", "R", "completed", "CANCELED", "all"]) == [
        "PENDING", "RUNNING", "COMPLETED", "CANCELLED", "ALL"]
    with pytest.raises(UsageError, match="invalid job state 'sleeping'"):
        state_names(["sleeping"])
    assert sacct_state("CANCELLED", 1000) == "CANCELLED by 1000"
    assert sacct_state("FAILED", 1000) == "FAILED"
    # Starting and stopping are RUNNING to sacct (and to submitit, which takes CONFIGURING for finished).
    assert sacct_state("CONFIGURING", 1000) == sacct_state("COMPLETING") == "RUNNING"


def test_exit_codes_as_code_colon_signal() -> None:
    assert exit_code_text(None) == "0:0"
    assert exit_code_text(0, "COMPLETED") == "0:0"
    assert exit_code_text(3, "FAILED") == "3:0"
    assert exit_code_text(143, "CANCELLED") == "0:15"  # the process died of SIGTERM
    assert exit_code_text(137, "TIMEOUT") == "0:9"
    assert exit_code_text(130, "FAILED") == "130:0"  # a script that exited 130 itself
    assert exit_code_text(-9, "FAILED") == "0:9"


def test_durations() -> None:
    assert sacct_duration(65) == "00:01:05"
    assert sacct_duration(90061) == "1-01:01:01"


def test_percent_format_widths_and_justification() -> None:
    layout = PercentFormat("%.5i|%5i|%-5i|%i|%%|%.2j", {"i": "JOBID", "j": "NAME"})
    values = {"i": "12", "j": "long"}.__getitem__
    assert layout.line(values) == "   12|12   |12   |12|%|lo"
    assert layout.header() == "JOBID|JOBID|JOBID|JOBID|%|NA"
    assert fit("abcdef", 3, True) == "abc"
    with pytest.raises(UsageError, match=r"unknown field %z"):
        PercentFormat("%z", {"i": "JOBID"})
    with pytest.raises(UsageError, match="a '%' must start a field"):
        PercentFormat("100% %i", {"i": "JOBID"})


def test_long_format_list() -> None:
    layout = parse_long_format("jobid:6,name,state:.4", {"jobid": ("i", "JOBID"), "name": ("j", "NAME"),
                                                         "state": ("t", "ST")})
    assert layout.header() == "JOBID NAME                  ST"
    assert layout.line({"i": "12", "j": "x", "t": "R"}.__getitem__) == "12    x                      R"
    with pytest.raises(UsageError, match="unknown field 'nope'"):
        parse_long_format("nope", {"jobid": ("i", "JOBID")})


def test_field_list_table_cuts_with_plus_and_pads() -> None:
    fields = FieldList("jobid,JobName%4,State,jobname%-6", {"JobID": -12, "JobName": 10, "State": 10})
    rows = [{"JobID": "12", "JobName": "training", "State": "COMPLETED"}]
    assert fields.render(rows) == [
        "JobID        JobN      State JobNam ",
        "------------ ---- ---------- ------ ",
        "12           tra+  COMPLETED train+ ",
    ]
    assert fields.render(rows, header=False, parsable="p") == ["12|training|COMPLETED|training|"]
    assert fields.render(rows, parsable="P") == ["JobID|JobName|State|JobName", "12|training|COMPLETED|training"]
    with pytest.raises(UsageError, match="unknown field 'Bogus'"):
        FieldList("JobID,Bogus", {"JobID": -12})
    with pytest.raises(UsageError, match="must be a number"):
        FieldList("JobID%x", {"JobID": -12})


def test_slurm_gpu_type_names() -> None:
    for name, short in [("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla V100-SXM2-16GB", "v100"),
                        ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA RTX A6000", "rtx_a6000"), ("NVIDIA L40S", "l40s")]:
        assert slurm_gpu_type(name) == short
        assert gpu_matches(name, short)  # what sinfo shows is what gsub --gres=gpu:TYPE takes


# --- squeue ------------------------------------------------------------------------------------------------


def test_squeue_default_layout() -> None:
    from garrison.cli.render import fold_pending_arrays

    layout = PercentFormat(squeue.DEFAULT_FORMAT, squeue.HEADERS)
    jobs = fold_pending_arrays([running(), pending_task(3), pending_task(4), pending_task(5)])
    assert squeue.render_jobs(layout, jobs, {}, True) == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "                12      main a-very-l      ana  R       1:05      2 node[1-2]",
        "          19_[3-5]      main    sweep       bo PD       0:00      1 (Resources)",
    ]


def test_squeue_letters() -> None:
    job = running()
    detail = pb.JobInfo(job_id=12, spec=pb.JobSpec(mem_mb=65536, cpus_per_gpu=4, qos="high", workdir="/w",
                                                   command=["python", "t.py"]))
    layout = PercentFormat("%A|%F|%K|%l|%L|%T|%b|%C|%m|%q|%Z|%o|%S", squeue.HEADERS)
    (line,) = squeue.render_jobs(layout, [job], {12: detail}, False)
    assert line == f"12|12|N/A|2:00:00|1:58:55|RUNNING|gres/gpu:4|32|64G|high|/w|python t.py|{clock(NOW - 65)}"
    task = pending_task()
    (line,) = squeue.render_jobs(PercentFormat("%i %A %F %K %l %S %t", squeue.HEADERS), [task], {}, False)
    assert line == "19_3 20 19 3 UNLIMITED N/A PD"


def test_squeue_start_time_of_a_pending_job_is_its_estimate() -> None:
    assert squeue.job_values(pending_task(), estimate=NOW + 3600)("S") == clock(NOW + 3600)
    assert squeue.job_values(pending_task(), estimate=NOW - 5)("S") == clock(NOW)  # overdue: now
    assert squeue.job_values(pending_task())("S") == "N/A"
    assert PercentFormat(squeue.START_FORMAT, squeue.HEADERS).header().split() == [
        "JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES", "SCHEDNODES", "NODELIST(REASON)"]


def test_squeue_sort_and_bad_options() -> None:
    jobs = [running(), pending_task(3)]
    assert [j.job_id for j in squeue.sort_jobs(jobs, "-i")] == [20, 12]
    assert [j.job_id for j in squeue.sort_jobs(jobs, "u")] == [12, 20]
    with pytest.raises(UsageError):
        squeue.sort_jobs(jobs, "z")
    with pytest.raises(UsageError, match="unrecognized arguments: --bogus"):
        squeue.parser().parse_args(["--bogus"])


# --- sinfo -------------------------------------------------------------------------------------------------


def node(name: str, gpu: str, used_gpus: int, state: str = "UP") -> pb.NodeInfo:
    gpus = [pb.GpuInfo(index=i, name=gpu) for i in range(8)]
    return pb.NodeInfo(name=name, state=state, inventory=pb.NodeInventory(gpus=gpus, cpus=64, memory_mb=512000),
                       allocated_gpus=list(range(used_gpus)), allocated_cpus=used_gpus * 4, partitions=["main"])


def cluster() -> pb.ListNodesResponse:
    return pb.ListNodesResponse(
        nodes=[node("node1", "NVIDIA A100-SXM4-80GB", 0), node("node2", "NVIDIA A100-SXM4-80GB", 0),
               node("node3", "NVIDIA A100-SXM4-80GB", 3), node("node4", "Tesla V100-SXM2-16GB", 8),
               node("node5", "Tesla V100-SXM2-16GB", 0, "DRAIN"), node("node6", "Tesla V100-SXM2-16GB", 0, "DOWN")],
        partitions=[pb.PartitionSummary(name="main", default=True, max_time_s=86400)],
    )


def test_sinfo_default_groups_nodes_by_state() -> None:
    layout = PercentFormat(sinfo.DEFAULT_FORMAT, sinfo.HEADERS)
    assert sinfo.sinfo_lines(cluster(), layout) == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "main*        up 1-00:00:00      2   idle node[1-2]",
        "main*        up 1-00:00:00      1    mix node3",
        "main*        up 1-00:00:00      1  alloc node4",
        "main*        up 1-00:00:00      1  drain node5",
        "main*        up 1-00:00:00      1  down* node6",
    ]


def test_sinfo_gres_node_lines_summary_and_filters() -> None:
    layout = PercentFormat("%N %G %t %T %C", sinfo.HEADERS)
    lines = sinfo.sinfo_lines(cluster(), layout, by_node=True, header=False, states=["mix", "drain"])
    assert lines == ["node3 gpu:a100:8 mix mixed 12/52/0/64", "node5 gpu:v100:8 drain drained 0/0/64/64"]
    summary = PercentFormat(sinfo.SUMMARY_FORMAT, sinfo.HEADERS)
    assert sinfo.sinfo_lines(cluster(), summary, summarize=True, header=False) == [
        "main*        up 1-00:00:00          2/2/2/6 node[1-6]"]
    grouped = PercentFormat("%P %D %G %N", sinfo.HEADERS)
    assert sinfo.sinfo_lines(cluster(), grouped, header=False, nodes={"node1", "node4", "node5"}) == [
        "main* 1 gpu:a100:8 node1", "main* 2 gpu:v100:8 node[4-5]"]


def test_sinfo_long_format_names_fields_as_sinfo_o_does() -> None:
    # sinfo -O "NodeHost,Gres,GresUsed": what scripts read to find free GPUs; 20 wide unless sized.
    args = sinfo.parser().parse_args(["-N", "-O", "NodeHost:8,GresUsed:.24,AllocMem,StateCompact:6"])
    lines = sinfo.sinfo_lines(cluster(), sinfo._layout(args), by_node=True, nodes={"node1", "node3"})
    assert lines == [
        "HOSTNAME               GRES_USEDALLOCMEM            STATE ",
        "node1        gpu:a100:0(IDX:N/A)0                   idle  ",
        "node3        gpu:a100:3(IDX:0-2)0                   mix   ",
    ]
    assert sinfo.gres_used(node("n", "Tesla V100-SXM2-16GB", 0)) == "gpu:v100:0(IDX:N/A)"
    with pytest.raises(UsageError, match="unknown field 'bogus'"):
        sinfo._layout(sinfo.parser().parse_args(["-O", "bogus"]))


# --- sacct -------------------------------------------------------------------------------------------------


def alloc(name: str, gpus: int, cpus: int) -> pb.NodeAllocation:
    return pb.NodeAllocation(node=name, gpus=list(range(gpus)), cpus=list(range(cpus)), mem_mb=32768)


def finished(job_id: int = 30, state: str = "COMPLETED", code: int = 0) -> apb.JobRecord:
    attempt = apb.AttemptRecord(attempt=0, state=state, start_time=NOW - 100, end_time=NOW - 10, exit_code=code,
                                allocation=[alloc("node1", 2, 8), alloc("node2", 2, 8)], gpus=4,
                                usage=pb.ContainmentUsage(max_rss_bytes=300 << 20, cpu_time_s=75.5))
    return apb.JobRecord(job_id=job_id, display_id=str(job_id), name="train", user="ana", uid=1000, account="vision",
                         partition="main", state=state, submit_time=NOW - 200, start_time=NOW - 100,
                         end_time=NOW - 10, exit_code=code, time_limit_s=3600, requested_gpus=4, attempts=[attempt])


def step(job_id: int, step_id: int, state: str = "COMPLETED", code: int = 0) -> pb.StepInfo:
    return pb.StepInfo(job_id=job_id, step_id=step_id, name="python", user="ana", state=state,
                       start_time=NOW - 90, end_time=NOW - 20, exit_code=code, ntasks=8, nodes=["node1", "node2"],
                       gpus=4)


def test_sacct_lines_job_batch_steps() -> None:
    lines = sacct.job_lines(finished(), [step(30, 0), step(30, 1, "FAILED", 2)], NOW)
    fields = FieldList(sacct.DEFAULT_FIELDS + ",NodeList,Elapsed,ExitCode,DerivedExitCode,MaxRSS,TotalCPU,NTasks",
                       sacct.KNOWN_FIELDS)
    assert fields.render(lines, parsable="P") == [
        "JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode|NodeList|Elapsed|ExitCode|DerivedExitCode|"
        "MaxRSS|TotalCPU|NTasks",
        "30|train|main|vision|16|COMPLETED|0:0|node[1-2]|00:01:30|0:0|2:0||01:15.500|",
        "30.batch|batch||vision|8|COMPLETED|0:0|node1|00:01:30|0:0||300.00M|01:15.500|1",
        "30.0|python||vision||COMPLETED|0:0|node[1-2]|00:01:10|0:0||||8",
        "30.1|python||vision||FAILED|2:0|node[1-2]|00:01:10|2:0||||8",
    ]
    (line,) = sacct.job_lines(finished(31, "CANCELLED", 143), [], NOW, allocations=True)
    assert (line["State"], line["ExitCode"]) == ("CANCELLED by 1000", "0:15")
    assert line["AllocTRES"] == "billing=16,cpu=16,gres/gpu=4,mem=64G,node=2"
    assert (line["Start"], line["Timelimit"], line["ElapsedRaw"]) == (clock(NOW - 100), "01:00:00", "90")


def test_a_job_bound_to_no_cpus_counts_one_per_node_as_slurms_smallest_allocation() -> None:
    record = finished()
    for node in record.attempts[0].allocation:
        del node.cpus[:]
    job, batch = sacct.job_lines(record, [], NOW)
    assert (job["AllocCPUS"], job["CPUTimeRAW"], batch["AllocCPUS"]) == ("2", "180", "1")
    assert job["AllocTRES"] == "billing=2,cpu=2,gres/gpu=4,mem=64G,node=2"


def test_sacct_spec_fields_and_slurms_other_fields_blank() -> None:
    """Comment, WorkDir, Constraints, QOS, GID and Group come from the job's record; AveRSS and AveCPU of the
    batch line are its one task's; a field Slurm 22.05 knows and Garrison has no figure for (MaxVMSize, UserCPU,
    SubmitLine, ...) is taken and left blank, as Slurm leaves it; a name Slurm does not know is still refused."""
    record = finished()
    record.comment, record.workdir, record.constraint, record.gid = "sweep 3", "/home/ana/run", "a100|h100", 0
    lines = sacct.job_lines(record, [], NOW)
    fields = FieldList("JobID,Comment,WorkDir,Constraints,QOS,GID,Group,AveRSS,AveCPU,maxvmsize,UserCPU,SubmitLine",
                       sacct.SLURM_FIELDS)
    assert fields.render(lines, parsable="P") == [
        "JobID|Comment|WorkDir|Constraints|QOS|GID|Group|AveRSS|AveCPU|MaxVMSize|UserCPU|SubmitLine",
        "30|sweep 3|/home/ana/run|a100|h100|normal|0|root|||||",
        "30.batch||/home/ana/run|||0|root|300.00M|01:15.500|||",
    ]
    with pytest.raises(UsageError, match="unknown field 'MaxBogus'"):
        FieldList("JobID,MaxBogus", sacct.SLURM_FIELDS)


def test_sacct_takes_every_field_slurm_has() -> None:
    # apel's accounting script asks for `...,Group,...,MaxVMSize,State`, HPC_analytics' for `--format=ALL`:
    # both failed here on the first field Garrison lacked. Those it does not measure print empty, as sacct does.
    import os
    import pwd
    from types import SimpleNamespace

    record = finished()
    record.uid, record.gid = os.getuid(), pwd.getpwuid(os.getuid()).pw_gid  # Group and GID: the job's group
    fields = sacct._field_list(SimpleNamespace(format=["JobID,User,Group,GID,MaxVMSize,AveRSS,State"],
                                               brief=False, long=False))
    row = fields.render(sacct.job_lines(record, [], NOW), header=False, parsable="P")[0].split("|")
    assert row[3] == str(record.gid) and row[4:] == ["", "", "COMPLETED"] and row[2]
    every = sacct._field_list(SimpleNamespace(format=["ALL"], brief=False, long=False))
    assert {"JobID", "MaxVMSize", "WorkDir", "TRESUsageInTot"} <= {f.name for f in every.fields}
    with pytest.raises(UsageError):
        sacct._field_list(SimpleNamespace(format=["JobID,Bogus"], brief=False, long=False))


def test_sacct_default_table_and_folded_pending_array() -> None:
    pending = [apb.JobRecord(job_id=40 + i, display_id=f"40_{i}", name="sweep", user="bo", uid=1001,
                             account="nlp", partition="main", state="PENDING", submit_time=NOW, requested_gpus=1)
               for i in range(4)]
    records = sacct.fold_pending_tasks(pending)
    lines = [line for r in records for line in sacct.job_lines(r, [], NOW)]
    fields = FieldList(sacct.DEFAULT_FIELDS, sacct.KNOWN_FIELDS)
    assert fields.render(lines) == [
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
        "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
        "40_[0-3]          sweep       main        nlp          0    PENDING      0:0 ",
    ]


def test_sacct_job_refs() -> None:
    assert sacct.expand_job_refs(["12", "13_[1-2,5]", "14.batch", "15_2.0"]) == (
        ["12", "13_1", "13_2", "13_5", "14", "15_2"], {"14.batch", "15_2.0"}, {"12", "13_1", "13_2", "13_5"})
    with pytest.raises(UsageError):
        sacct.expand_job_refs(["abc"])
    with pytest.raises(UsageError, match="unrecognized arguments: -x"):
        sacct.parser().parse_args(["-x"])


def test_sacct_parsable2_reads_as_submitit_reads_it() -> None:
    pending = [apb.JobRecord(job_id=40 + i, display_id=f"40_{i}", state="PENDING", submit_time=NOW)
               for i in range(1, 4)]
    started = finished(40, "RUNNING")
    started.display_id = "40_0"
    records = sacct.fold_pending_tasks([started, *pending, finished(50, "FAILED", 1)])
    lines = [line for r in records for line in sacct.job_lines(r, [], NOW)]
    text = "\n".join(FieldList("JobID,State,NodeList", sacct.KNOWN_FIELDS).render(lines, parsable="P"))
    info = read_info_like_submitit(text)
    assert {k: v["State"] for k, v in info.items()} == {
        "40_0": "RUNNING", "40_1": "PENDING", "40_2": "PENDING", "40_3": "PENDING", "50": "FAILED"}
    assert info["50"]["NodeList"] == "node[1-2]"


# --- sstat -------------------------------------------------------------------------------------------------


def test_sstat_picks_steps_and_shows_the_jobs_figures() -> None:
    attempt = pb.AttemptInfo(attempt=0, state="RUNNING", allocation=[alloc("node1", 2, 8)],
                             usage=pb.ContainmentUsage(max_rss_bytes=2 << 30, cpu_time_s=4000))
    job = pb.JobInfo(job_id=60, display_id="60", state="RUNNING", node_list=["node1"], attempts=[attempt])
    steps = [step(60, 1, "RUNNING"), step(60, 0, "COMPLETED")]
    fields = FieldList(sstat.DEFAULT_FIELDS, sstat.KNOWN_FIELDS)
    assert fields.render(sstat.step_lines(job, steps, None, False), parsable="p", header=False) == [
        "60.1|2.00G|node1|0|2.00G|01:06:40|node1|0|01:06:40|8|"]
    assert [line["JobID"] for line in sstat.step_lines(job, steps, None, True)] == ["60.batch", "60.1"]
    assert [line["NTasks"] for line in sstat.step_lines(job, [], None, False)] == ["1"]  # the batch step
    assert sstat.step_lines(job, steps, "0", False) == []  # step 0 has ended


def test_sacct_requeued_job_and_duplicates() -> None:
    record = finished(70, "RUNNING")
    first = apb.AttemptRecord(attempt=0, state="NODE_FAIL", start_time=NOW - 500, end_time=NOW - 400,
                              allocation=[alloc("node3", 4, 0)], gpus=4)
    record.attempts.insert(0, first)
    record.end_time = 0
    fields = FieldList("JobID,State,NodeList,Start", sacct.KNOWN_FIELDS)
    assert fields.render(sacct.job_lines(record, [], NOW, allocations=True, duplicates=True), parsable="P",
                         header=False) == [
        f"70|NODE_FAIL|node3|{clock(NOW - 500)}", f"70|RUNNING|node[1-2]|{clock(NOW - 100)}"]
    record.state = "PENDING"  # requeued again and waiting: no nodes, no batch line, its runs all earlier
    assert fields.render(sacct.job_lines(record, [], NOW, duplicates=True), parsable="P", header=False) == [
        f"70|NODE_FAIL|node3|{clock(NOW - 500)}", f"70|REQUEUED|node[1-2]|{clock(NOW - 100)}",
        "70|PENDING|None assigned|Unknown"]


def test_sacct_time_forms() -> None:
    from datetime import datetime

    now = datetime(2026, 12, 6, 10, 0).astimezone()
    assert [sacct.slurm_time(t, now) for t in ("14:05", "9:05:30", "1201", "120125", "12/01/25", "12.01",
                                                "1205-08:00", "2026-12-01T10:00", "now-1days")] == [
        "2026-12-06T14:05", "2026-12-06T09:05:30", "2026-12-01", "2025-12-01", "2025-12-01", "2026-12-01",
        "2026-12-05T08:00", "2026-12-01T10:00", "now-1days"]


# --- --version ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["sacct", "salloc", "sbatch", "scancel", "scontrol", "sinfo", "sprio", "squeue",
                                     "srun", "sstat"])
@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_every_slurm_name_answers_version_as_slurm_does(command: str, flag: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Tools ask `sinfo --version` which Slurm they talk to; Slurm prints "slurm 22.05.8" and exits 0.
    module = __import__(f"garrison.cli.slurm.{command}", fromlist=["main"])
    with pytest.raises(SystemExit) as caught:
        module.main([flag])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("slurm 22.05.8 (garrison ") and out.count("\n") == 1


def test_sbatch_version_is_answered_by_its_launcher_without_a_controller() -> None:
    # bin/garrison-sbatch tries the fast path (a submission over the local socket) first: --version is not one.
    launcher = Path(sys.executable).parent / "garrison-sbatch"
    env = {"PATH": "/usr/bin:/bin", "GARRISON_CONTROLLER": "127.0.0.1:1"}
    result = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("slurm 22.05.8 (garrison "), result


# --- sprio -------------------------------------------------------------------------------------------------


def queue_details() -> adminpb.QueueDetailsResponse:
    weights = adminpb.PriorityWeights(age=1000, fair_share=10000, qos=0, job_size=1000, partition=0, time_limit=2000)
    response = adminpb.QueueDetailsResponse(weights=weights, now=NOW)
    for job_id, user, priority, age in ((7, "ana", 6200, 0.5), (9, "bo", 8100, 1.0)):
        detail = response.jobs.add(position=1, priority=priority)
        detail.job.job_id, detail.job.display_id, detail.job.user, detail.job.partition = job_id, str(job_id), user, "gpu"
        detail.factors.age, detail.factors.fair_share, detail.factors.job_size = age, 0.5, 0.125
        detail.factors.time_limit, detail.factors.admin, detail.factors.nice = 0.25, 10, 5
    return response


def test_sprio_shows_weighted_factors_in_slurms_layout() -> None:
    def lines(*argv: str) -> list[str]:
        return sprio.sprio_lines(queue_details(), sprio.parser().parse_args(list(argv)))

    assert lines() == [
        "          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE    JOBSIZE  TIMELIMIT   NICE",
        "              7 gpu             6200         10        500       5000        125        500      5",
        "              9 gpu             8100         10       1000       5000        125        500      5",
    ]  # no QOS and PARTITION columns: their weights are 0, as sprio leaves them out
    assert lines("-w")[1].split() == ["Weights", "1000", "10000", "1000", "2000"]
    assert lines("-n", "-h")[0].split()[4:8] == ["0.5000000", "0.5000000", "0.1250000", "0.2500000"]
    assert lines("-o", "%i %u %Y", "-S", "-y", "-h") == ["9 bo 8100", "7 ana 6200"]
    assert lines("-l")[0].split()[:4] == ["JOBID", "PARTITION", "USER", "PRIORITY"]
    with pytest.raises(UsageError, match="unknown field %z"):
        lines("-o", "%z")
    with pytest.raises(UsageError, match="cannot sort by 'q'"):
        lines("-S", "q")


def test_sacct_units_convert_memory_figures_as_sacct_units_does() -> None:
    # sacct --units=G -o MaxRSS, as seff-like scripts read it: two decimals unless whole; --noconvert: bytes.
    assert [sacct.in_unit(text, "G") for text in ("300.25M", "4G", "512K", "0", "")] == [
        "0.29G", "4G", "0.00G", "0G", ""]
    assert sacct.in_unit("4G", "M") == "4096M" and sacct.in_unit("1.50G", "K") == "1572864K"
    assert sacct.in_unit("2M", "") == "2097152"
    args = sacct.parser().parse_args(["--units=g"])
    assert sacct._unit(args) == "G" and sacct._unit(sacct.parser().parse_args(["--noconvert"])) == ""
    with pytest.raises(UsageError, match="--units"):
        sacct._unit(sacct.parser().parse_args(["--units=Q"]))
    lines = sacct.job_lines(finished(), [], NOW)
    assert lines[1]["MaxRSS"] == "300.00M" and sacct.in_unit(lines[1]["MaxRSS"], "G") == "0.29G"
