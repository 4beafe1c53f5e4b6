"""gqueue -o: squeue's format strings laid out over real JobInfo messages."""

from __future__ import annotations

import pytest

from garrison.cli.queue_format import FIELDS, QueueFormat
from garrison.cmdline.argparser import UsageError
from garrison.protos.v1 import garrison_pb2 as pb

NOW = 1_700_000_000.0


def running() -> pb.JobInfo:
    return pb.JobInfo(job_id=12, display_id="12", name="a-very-long-job-name", user="ana", uid=1000,
                      account="vision", partition="main", state="RUNNING", time_limit_s=7200, gpus=8, nodes=2,
                      node_list=["node1", "node2"], submit_time=NOW - 600, start_time=NOW - 65, now=NOW,
                      priority=4321)


def pending_task() -> pb.JobInfo:
    return pb.JobInfo(job_id=20, display_id="19_3", name="sweep", user="bo", uid=1001, account="nlp",
                      partition="main", state="PENDING", reason="Resources", time_limit_s=0, gpus=1, nodes=1,
                      submit_time=NOW - 5, now=NOW, array_job_id=19, array_task_id=3)


def test_squeue_default_layout_right_justifies_and_cuts() -> None:
    layout = QueueFormat("%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R")
    assert layout.render([running(), pending_task()]).splitlines() == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "                12      main a-very-l      ana  R       1:05      2 node1,node2",
        "              19_3      main    sweep       bo PD       0:00      1 (Resources)",
    ]


def test_ids_for_scripts_without_header() -> None:
    layout = QueueFormat("%i")
    assert layout.render([running(), pending_task()], header=False) == "12\n19_3"
    assert layout.render([], header=False) == ""


def test_left_justified_fields_literals_and_percent() -> None:
    layout = QueueFormat("%5A|%K|%j|%%|%l|%L|%b|%Q")
    assert layout.line(running()) == "12   |N/A|a-very-long-job-name|%|2:00:00|1:58:55|gres/gpu:8|4321"
    assert layout.line(pending_task()) == "19   |3|sweep|%|UNLIMITED|UNLIMITED|gres/gpu:1|0"


def test_every_letter_has_a_header_and_a_value() -> None:
    layout = QueueFormat(" ".join(f"%{letter}" for letter in FIELDS))
    assert len(layout.header().split()) == len(FIELDS)
    assert len(layout.line(running()).split()) == len(FIELDS)


@pytest.mark.parametrize(("spec", "message"), [("%Z", "unknown field %Z"), ("%.8", "a '%' must start a field"),
                                                ("100%", "a '%' must start a field")])
def test_bad_formats_are_one_line_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        QueueFormat(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def _task(index: int, state: str = "PENDING", reason: str = "Resources") -> pb.JobInfo:
    job = pending_task()
    job.job_id, job.display_id, job.array_task_id, job.state, job.reason = 19 + index, f"19_{index}", index, state, reason
    job.array_max_running = 10
    return job


def test_pending_tasks_of_an_array_fold_into_one_row_as_in_squeue() -> None:
    from garrison.cli.render import JOB_COLUMNS, fold_pending_arrays, job_row

    jobs = [running(), _task(1, "RUNNING", ""), *(_task(i) for i in (2, 3, 4, 7, 8)), _task(9, reason="Priority")]
    folded = fold_pending_arrays(jobs)
    assert [job.display_id for job in folded] == ["12", "19_1", "19_[2-4,7-8%10]", "19_9"]
    assert folded[2].tasks[0] is jobs[2] and folded[2].state == "PENDING" and folded[2].reason == "Resources"
    assert job_row(folded[2])[:3] == ("19_[2-4,7-8%10]", "main", "sweep")
    assert JOB_COLUMNS[:3] == ("JOBID", "PARTITION", "NAME")
    # squeue -o lays out a folded row like any other; a lone pending task keeps its own id.
    assert QueueFormat("%i %t %r").render(folded[2:], header=False) == "19_[2-4,7-8%10] PD Resources\n19_9 PD Priority"
    assert fold_pending_arrays([_task(5)])[0].display_id == "19_5"
