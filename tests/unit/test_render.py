"""gjob's detail view: output paths as the agent resolves them, and the script's first lines."""

from __future__ import annotations

from garrison.cli.render import job_detail
from garrison.protos.v1 import garrison_pb2 as pb


def _job(**spec: object) -> pb.JobInfo:
    job = pb.JobInfo(job_id=41, display_id="40_3", name="sweep", user="ana", uid=1000, account="ml",
                     partition="main", state="PENDING", array_job_id=40, array_task_id=3)
    job.spec.CopyFrom(pb.JobSpec(name="sweep", workdir="/home/ana/runs", **spec))  # type: ignore[arg-type]
    return job


def _field(text: str, name: str) -> str:
    return next(word for line in text.splitlines() for word in line.split() if word.startswith(name + "="))


def test_gjob_shows_output_paths_expanded_as_the_agent_opens_them() -> None:
    default = job_detail(_job())
    assert _field(default, "StdOut") == "StdOut=/home/ana/runs/garrison-40_3.out"
    assert _field(default, "StdErr") == "StdErr=/home/ana/runs/garrison-40_3.out"
    custom = job_detail(_job(output="logs/%x-%A_%4a.out", error="/scratch/%u/%j.err"))
    assert _field(custom, "StdOut") == "StdOut=/home/ana/runs/logs/sweep-40_0003.out"
    assert _field(custom, "StdErr") == "StdErr=/scratch/ana/41.err"


def test_gjob_shows_the_first_lines_of_the_script() -> None:
    script = "#!/bin/bash\n#SBATCH -N 2\n" + "".join(f"echo {i}\n" for i in range(20))
    text = job_detail(_job(script=script))
    assert "   Script=(first 10 of 22 lines)" in text
    assert "     | #SBATCH -N 2" in text and "     | echo 7" in text and "echo 8" not in text
    assert "Script=" not in job_detail(_job())  # not sent (someone else's job): nothing shown
    assert "   Script=(2 lines)" in job_detail(_job(script="#!/bin/sh\ntrue\n"))


def _ended(state: str, code: int | None = None, task: int | None = None) -> pb.JobInfo:
    job = pb.JobInfo(job_id=7, display_id="7", state=state, now=100.0, start_time=40.0, end_time=58.0)
    if code is not None:
        job.exit_code = code
    return job


def test_wait_exit_status_is_sbatch_waits() -> None:
    from garrison.cli.waiting import exit_status

    assert exit_status([_ended("COMPLETED", 0)]) == 0
    assert exit_status([_ended("FAILED", 3)]) == 3
    assert exit_status([_ended("COMPLETED", 0), _ended("FAILED", 2), _ended("FAILED", 5)]) == 5  # the highest
    assert exit_status([_ended("CANCELLED")]) == 1 and exit_status([_ended("TIMEOUT", 0)]) == 1
    assert exit_status([_ended("FAILED", 300)]) == 255


def test_wait_status_line_says_state_reason_and_elapsed() -> None:
    from garrison.cli.waiting import status_line

    pending = pb.JobInfo(job_id=7, display_id="7", state="PENDING", reason="Resources", now=100.0)
    assert status_line("7", [pending]) == "job 7: PENDING (Resources) 0:00"
    running = pb.JobInfo(job_id=7, display_id="7", state="RUNNING", now=100.0, start_time=58.0, node_list=["node1"])
    assert status_line("7", [running]) == "job 7: RUNNING 0:42 on node1"
    assert status_line("7", [running, pending, pending]) == "job 7: 2 PENDING, 1 RUNNING"


def test_ginfo_marks_a_node_whose_jobs_run_unconfined() -> None:
    from garrison.cli.render import node_row
    from garrison.model.domain import Node, NodeInventory
    from garrison.wire.convert import node_to_pb

    def row(containment: str, reason: str = "") -> tuple[str, ...]:
        inventory = NodeInventory("n1", (), (), (), cpus=2, memory_mb=4096, containment=containment)
        return node_row(node_to_pb(Node("n1", inventory, reason=reason), [], connected=True))

    assert row("cgroup-v1: memory,cpuset,devices,pids,freezer")[-1] == ""
    assert row("unconfined")[-1] == "unconfined (jobs not contained by cgroups)"
    assert row("unconfined", "bad DIMM")[-1] == "bad DIMM; unconfined (jobs not contained by cgroups)"
    assert row("")[-1] == ""  # an agent from before containment says nothing: nothing is claimed
