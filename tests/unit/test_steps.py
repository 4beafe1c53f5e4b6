"""Job steps' pure parts: placement within the allocation, srun's task environment, gsrun's options and
output labels, and the wire round trip of a node's step launch."""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import replace
from typing import Any

import pytest

from garrison.cli.gsrun import OutputWriter, _parser, build_spec, exported_environment, task_failures
from garrison.cmdline.argparser import UsageError
from garrison.controller.steps import check_request, step_master_port
from garrison.model.domain import Allocation, NodeAllocation
from garrison.model.steps import (
    CpuBind,
    GpuBind,
    RefusalKind,
    StepLaunchDescription,
    StepRefused,
    StepRequest,
    block_counts,
    parse_step_ref,
    place_step,
    step_exit_code,
)
from garrison.nodeagent.launch.env import plan_step_tasks
from garrison.wire.convert_steps import (
    step_launch_from_pb,
    step_launch_to_pb,
    step_request_from_pb,
    step_request_to_pb,
)

ALLOCATION = Allocation(nodes=(
    NodeAllocation("n1", (0, 1, 2, 3), cpus=tuple(range(0, 8))),
    NodeAllocation("n2", (4, 5, 6, 7), cpus=tuple(range(8, 16))),
))
NO_BUSY: dict[str, tuple[frozenset[int], frozenset[int]]] = {}


def place(**options: Any) -> Any:
    busy = options.pop("busy", NO_BUSY)
    return place_step(ALLOCATION, busy, StepRequest(argv=("true",), **options), "12")


def refusal(**options: Any) -> StepRefused:
    with pytest.raises(StepRefused) as caught:
        place(**options)
    return caught.value


def test_block_distribution_as_srun() -> None:
    assert block_counts(4, 2, 2) == [2, 2]
    assert block_counts(3, 2, 2) == [2, 1]
    assert block_counts(5, 2, None) == [3, 2]
    assert place(ntasks=4, ntasks_per_node=2).tasks_per_node() == (2, 2)
    assert place().tasks_per_node() == (1, 1)  # one task per node of the allocation by default
    assert place(ntasks=1).node_names == ("n1",)
    assert place(ntasks=3).tasks_per_node() == (2, 1)
    layout = place(ntasks=5)
    assert [n.tasks for n in layout.nodes] == [(0, 1, 2), (3, 4)]  # consecutive task ids per node
    assert place(nodelist=("n2",)).node_names == ("n2",)
    assert place(nodes=2, nodelist=("n2",)).node_names == ("n1", "n2")


def test_gpus_per_task_are_held_and_each_task_sees_its_own() -> None:
    layout = place(ntasks=4, ntasks_per_node=2, gpus_per_task=2)
    assert [n.task_gpus for n in layout.nodes] == [((0, 1), (2, 3)), ((4, 5), (6, 7))]
    assert layout.nodes[0].held_gpus == (0, 1, 2, 3)
    # Without --gpus-per-task every task sees the job's GPUs on its node and holds none.
    free = place(ntasks=2)
    assert free.nodes[0].task_gpus == ((0, 1, 2, 3),) and free.nodes[0].held_gpus == ()


def test_gpu_bind_variants() -> None:
    assert place(ntasks=2, nodes=1, gpus_per_task=2, gpu_bind=GpuBind.NONE).nodes[0].task_gpus == ((0, 1, 2, 3),) * 2
    assert place(ntasks=4, nodes=1, gpu_bind=GpuBind.SINGLE, gpu_bind_arg=(2,)).nodes[0].task_gpus == (
        (0,), (0,), (1,), (1,))
    assert place(ntasks=3, nodes=1, gpu_bind=GpuBind.MAP_GPU, gpu_bind_arg=(3, 1)).nodes[0].task_gpus == (
        (3,), (1,), (3,))
    assert refusal(ntasks=1, gpu_bind=GpuBind.MAP_GPU, gpu_bind_arg=(5,)).kind == RefusalKind.EXCEEDS_ALLOCATION
    assert "need 5 GPUs" in str(refusal(ntasks=5, nodes=1, gpu_bind=GpuBind.SINGLE, gpu_bind_arg=(1,)))


