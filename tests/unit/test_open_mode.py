"""--open-mode: a job's first attempt empties its output files, later attempts append (issue 15)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from garrison.model.domain import Allocation, JobSpec, LaunchMode, NodeAllocation
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.jobs import (
    empty_outputs_before_start,
    output_truncation,
    supervisor_spec,
    truncates_output,
)
from garrison.nodeagent.launch.env import RankPlan
from garrison.nodeagent.supervisor import core
from garrison.nodeagent.supervisor.spec import LaunchSpec


def launch(attempt: int = 0, node_rank: int = 0, **fields: object) -> LaunchDescription:
    spec = replace(JobSpec(name="t", command=("train",), nodes=2, gpus_per_node=2, launch=LaunchMode.RANK),
                   **fields)  # type: ignore[arg-type]
    allocation = Allocation((NodeAllocation("a", (0, 1)), NodeAllocation("b", (0, 1))))
    return LaunchDescription(job_id=5, attempt=attempt, user="u", uid=1000, gid=1000, spec=spec,
                             allocation=allocation, node_rank=node_rank, master_addr="a", master_port=1,
                             restart_count=attempt, kill_wait_s=1.0, time_limit_s=60)


def ranks(*paths: str, first: int = 0) -> list[RankPlan]:
    return [RankPlan(rank=first + i, argv=("x",), env={}, cwd="/", stdout=p, stderr=p) for i, p in enumerate(paths)]


def test_first_attempt_truncates_later_ones_append_unless_the_mode_says() -> None:
    assert truncates_output(launch(0)) and not truncates_output(launch(1))
    assert not truncates_output(launch(0, open_mode="append"))
    assert truncates_output(launch(3, open_mode="truncate"))


def test_each_path_is_emptied_once_and_a_shared_one_only_on_the_first_node() -> None:
    assert output_truncation(launch(0), ranks("/o/slurm-5.out", "/o/slurm-5.out")) == {0: ["/o/slurm-5.out"]}
    assert output_truncation(launch(0, node_rank=1), ranks("/o/slurm-5.out", "/o/slurm-5.out", first=2)) == {}
    per_rank = launch(0, node_rank=1, output="/o/%j-%t.out")
    assert output_truncation(per_rank, ranks("/o/5-2.out", "/o/5-3.out", first=2)) == {
        2: ["/o/5-2.out"], 3: ["/o/5-3.out"]}
    assert output_truncation(launch(1), ranks("/o/slurm-5.out")) == {}


def test_the_supervisor_truncates_exactly_the_listed_paths(tmp_path: Path) -> None:
    log = tmp_path / "slurm-5.out"
    log.write_text("attempt 0\n")
    spec = supervisor_spec(launch(0), ranks(str(log)), groups=[], cpus=None, notify_socket=None)
    described = core.RankProcess(json.loads(spec.to_json())["ranks"][0])
    assert described.truncate == {str(log)}
    assert LaunchSpec.from_json(spec.to_json()) == spec
    fd = core._open_output(str(log), str(log) in described.truncate)
    os.write(fd, b"attempt 0 again\n")
    os.close(fd)
    fd = core._open_output(str(log))  # a later attempt appends
    os.write(fd, b"attempt 1\n")
    os.close(fd)
    assert log.read_text() == "attempt 0 again\nattempt 1\n"


def test_a_gang_empties_regular_outputs_before_its_start_and_leaves_devices_and_fifos_alone(tmp_path: Path) -> None:
    log, missing, fifo = tmp_path / "slurm-5.out", tmp_path / "new.out", tmp_path / "pipe"
    log.write_text("attempt 0\n")
    os.mkfifo(fifo)
    paths = (str(log), str(missing), "/dev/null", str(fifo))
    planned = [RankPlan(rank=i, argv=("x",), env={}, cwd=str(tmp_path), stdout=p, stderr=p)
               for i, p in enumerate(paths)]
    spec = supervisor_spec(launch(0), planned, groups=[], cpus=None, notify_socket=None)
    launched = replace(launch(0), uid=os.getuid(), gid=os.getgid())
    emptied = empty_outputs_before_start(spec, launched)
    assert log.read_text() == "" and missing.exists() and missing.stat().st_size == 0
    assert all(rank.truncate == [] for rank in emptied.ranks)  # no rank empties a file after the others started
    assert os.path.exists("/dev/null") and fifo.is_fifo()
