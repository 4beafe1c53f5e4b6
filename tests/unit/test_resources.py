"""sbatch's resource options (issue 15): gsub's parsing, their mapping onto what the scheduler knows
(garrison/model/resources.py), the controller's validation, and their round trip through the wire."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_store import full_spec, sample_node

from garrison.cmdline.submission import UsageError, parse_submission
from garrison.config import ControllerConfig
from garrison.controller.sched.filters.cpu_memory import mem_needed
from garrison.controller.sched.placement import request_for
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.domain import JobSpec, NodeState, Principal
from garrison.model.resources import ResourceError, resolve
from garrison.wire.convert import spec_from_pb, spec_to_pb

BASE = JobSpec(name="j", command=("true",))


def resolved(**fields: object) -> JobSpec:
    spec = resolve(replace(BASE, **fields))  # type: ignore[arg-type]
    assert resolve(spec) == spec  # idempotent: the controller may see an already mapped spec
    return spec


def test_tasks_and_gpus_per_task_make_gpus() -> None:
    assert resolved(ntasks=8, gpus_per_task=1).gpus == 8
    spec = resolved(nodes=2, ntasks_per_node=4, gpus_per_task=1)
    assert (spec.gpus_per_node, spec.total_gpus()) == (4, 8)
    assert resolved(ntasks=8, ntasks_per_node=4).nodes == 2
    assert resolved(nodes=2, ntasks=8).ntasks_per_node == 4
    assert resolved(gpus=4, ntasks_per_gpu=2).ntasks == 8
    assert resolved(ntasks=8, ntasks_per_gpu=2).gpus == 4


def test_a_cpu_jobs_tasks_get_a_cpu_each_without_cpus_per_task() -> None:
    # Slurm's default of one CPU per task: HPCNow's `--ntasks=8` for srun --multi-prog reserved one core
    # here (SLURM_CPUS_ON_NODE=2; Slurm 22.05: 8). A GPU job's CPUs still follow its GPUs.
    assert resolved(ntasks=8).cpus_per_node == 8
    assert resolved(nodes=2, ntasks_per_node=40).cpus_per_node == 40
    assert resolved(ntasks=1).cpus_per_node == 0 and resolved().cpus_per_node == 0
    assert resolved(ntasks=4, gpus_per_node=4).cpus_per_node == 0
    assert resolved(ntasks=8, cpus_per_node=2).cpus_per_node == 2  # a count of the job's own stands


def test_cpus_per_task_becomes_cpus_per_gpu_or_cpus_per_node() -> None:
    assert resolved(nodes=2, ntasks_per_node=4, gpus_per_node=4, cpus_per_task=1).cpus_per_gpu == 1
    assert resolved(ntasks_per_node=2, gpus_per_node=4, cpus_per_task=6).cpus_per_gpu == 3
    spec = resolved(cpus_per_task=4)  # a job with no GPU
    assert (spec.cpus_per_node, spec.cpus_per_gpu) == (4, 0)
    assert resolved(ntasks=2, cpus_per_task=4).cpus_per_node == 8
    assert request_for(1, spec, "p", 60).cpus_per_node == 4


def test_memory_per_cpu_and_per_gpu() -> None:
    assert resolved(ntasks=2, cpus_per_task=4, mem_per_cpu_mb=1000).mem_mb == 8000
    assert resolved(gpus_per_node=4, ntasks_per_node=4, cpus_per_task=8, mem_per_cpu_mb=100).mem_per_gpu_mb == 800
    spec = resolved(gpus=6, mem_per_gpu_mb=1000)  # an uneven spread: memory follows the GPUs on each node
    request = request_for(1, spec, "p", 60)
    assert (mem_needed(request, 4), mem_needed(request, 2)) == (4000, 2000)
    whole = request_for(1, resolved(gpus=2, mem_whole_node=True), "p", 60)
    assert mem_needed(whole, 2, node_memory_mb=512_000) == 512_000


def test_gpu_counts_given_several_ways_are_accepted_when_they_agree() -> None:
    # A real script's header (tests/data/slurm_corpus's wider sample): one GPU stated three ways.
    spec = resolved(gpus_per_node=1, gpus=1, gpus_per_task=1)
    assert (spec.gpus_per_node, spec.gpus, spec.total_gpus(), spec.nodes) == (1, None, 1, 1)
    spec = resolved(gpus=8, gpus_per_node=4)  # the nodes follow, as Slurm lays 8 GPUs at 4 a node on 2
    assert (spec.gpus_per_node, spec.nodes, spec.total_gpus()) == (4, 2, 8)
    spec = resolved(ntasks=8, gpus_per_task=1, gpus_per_node=4)
    assert (spec.nodes, spec.gpus_per_node, spec.total_gpus(), spec.ntasks) == (2, 4, 8, 8)
    spec = resolved(nodes=2, ntasks_per_node=4, gpus_per_task=1, gpus=8)
    assert (spec.gpus_per_node, spec.gpus, spec.total_gpus()) == (4, None, 8)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": 3, "gpus_per_node": 2}, "--gpus 3 conflicts with --gpus-per-node x --nodes (which make 2)"),
        ({"gpus": 4, "gpus_per_node": 2, "nodes": 1}, "--gpus 4 conflicts with --gpus-per-node x --nodes"),
        ({"gpus_per_node": 2, "gpus_per_task": 1, "ntasks": 3}, "--gpus-per-node x --nodes 2 conflicts with"),
        ({"gpus_per_node": 4, "gpus_per_task": 8, "ntasks": 1}, "a task cannot span nodes"),
        ({"nodes": 2, "ntasks_per_node": 4, "gpus_per_task": 1, "gpus": 6}, "--gpus 6 conflicts"),
    ],
)
def test_gpu_counts_that_contradict_each_other_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ResourceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(replace(BASE, **fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ntasks": 16, "ntasks_per_node": 4, "nodes": 2}, "--ntasks 16 cannot fit in --ntasks-per-node 4 x --nodes 2"),
        ({"ntasks": 1, "nodes": 2}, "--ntasks 1 is fewer than one task per node on --nodes 2"),
        ({"mem_mb": 5, "mem_per_gpu_mb": 4, "gpus": 1}, "--mem and --mem-per-gpu"),
        ({"mem_mb": 5, "mem_per_cpu_mb": 4}, "--mem-per-cpu and --mem"),
        ({"gpus": 3, "ntasks": 8, "gpus_per_task": 1}, "--gpus 3 conflicts with --ntasks x --gpus-per-task"),
        ({"gpus_per_task": 1, "ntasks_per_gpu": 1}, "--gpus-per-task or --ntasks-per-gpu"),
        ({"gpus": 4, "cpus_per_gpu": 2, "ntasks": 4, "cpus_per_task": 4}, "--cpus-per-gpu or --cpus-per-task"),
        ({"mem_per_gpu_mb": 100}, "--mem-per-gpu needs GPUs"),
        ({"ntasks_per_gpu": 2}, "--ntasks-per-gpu needs"),
    ],
)
def test_conflicts_name_both_options(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ResourceError, match=message.replace("(", r"\(")):
        resolve(replace(BASE, **fields))  # type: ignore[arg-type]


# -- gsub ----------------------------------------------------------------------------------------------------


def _submit(tmp_path: Path, directives: str, argv: tuple[str, ...] = ()) -> JobSpec:
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{directives}srun python train.py\n")
    return parse_submission([*argv, "job.sh"], {}, str(tmp_path)).spec


def test_sbatch_directives_give_slurm_resources(tmp_path: Path) -> None:
    spec = _submit(tmp_path, "#SBATCH -N 2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gres=gpu:4\n"
                             "#SBATCH --cpus-per-task=1\n#SBATCH --mem=90GB\n#SBATCH --comment='lr sweep'\n")
    assert (spec.nodes, spec.ntasks_per_node, spec.gpus_per_node, spec.cpus_per_task) == (2, 4, 4, 1)
    assert (spec.mem_mb, spec.comment) == (90 * 1024, "lr sweep")
    spec = _submit(tmp_path, "#SBATCH -n 8\n#SBATCH --gpus-per-task=1\n#SBATCH -c 6\n#SBATCH --mem-per-cpu=4G\n")
    assert (spec.ntasks, spec.gpus_per_task, spec.cpus_per_task, spec.mem_per_cpu_mb) == (8, 1, 6, 4096)
    spec = _submit(tmp_path, "#SBATCH --gres=gpu:A100:2\n#SBATCH --mem=0\n#SBATCH --open-mode=append\n")
    assert (spec.gpu_type, spec.gpus_per_node, spec.mem_mb, spec.mem_whole_node) == ("A100", 2, 0, True)
    assert spec.open_mode == "append"
    spec = _submit(tmp_path, "#SBATCH --mem-per-gpu=64G\n#SBATCH --ntasks-per-gpu=1\n", ("-G", "2"))
    assert (spec.mem_per_gpu_mb, spec.ntasks_per_gpu, spec.mem_whole_node) == (65536, 1, False)


def test_gres_none_and_a_zero_count_ask_for_no_gpus(tmp_path: Path) -> None:
    # Real scripts write --gres=gpu:0 for a CPU job on a GPU partition; Slurm 22.05 takes it, and --gres=none,
    # as no GPUs, and a --gpus given beside them still counts.
    for gres in ("gpu:0", "none", "gpu:a100:0", "gpu:00"):
        spec = _submit(tmp_path, f"#SBATCH --gres={gres}\n#SBATCH -c 4\n")
        assert (spec.gpus, spec.gpus_per_node, spec.gpus_per_task, spec.gpu_type) == (None, None, None, None)
    spec = _submit(tmp_path, "#SBATCH --gres=gpu:0\n#SBATCH --gpus=1\n")
    assert (spec.gpus, spec.gpus_per_node) == (1, None)


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("--gres=gpu:x@y:0", "job.sh line 2: --gres: invalid --gres 'gpu:x@y:0'"),
        ("--gres=nvme:1", "job.sh line 2: --gres: unknown generic resource 'nvme'"),
        ("--gres=gpu:x:y", "job.sh line 2: --gres: invalid --gres 'gpu:x:y'"),
        ("--gres=gpu:2 --gpus-per-node=4", "--gres: gpu:2 conflicts with --gpus-per-node 4"),
        ("-N 2 -n 16 --ntasks-per-node=4", "--ntasks 16 cannot fit in --ntasks-per-node 4 x --nodes 2"),
        ("--mem=4G --mem-per-cpu=1G", "--mem-per-cpu and --mem"),
        ("-c 0", "--cpus-per-task"),
        ("--open-mode=sometimes", "--open-mode"),
        ("--mem=lots", "invalid memory size 'lots'"),
    ],
)
def test_bad_resource_directives_are_one_line_errors(tmp_path: Path, directive: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        _submit(tmp_path, f"#SBATCH {directive}\n")
    assert message in str(caught.value) and "\n" not in str(caught.value)


# -- the controller -----------------------------------------------------------------------------------------


def _validate(**fields: object) -> JobSpec:
    nodes = {n.name: replace(n, state=NodeState.UP, reason="") for n in (sample_node("a", 8), sample_node("b", 8))}
    spec = replace(BASE, **fields)  # type: ignore[arg-type]
    return validate_submission(spec, Principal("ann", 1000, 1000), ControllerConfig(), nodes, []).spec


def test_the_controller_maps_the_options_itself() -> None:
    spec = _validate(nodes=2, ntasks_per_node=4, gpus_per_task=1, cpus_per_task=2)
    assert (spec.gpus_per_node, spec.cpus_per_gpu) == (4, 2)
    assert _validate(ntasks=8, gpus_per_task=1).gpus == 8


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mem_mb": 4 << 20}, "--mem: 4194304 MB per node exceeds the largest node"),
        ({"gpus_per_node": 8, "mem_per_gpu_mb": 300_000}, "--mem-per-gpu: 2400000 MB per node exceeds"),
        ({"mem_per_cpu_mb": 4 << 20}, "--mem-per-cpu: 4194304 MB per node exceeds"),  # the option given
        ({"cpus_per_task": 64, "ntasks": 4}, "--cpus-per-task: 256 CPUs per node exceed"),
        # a CPU each for a CPU job's tasks (ARCCA's --ntasks=80 --ntasks-per-node=40), named by what was given
        ({"nodes": 2, "ntasks_per_node": 400}, "--ntasks-per-node: 400 CPUs per node exceed"),
        ({"ntasks": 16, "ntasks_per_node": 4, "nodes": 2}, "--ntasks 16 cannot fit"),
        ({"ntasks": 0}, "--ntasks must be a positive number"),
        ({"open_mode": "sometimes"}, "--open-mode must be append or truncate"),
        ({"comment": "a\nb"}, "--comment must be at most"),
    ],
)
def test_the_controller_refuses_what_no_node_can_give(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _validate(**fields)


def test_every_new_field_round_trips_through_the_wire() -> None:
    # The array's %N travels in the SubmitRequest, and its index summary is the controller's own: neither is
    # on the JobSpec message.
    spec = replace(full_spec(), array_max_running=None, array_task_count=0, array_task_min=0, array_task_max=0,
                   array_task_step=0)
    assert spec_from_pb(spec_to_pb(spec)) == spec
    assert spec_from_pb(spec_to_pb(BASE)) == replace(BASE, launch=BASE.launch)


def test_gjob_shows_the_comment_and_the_task_options() -> None:
    from garrison.cli.render import job_detail
    from garrison.protos.v1 import garrison_pb2 as pb

    job = pb.JobInfo(job_id=4, display_id="4", name="j", user="ana", uid=1000, state="PENDING")
    job.spec.CopyFrom(spec_to_pb(replace(BASE, ntasks=8, cpus_per_task=6, mem_per_gpu_mb=4096,
                                         comment="lr sweep 3", open_mode="append")))
    text = job_detail(job)
    assert "   NumTasks=8 CpusPerTask=6 MemPerGpu=4096M OpenMode=append" in text
    assert "   Comment=lr sweep 3" in text
    assert "Comment=" not in job_detail(pb.JobInfo(job_id=4, display_id="4", state="PENDING"))