def test_cpu_binding() -> None:
    layout = place(ntasks=2, nodes=1, cpus_per_task=3)
    assert layout.nodes[0].task_cpus == ((0, 1, 2), (3, 4, 5)) and layout.nodes[0].held_cpus == tuple(range(6))
    assert place(ntasks=2, nodes=1, cpus_per_task=3, cpu_bind=CpuBind.NONE).nodes[0].task_cpus == ((), ())
    assert place(ntasks=3, nodes=1, cpu_bind=CpuBind.MAP_CPU, cpu_bind_arg=(7, 6)).nodes[0].task_cpus == (
        (7,), (6,), (7,))
    assert refusal(ntasks=1, cpu_bind=CpuBind.MAP_CPU, cpu_bind_arg=(9,)).kind == RefusalKind.EXCEEDS_ALLOCATION


def test_more_than_the_allocation_and_more_than_is_free_are_told_apart() -> None:
    too_many = refusal(ntasks=1, gpus_per_task=5)
    assert too_many.kind == RefusalKind.EXCEEDS_ALLOCATION and "need 5 GPUs; job 12 holds 4 there" in str(too_many)
    assert refusal(nodes=3).kind == RefusalKind.EXCEEDS_ALLOCATION
    assert refusal(nodelist=("n9",)).kind == RefusalKind.EXCEEDS_ALLOCATION
    assert refusal(ntasks=2, nodes=1, cpus_per_task=5).kind == RefusalKind.EXCEEDS_ALLOCATION
    busy = {"n1": (frozenset({0, 1, 2}), frozenset()), "n2": (frozenset({4, 5, 6, 7}), frozenset())}
    assert place(ntasks=1, gpus_per_task=1, busy=busy).nodes[0].task_gpus == ((3,),)
    taken = refusal(ntasks=2, gpus_per_task=1, busy=busy)
    assert taken.kind == RefusalKind.BUSY and "other steps" in str(taken)
    assert refusal(ntasks=1, nodes=2).kind == RefusalKind.INVALID
    assert refusal(ntasks=5, nodes=2, ntasks_per_node=2).kind == RefusalKind.INVALID


def test_request_checks_and_refs() -> None:
    for bad in (StepRequest(argv=()), StepRequest(argv=("x\0",)), StepRequest(argv=("x",), cwd="relative"),
                StepRequest(argv=("x",), env={"A=B": "c"}), StepRequest(argv=("x",), gpu_bind=GpuBind.SINGLE)):
        with pytest.raises(StepRefused):
            check_request(bad)
    check_request(StepRequest(argv=("x",), env={"A": "b"}))
    assert parse_step_ref("12.3") == (12, "3") and parse_step_ref("12.batch") == (12, "batch")
    for bad_ref in ("12", "12.x", ".3", "a.1"):
        with pytest.raises(ValueError):
            parse_step_ref(bad_ref)
    assert step_exit_code([0, 3, 143]) == 143 and step_exit_code([]) == 0
    assert 40000 <= step_master_port(12, 3) < 60000 and step_master_port(12, 3) != step_master_port(12, 4)


def launch(node_index: int, pty: bool = False) -> StepLaunchDescription:
    layout = place(ntasks=3, gpus_per_task=1, cpus_per_task=2)
    return StepLaunchDescription(
        job_id=12, step_id=2, user="ann", uid=1000, gid=1000, argv=("python", "train.py"),
        env={"HOME": "/home/ann", "TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_NAME": "train"}, cwd="/work",
        layout=layout, node_index=node_index, master_addr="10.0.0.1", master_port=45000, kill_wait_s=5.0, pty=pty,
        umask=0o22,
    )


def test_task_environment_has_srun_and_torchrun_variables() -> None:
    plans = plan_step_tasks(launch(1), "/state/steps/12.2/io")
    (task,) = plans
    env = task.env
    assert task.rank == 2 and task.stdout == "/state/steps/12.2/io/out-2" and task.stderr.endswith("err-2")
    expected = {
        "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_ID": "2",
        "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_NTASKS": "3", "SLURMD_NODENAME": "n2",
        "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "45000", "CUDA_VISIBLE_DEVICES": "4", "HOME": "/home/ann", "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "12",
    }
    assert {k: env[k] for k in expected} == expected
    assert "TORCHELASTIC_RUN_ID" not in env  # the step's tasks are srun's, not a torchrun agent's
    first = plan_step_tasks(launch(0), "/io")
    assert [(p.env["RANK"], p.env["LOCAL_RANK"], p.env["CUDA_VISIBLE_DEVICES"]) for p in first] == [
        ("0", "0", "0"), ("1", "1", "1")]
    assert [p.env["GPU_DEVICE_ORDINAL"] for p in first] == ["0", "1"]
    # The step's node and task counts, as slurmstepd sets them (checked on Slurm 22.05: a one-node step of a
    # two-node job has SLURM_NNODES=1); the job's own stay in SLURM_JOB_NUM_NODES and SLURM_JOB_NODELIST.
    assert (env["SLURM_NNODES"], env["SLURM_TASKS_PER_NODE"]) == ("2", "2,1")
    one_node = replace(launch(0), layout=place(ntasks=1), env={**launch(0).env, "SLURM_NNODES": "2",
                                                                "SLURM_JOB_NUM_NODES": "2"})
    (task,) = plan_step_tasks(one_node, "/io")
    assert (task.env["SLURM_NNODES"], task.env["SLURM_TASKS_PER_NODE"], task.env["SLURM_JOB_NUM_NODES"]) == (
        "1", "1", "2")


def test_a_steps_node_list_gpu_count_and_task_ids_are_its_own() -> None:
    """As srun and slurmstepd set them (Slurm 22.05's env.c and gres_common.c): SLURM_NODELIST is the step's
    nodes (Lightning takes its head node from it), SLURM_GPUS_ON_NODE the step's GPUs on this node (a torchrun
    --nproc_per_node=$SLURM_GPUS_ON_NODE inside `srun --gpus-per-task=1`), SLURM_GTIDS this node's tasks; the
    job's node list stays in SLURM_JOB_NODELIST."""
    in_job = {**launch(1).env, "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "4",
              "GARRISON_GPUS_ON_NODE": "4", "SLURM_GTIDS": "0"}
    (task,) = plan_step_tasks(replace(launch(1), env=in_job), "/io")  # task 2, alone on n2, holding GPU 4
    assert (task.env["SLURM_NODELIST"], task.env["SLURM_JOB_NODELIST"]) == ("n[1-2]", "n[1-2]")
    assert (task.env["SLURM_GPUS_ON_NODE"], task.env["GARRISON_GPUS_ON_NODE"], task.env["SLURM_GTIDS"]) == (
        "1", "1", "2")
    one_node = replace(launch(0), layout=place(ntasks=2, nodes=1, gpus_per_task=1), env=in_job)
    assert [(p.env["SLURM_NODELIST"], p.env["SLURM_GPUS_ON_NODE"], p.env["SLURM_GTIDS"])
            for p in plan_step_tasks(one_node, "/io")] == [("n1", "2", "0,1"), ("n1", "2", "0,1")]


def test_slurm_step_gpus_names_the_steps_gpus_on_each_node() -> None:
    # Held with --gpus-per-task: the held GPUs (task 2, alone on n2, holds GPU 4).
    assert plan_step_tasks(launch(1), "/io")[0].env["SLURM_STEP_GPUS"] == "4"
    # Holding none: the job's GPUs its tasks see there, per node, as slurmstepd sets it on every node.
    layout = place(ntasks=2)
    for index, expected in ((0, "0,1,2,3"), (1, "4,5,6,7")):
        step = replace(launch(index), layout=layout)
        assert [p.env["SLURM_STEP_GPUS"] for p in plan_step_tasks(step, "/io")] == [expected]


def test_behind_the_jobs_devices_cgroup_step_tasks_see_gpus_numbered_from_0() -> None:
    """A step's cgroup is a child of its job's: its tasks can open the job's GPUs on the node, which CUDA
    numbers from 0 in the node's order; SLURM_STEP_GPUS keeps the node's indices."""
    (task,) = plan_step_tasks(launch(1), "/io", visible_gpus=(4, 5, 6, 7))  # task 2 holds GPU 4
    assert (task.env["CUDA_VISIBLE_DEVICES"], task.env["GPU_DEVICE_ORDINAL"], task.env["SLURM_STEP_GPUS"]) == (
        "0", "0", "4")
    first = plan_step_tasks(launch(0), "/io", visible_gpus=(0, 1, 2, 3))
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in first] == ["0", "1"]
    assert {p.env["CUDA_DEVICE_ORDER"] for p in first} == {"PCI_BUS_ID"}
    # Holding none, a step's tasks see the job's GPUs here: on n2 (GPUs 4-7) they are 0-3.
    step = replace(launch(1), layout=place(ntasks=2))
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plan_step_tasks(step, "/io", visible_gpus=(4, 5, 6, 7))] == [
        "0,1,2,3"]
    with pytest.raises(ValueError, match="not one of those the job may open"):
        plan_step_tasks(launch(1), "/io", visible_gpus=(5, 6))


def test_step_launch_and_request_survive_the_wire() -> None:
    description = launch(1, pty=True)
    assert step_launch_from_pb(step_launch_to_pb(description)) == description
    unbuffered = replace(launch(1), unbuffered=True)
    assert step_launch_from_pb(step_launch_to_pb(unbuffered)) == unbuffered
    request = StepRequest(argv=("a", "b"), env={"X": "1"}, cwd="/w", ntasks=3, nodes=2, gpus_per_task=1,
                          nodelist=("n1",), gpu_bind=GpuBind.MAP_GPU, gpu_bind_arg=(1, 0), cpu_bind=CpuBind.CORES,
                          label=True, kill_on_bad_exit=True, name="s", unbuffered=True)
    assert step_request_from_pb(step_request_to_pb(12, request)) == request
    assert gsrun_spec("-u", "true")["unbuffered"] and not gsrun_spec("true")["unbuffered"]


def gsrun_spec(*argv: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    return build_spec(_parser().parse_args(list(argv)), environ or {})


def test_gsrun_options() -> None:
    spec = gsrun_spec("-n", "4", "--ntasks-per-node", "2", "-l", "-K", "--gpu-bind", "single:2", "python", "-c", "x")
    assert spec["argv"] == ["python", "-c", "x"] and spec["ntasks"] == 4 and spec["ntasks_per_node"] == 2
    assert spec["label"] and spec["kill_on_bad_exit"] and spec["gpu_bind"] == "single" and spec["gpu_bind_arg"] == [2]
    # Options after the command are the command's.
    assert gsrun_spec("hostname", "-n", "3")["argv"] == ["hostname", "-n", "3"]
    assert gsrun_spec("-w", "n[1-2]", "--cpu-bind", "map_cpu:3,4", "true")["nodelist"] == ["n1", "n2"]
    in_job = {"SLURM_NTASKS": "8"}
    assert gsrun_spec("true", environ=in_job)["ntasks"] == 8  # the job's -n, as srun takes it inside a job
    assert "ntasks" not in gsrun_spec("-N", "1", "true", environ=in_job)
    assert gsrun_spec("--pty", "bash", environ=in_job)["ntasks"] == 1
    for bad in (["--gpu-bind", "sideways", "x"], ["--cpu-bind", "map_cpu:", "x"], ["-n", "0", "x"], [],
                ["--pty", "-n", "2", "bash"], ["--gpu-bind", "single:0", "x"]):
        with pytest.raises(UsageError):
            gsrun_spec(*bad)


def test_export() -> None:
    environ = {"HOME": "/h", "SLURM_JOB_ID": "3", "SECRET": "s", "GARRISON_CONTROLLER": "c"}
    assert exported_environment("ALL", environ) == environ
    assert exported_environment("NONE", environ) == {"SLURM_JOB_ID": "3", "GARRISON_CONTROLLER": "c"}
    assert exported_environment("HOME,X=1", environ) == {"SLURM_JOB_ID": "3", "GARRISON_CONTROLLER": "c", "HOME": "/h",
                                                         "X": "1"}
    assert exported_environment("ALL,SECRET=", environ)["SECRET"] == ""
    with pytest.raises(UsageError):
        exported_environment("1BAD", environ)


def test_label_prefixes_every_line_across_chunks(tmp_path: Any) -> None:
    out = tmp_path / "out"
    writer = OutputWriter(label=True, output=str(out), error=str(tmp_path / "err"))
    writer.write(0, 1, b"hello\nwor")
    writer.write(1, 1, b"other\n")
    writer.write(0, 1, b"ld\n\n")
    writer.close()
    assert out.read_bytes() == b"0: hello\n0: wor1: other\nld\n0: \n"
    plain = OutputWriter(label=False, output=str(out), error="")
    plain.write(3, 1, b"x")
    plain.close()
    assert out.read_bytes().endswith(b"x")


def test_srun_output_patterns_give_each_task_its_file(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # submitit's step: srun --unbuffered --output FOLDER/%j_%t_log.out --error FOLDER/%j_%t_log.err ...
    args = _parser().parse_args(["--unbuffered", "-o", f"{tmp_path}/%j_%t_log.out", "-e", f"{tmp_path}/%j_%t_log.err",
                                 "python", "-u", "-m", "submitit.core._submit", str(tmp_path)])
    assert args.unbuffered and args.command[:2] == ["python", "-u"]
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    writer = OutputWriter(label=False, output=args.output, error=args.error)
    writer.begin(12, 3, ["node1", "node2"], 2, None)
    writer.write(0, 1, b"task 0 out\n")
    writer.write(1, 2, b"task 1 err\n")
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["12_0_log.err", "12_0_log.out", "12_1_log.err", "12_1_log.out"]
    assert (tmp_path / "12_0_log.out").read_bytes() == b"task 0 out\n"
    assert (tmp_path / "12_1_log.err").read_bytes() == b"task 1 err\n"
    # One name for every task: one file, opened once (appending, as a plain -o); srun's other specifiers.
    shared = OutputWriter(label=True, output=f"{tmp_path}/%x-%J.%%.out", error="")
    shared.begin(12, 3, ["node1", "node2"], 4, None)
    shared.write(0, 1, b"a\n")
    shared.write(3, 1, b"b\n")
    shared.close()
    assert (tmp_path / "train-12.3.%.out").read_bytes() == b"0: a\n3: b\n"
    per_node = OutputWriter(label=False, output=f"{tmp_path}/%N-%n.out", error="")
    per_node.begin(12, 4, ["node1", "node2"], 4, None)  # block-wise: tasks 0-1 on node1, 2-3 on node2
    per_node.write(1, 1, b"one ")
    per_node.write(2, 1, b"two ")
    per_node.close()
    assert (tmp_path / "node1-0.out").read_bytes() == b"one " and (tmp_path / "node2-1.out").read_bytes() == b"two "


def test_the_agent_never_reads_step_output_through_a_link(tmp_path: Any) -> None:
    from garrison.nodeagent.steps import _open_user_file

    secret = tmp_path / "secret"
    secret.write_text("root's")
    (tmp_path / "out-0").symlink_to(secret)
    os.mkfifo(tmp_path / "out-1")
    (tmp_path / "out-2").write_bytes(b"task output")
    for name in ("out-0", "out-1"):
        with pytest.raises(OSError):
            _open_user_file(tmp_path / name, stat.S_ISREG)
    with _open_user_file(tmp_path / "out-2", stat.S_ISREG) as output:
        assert output.read() == b"task output"


def test_gsrun_takes_the_srun_options_real_scripts_carry() -> None:
    # --kill-on-bad-exit=1 as srun's scripts write it, -K alone meaning 1 and =0 meaning not; --wait=60 and -u
    # accepted (nothing to do); the command after them stays the command.
    spec = gsrun_spec("--wait=60", "--kill-on-bad-exit=1", "--jobid", "7", "-u", "bash", "-c", "x")
    assert spec["kill_on_bad_exit"] and spec["argv"] == ["bash", "-c", "x"]
    assert gsrun_spec("-K", "bash")["kill_on_bad_exit"] and gsrun_spec("-K", "bash")["argv"] == ["bash"]
    assert not gsrun_spec("--kill-on-bad-exit=0", "true")["kill_on_bad_exit"]
    assert not gsrun_spec("true")["kill_on_bad_exit"]
    assert gsrun_spec("-W", "30", "true")["argv"] == ["true"]
    with pytest.raises(UsageError):
        gsrun_spec("--kill-on-bad-exit=2", "true")


def test_a_master_address_and_port_the_script_exported_are_kept() -> None:
    # srun sets neither: `export MASTER_PORT=6000; srun python train.py` meets on the script's choice.
    description = launch(0)
    exported = dataclasses.replace(description, env={**description.env, "MASTER_ADDR": "n1", "MASTER_PORT": "6000"})
    assert {(p.env["MASTER_ADDR"], p.env["MASTER_PORT"]) for p in plan_step_tasks(exported, "/io")} == {("n1", "6000")}
    assert {p.env["MASTER_PORT"] for p in plan_step_tasks(description, "/io")} == {"45000"}


def test_gsrun_gpus_per_task_takes_srun_s_type_prefix() -> None:
    assert gsrun_spec("--gpus-per-task=a100:1", "-n", "2", "true")["gpus_per_task"] == 1
    assert gsrun_spec("--gpus-per-task", "2", "true")["gpus_per_task"] == 2
    for bad in ("0", "a100:", "x:y"):
        with pytest.raises(UsageError, match="--gpus-per-task"):
            gsrun_spec(f"--gpus-per-task={bad}", "true")


def test_a_job_of_ntasks_per_gpu_binds_each_step_task_to_its_gpu() -> None:
    # sbatch --ntasks-per-gpu=1 (CT_NVAE's signal_interrupt.sh): srun's tasks get a GPU each under Slurm 22.05
    # (CUDA_VISIBLE_DEVICES=0, 1, 2, 3), as --ntasks-per-gpu implies --gpu-bind=single:N; they saw all four here.
    in_job = {"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_GPU": "1", "SLURM_GPUS_ON_NODE": "4"}
    spec = gsrun_spec("python", "train.py", environ=in_job)
    assert (spec["gpu_bind"], spec["gpu_bind_arg"]) == ("single", [1])
    # an explicit binding or a GPU count of the step's own stands
    assert gsrun_spec("--gpu-bind", "none", "true", environ=in_job)["gpu_bind"] == "none"
    assert gsrun_spec("--gpus-per-task", "1", "true", environ=in_job)["gpu_bind"] == ""
    assert gsrun_spec("true", environ={"SLURM_JOB_ID": "12"})["gpu_bind"] == ""
    # --gpus-per-task=1 in the job: the same, as srun takes SLURM_GPUS_PER_TASK (checked against Slurm 22.05)
    one_each = {"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", "SLURM_GPUS_PER_TASK": "1"}
    assert (gsrun_spec("true", environ=one_each)["gpu_bind"], gsrun_spec("true", environ=one_each)["gpu_bind_arg"]) \
        == ("single", [1])


def test_a_step_with_gres_none_or_gpu_0_holds_and_sees_no_gpus() -> None:
    # srun --gres=none (or --gres=gpu:0) inside a GPU job, as Slurm 22.05 runs it: CUDA_VISIBLE_DEVICES,
    # SLURM_STEP_GPUS and SLURM_GPUS_ON_NODE unset there; Garrison gives an empty CUDA_VISIBLE_DEVICES, which
    # hides every GPU from CUDA, since its steps share the job's device cgroup.
    in_job = {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS": "4"}
    for gres in ("none", "gpu:0", "NONE", "gpu:a100:0"):
        assert gsrun_spec(f"--gres={gres}", "-n", "2", "true", environ=in_job)["gpus_per_task"] == 0
    # Outside a job the allocation is asked for no GPUs (its --gres), the step no fewer than it has.
    assert gsrun_spec("--gres=none", "true").get("gpus_per_task") is None
    layout = place(ntasks=2, nodes=1, gpus_per_task=0)
    assert layout.nodes[0].task_gpus == ((), ()) and layout.nodes[0].held_gpus == ()
    # It holds nothing, so a step holding every GPU of the node runs beside it.
    assert place(ntasks=4, nodes=1, gpus_per_task=1).nodes[0].held_gpus == (0, 1, 2, 3)
    step = replace(launch(0), layout=layout, env={**launch(0).env, "SLURM_GPUS_ON_NODE": "4"})
    for plan in plan_step_tasks(step, "/io"):
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "" and "GPU_DEVICE_ORDINAL" not in plan.env
        assert "SLURM_STEP_GPUS" not in plan.env and "SLURM_GPUS_ON_NODE" not in plan.env


def test_a_steps_cpus_per_task_come_from_c_or_srun_cpus_per_task_and_its_tasks_see_them() -> None:
    # Slurm 22.05: srun takes -c from SRUN_CPUS_PER_TASK, never from the job's SLURM_CPUS_PER_TASK, and the
    # tasks' SLURM_CPUS_PER_TASK is the step's (checked on the anchor: `srun -c 3` in a -c 4 job prints 3).
    in_job = {"SLURM_JOB_ID": "12", "SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS": "1"}
    spec = gsrun_spec("-c", "3", "true", environ=in_job)
    assert spec["cpus_per_task"] == 3 and spec["env"]["SLURM_CPUS_PER_TASK"] == "3"
    spec = gsrun_spec("true", environ={**in_job, "SRUN_CPUS_PER_TASK": "2"})
    assert spec["cpus_per_task"] == 2 and spec["env"]["SLURM_CPUS_PER_TASK"] == "2"
    assert gsrun_spec("-c", "1", "true", environ={**in_job, "SRUN_CPUS_PER_TASK": "2"})["cpus_per_task"] == 1
    plain = gsrun_spec("true", environ=in_job)
    assert "cpus_per_task" not in plain and plain["env"]["SLURM_CPUS_PER_TASK"] == "4"
    with pytest.raises(UsageError, match="SRUN_CPUS_PER_TASK"):
        gsrun_spec("true", environ={**in_job, "SRUN_CPUS_PER_TASK": "many"})


def test_failed_tasks_are_named_per_node_as_srun_names_them() -> None:
    # Slurm 22.05's srun, checked on the anchor: "srun: error: gn1: task 0: Exited with exit code 2", then
    # "srun: error: gn1: tasks 0-1: Killed" for tasks that died of SIGKILL.
    assert task_failures(["n1"], 2, None, [2, 3]) == ["n1: task 0: Exited with exit code 2",
                                                      "n1: task 1: Exited with exit code 3"]
    assert task_failures(["n1", "n2"], 4, None, [137, 137, 0, 139]) == [
        "n1: tasks 0-1: Killed", "n2: task 3: Segmentation fault"]
    assert task_failures(["n1", "n2"], 3, None, [0, 0, 0]) == []
    assert task_failures([], 0, None, []) == [] and task_failures(["n1"], 2, None, [1]) == []


def test_gsrun_tres_per_task_is_c_and_gpus_per_task() -> None:
    spec = gsrun_spec("-n", "2", "--tres-per-task=cpu=3,gres/gpu:a100=1", "true")
    assert (spec["cpus_per_task"], spec["gpus_per_task"], spec["env"]["SLURM_CPUS_PER_TASK"]) == (3, 1, "3")
    assert gsrun_spec("--tres-per-task", "gres/gpu:2", "-c", "1", "true")["gpus_per_task"] == 2
    for bad in (["--tres-per-task=cpu=2", "-c", "3", "x"], ["--tres-per-task=gres/gpu=1", "--gpus-per-task=2", "x"],
                ["--tres-per-task=license/matlab=1", "x"]):
        with pytest.raises(UsageError, match="--tres-per-task"):
            gsrun_spec(*bad)


def test_an_srun_option_gsrun_lacks_is_named_as_srun_s() -> None:
    with pytest.raises(UsageError, match="--bcast: srun's option is not supported by gsrun"):
        gsrun_spec("--bcast=/tmp/x", "true")
    with pytest.raises(UsageError, match="--bcast-exclude: srun's option"):  # a unique prefix, as getopt reads it
        gsrun_spec("--bcast-ex=x", "true")


def test_gsrun_gres_gpu_memory_is_the_allocations_not_a_steps() -> None:
    in_job = {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "1"}
    assert "gpus_per_task" not in gsrun_spec("--gres=gpu:1,vmem:10G", "true", environ=in_job)
    assert "gpus_per_task" not in gsrun_spec("--gres=vmem:10G", "true", environ=in_job)


def test_gsrun_ntasks_per_gpu_packs_tasks_on_each_gpu() -> None:
    in_job = {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS": "1"}
    spec = gsrun_spec("--ntasks-per-gpu=2", "python", "main.py", environ=in_job)
    assert (spec["ntasks_per_node"], spec["gpu_bind"], spec["gpu_bind_arg"]) == (8, "single", [2])
    assert "ntasks" not in spec  # not the job's SLURM_NTASKS: two per GPU on every node
    assert gsrun_spec("--ntasks-per-gpu=1", "-n", "3", "x", environ=in_job)["ntasks"] == 3
    for bad in (["--ntasks-per-gpu=0", "x"], ["--ntasks-per-gpu=1", "--pty", "bash"]):
        with pytest.raises(UsageError, match="ntasks-per-gpu"):
            gsrun_spec(*bad, environ=in_job)
    with pytest.raises(UsageError, match="no GPUs here"):
        gsrun_spec("--ntasks-per-gpu=1", "x", environ={"SLURM_JOB_ID": "12"})


def test_gsrun_gpus_inside_a_job_are_the_steps() -> None:
    """`srun -n1 -G1 python a.py &`, several side by side: each step's task holds and sees one GPU, as under
    srun (here it once saw every GPU of the job, and all of them ran on the first)."""
    in_job = {"SLURM_JOB_ID": "12", "SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2"}
    assert gsrun_spec("-n1", "--gpus=1", "python", "a.py", environ=in_job)["gpus_per_task"] == 1
    assert gsrun_spec("-n1", "-G", "a100:2", "x", environ=in_job)["gpus_per_task"] == 2
    assert gsrun_spec("-n1", "--gpus-per-node=1", "x", environ=in_job)["gpus_per_task"] == 1
    assert gsrun_spec("-N2", "-n2", "--gpus=4", "x", environ=in_job)["gpus_per_task"] == 2  # shared out over nodes
    assert "gpus_per_task" not in gsrun_spec("--gpus-per-node=4", "x", environ=in_job)  # every GPU here: as is
    for bad, message in ((["--gpus=2", "x"], "--gpus=2 with several tasks on a node"),
                         (["-n1", "--gres=gpu:1", "--gpus=1", "x"], "give one of --gres and --gpus"),
                         (["-N2", "-n2", "--gpus=3", "x"], "over 2 nodes"),
                         (["-n1", "--gpus=1", "--gpus-per-task=1", "x"], "give either --gpus or --gpus-per-task")):
        with pytest.raises(UsageError, match=message):
            gsrun_spec(*bad, environ=in_job)
    # Outside a job they shape the allocation (gsrun_alloc), not a step.
    assert "gpus_per_task" not in gsrun_spec("-G", "1", "x", environ={})


def test_gsrun_output_files_are_truncated_unless_appending_is_asked_for(tmp_path: Any) -> None:
    """srun's --open-mode: truncate by default (Slurm's JobFileAppend=0), append when asked for, or when the job
    was (sbatch exports SLURM_OPEN_MODE); one file named by -o and -e is emptied once, then both append to it."""
    from garrison.cli.gsrun import _truncates

    out = tmp_path / "log"
    out.write_bytes(b"an earlier run\n")
    writer = OutputWriter(label=False, output=str(out), error=str(out), truncate=True)
    writer.write(0, 1, b"out\n")
    writer.write(0, 2, b"err\n")
    writer.close()
    assert out.read_bytes() == b"out\nerr\n"
    appending = OutputWriter(label=False, output=str(out), error="", truncate=False)
    appending.write(0, 1, b"more\n")
    appending.close()
    assert out.read_bytes() == b"out\nerr\nmore\n"
    per_task = OutputWriter(label=False, output=f"{tmp_path}/%t.out", error="", truncate=True)
    (tmp_path / "0.out").write_bytes(b"old")
    per_task.begin(12, 1, ["node1"], 1, None)
    per_task.write(0, 1, b"new")
    per_task.close()
    assert (tmp_path / "0.out").read_bytes() == b"new"
    assert _truncates(None, {}) and not _truncates(None, {"SLURM_OPEN_MODE": "a"})
    assert not _truncates(None, {"SLURM_RESTART_COUNT": "1"}) and _truncates(None, {"SLURM_OPEN_MODE": "t",
                                                                                  "SLURM_RESTART_COUNT": "1"})
    assert _truncates("truncate", {"SLURM_OPEN_MODE": "a"}) and not _truncates("append", {})
    assert _parser().parse_args(["--open-mode=append", "-o", "x", "true"]).open_mode == "append"


def test_a_steps_tasks_get_their_nodes_scratch_directory() -> None:
    """SLURM_TMPDIR is the job's attempt's directory on the task's own node (the batch script's, exported
    through gsrun, names the first node's); none where the job has none here."""
    inherited = replace(launch(1), env={**launch(1).env, "SLURM_TMPDIR": "/state/jobs/12.0/tmp-of-node1"})
    (task,) = plan_step_tasks(inherited, "/io", tmp_dir="/state/jobs/12.0/tmp")
    assert task.env["SLURM_TMPDIR"] == "/state/jobs/12.0/tmp"
    (task,) = plan_step_tasks(inherited, "/io")
    assert "SLURM_TMPDIR" not in task.env
