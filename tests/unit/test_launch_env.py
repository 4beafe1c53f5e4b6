"""Each rank's environment, exactly as torchrun gives its workers (docs/distributed.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from garrison.model.domain import Allocation, JobSpec, LaunchMode, NodeAllocation
from garrison.model.jobspec import UNLIMITED_TIME_S
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.launch.env import AttemptPaths, RankPlan, cuda_device_numbers, plan_ranks

TORCHRUN_KEYS = {
    "RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


PATHS = AttemptPaths(error_file_dir="/var/job/user", checkpoint_dir="/home/u/.garrison/checkpoints/12",
                     checkpoint_mark="/var/job/user/checkpoint-mark", tmp_dir="/var/job/tmp")


def context(launch: LaunchMode = LaunchMode.RANK, node_rank: int = 1, env: dict[str, str] | None = None) -> LaunchDescription:
    spec = JobSpec(name="t", command=("train",), nodes=2, gpus_per_node=2, launch=launch, max_restarts=3,
                   workdir="/home/u", env=env or {"HOME": "/home/u"})
    allocation = Allocation((NodeAllocation("a", (4, 5)), NodeAllocation("b", (7, 2))))
    return LaunchDescription(job_id=12, attempt=2, user="u", uid=1000, gid=1000, spec=spec, allocation=allocation,
                             node_rank=node_rank, master_addr="10.0.0.1", master_port=29500, restart_count=2,
                             kill_wait_s=5.0, time_limit_s=60)


def plan(launch: LaunchDescription, argv: list[str]) -> list[RankPlan]:
    return plan_ranks(launch, PATHS, argv)


def test_rank_mode_gives_torchruns_worker_environment() -> None:
    ranks = plan(context(), ["train"])
    assert [r.rank for r in ranks] == [2, 3]
    env = ranks[1].env
    assert set(env) >= TORCHRUN_KEYS
    assert "TORCHELASTIC_USE_AGENT_STORE" not in env  # ranks would all be store clients with nobody hosting
    assert (env["RANK"], env["LOCAL_RANK"], env["ROLE_RANK"]) == ("3", "1", "3")
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("4", "2", "4")
    assert (env["GROUP_RANK"], env["NODE_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("1", "1", "2", "default")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert env["TORCHELASTIC_ERROR_FILE"] == "/var/job/user/error-3.json"
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    # Entry LOCAL_RANK of CUDA_VISIBLE_DEVICES is the rank's own GPU, in the allocation's order.
    assert env["CUDA_VISIBLE_DEVICES"] == "7,2"
    assert env["GARRISON_CHECKPOINT_DIR"] == "/home/u/.garrison/checkpoints/12"
    assert env["GARRISON_CHECKPOINT_MARK"] == "/var/job/user/checkpoint-mark"
    assert env["HOME"] == "/home/u" and env["GARRISON_JOB_ID"] == "12" and env["GARRISON_RESTART_COUNT"] == "2"


def test_behind_a_devices_cgroup_the_gpus_are_numbered_as_the_job_sees_them() -> None:
    """CUDA numbers the devices a process can open from 0, in the node's order: a job given GPUs 7 and 2 behind
    its devices cgroup has CUDA devices 0 (GPU 2) and 1 (GPU 7), so LOCAL_RANK 0's GPU 7 is "1". SLURM_JOB_GPUS
    keeps the node's indices, as Slurm's do under ConstrainDevices=yes."""
    for launch in (context(), context(LaunchMode.NODE), context(LaunchMode.SINGLE)):
        constrained = plan_ranks(launch, PATHS, ["train"], devices_constrained=True)
        for rank in constrained:
            assert rank.env["CUDA_VISIBLE_DEVICES"] == rank.env["GPU_DEVICE_ORDINAL"] == "1,0"
            assert rank.env["SLURM_JOB_GPUS"] == "2,7"
    first_node = plan_ranks(context(node_rank=0), PATHS, ["train"], devices_constrained=True)
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in first_node] == ["0,1", "0,1"]  # GPUs 4 and 5
    # CUDA told to number them in the bus order NVML's indices follow, unless the job chose an order itself.
    assert {r.env["CUDA_DEVICE_ORDER"] for r in first_node} == {"PCI_BUS_ID"}
    own = plan_ranks(context(env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}), PATHS, ["train"], devices_constrained=True)
    assert own[0].env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_device_numbers_follow_what_is_visible() -> None:
    assert cuda_device_numbers((7, 2), None) == "7,2"  # unconfined: the node's own indices
    assert cuda_device_numbers((5,), (2, 5)) == "1"
    assert cuda_device_numbers((), (2, 5)) == ""
    assert cuda_device_numbers((6, 3, 6), [6, 3]) == "1,0,1"
    with pytest.raises(ValueError, match="GPU 4 is not one of those the job may open on this node"):
        cuda_device_numbers((4,), (2, 5))


def test_a_job_exported_nothing_gets_its_users_login_variables_and_its_own_stand() -> None:
    login = {"HOME": "/home/u", "USER": "u", "LOGNAME": "u", "SHELL": "/bin/zsh"}
    launch = context(LaunchMode.SINGLE, node_rank=0, env={"X": "1"})
    none = replace(launch, spec=replace(launch.spec, env={}))  # --export=NONE: as Slurm's implied --get-user-env
    env = plan_ranks(none, PATHS, ["train"], defaults=login)[0].env
    assert {name: env[name] for name in login} == login and env["PATH"]
    own = replace(launch, spec=replace(launch.spec, env={"HOME": "/scratch/u", "SHELL": ""}))
    env = plan_ranks(own, PATHS, ["train"], defaults=login)[0].env
    assert (env["HOME"], env["SHELL"], env["USER"]) == ("/scratch/u", "", "u")  # the job's own, even empty, stand


def test_users_omp_setting_is_kept() -> None:
    env = plan(context(env={"OMP_NUM_THREADS": "8"}), ["train"])[0].env
    assert env["OMP_NUM_THREADS"] == "8"


def test_node_mode_is_one_process_per_node_without_rank_variables() -> None:
    ranks = plan(context(LaunchMode.NODE), ["torchrun", "train.py"])
    assert len(ranks) == 1
    env = ranks[0].env
    assert (env["GARRISON_NNODES"], env["GARRISON_NODE_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("2", "1", "7,2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert "RANK" not in env and "WORLD_SIZE" not in env


def test_single_mode_runs_once_on_the_first_node() -> None:
    assert len(plan(context(LaunchMode.SINGLE, node_rank=0), ["script"])) == 1
    assert plan(context(LaunchMode.SINGLE, node_rank=1), ["script"]) == []


def test_supervisor_spec_is_built_from_the_description_and_the_ranks() -> None:
    from garrison.nodeagent.jobs import supervisor_spec

    launch = context()
    ranks = plan(launch, ["train"])
    spec = supervisor_spec(launch, ranks, groups=[1000, 27], cpus=[0, 1], notify_socket="/run/notify.sock")
    assert (spec.job_id, spec.attempt, spec.uid, spec.gid, spec.user) == (12, 2, 1000, 1000, "u")
    assert (spec.groups, spec.cpus, spec.notify_socket, spec.kill_wait_s) == ([1000, 27], [0, 1], "/run/notify.sock", 5.0)
    assert [(r.rank, r.argv, r.env) for r in spec.ranks] == [(r.rank, list(r.argv), dict(r.env)) for r in ranks]


def slurm_context(launch: LaunchMode, node_rank: int = 0, **changes: object) -> LaunchDescription:
    from dataclasses import replace

    spec = JobSpec(name="train", command=(), script="#!/bin/sh\n", nodes=3, gpus_per_node=2, launch=launch,
                   workdir="/home/u/run", env={"HOME": "/home/u", "TORCHELASTIC_RUN_ID": "outer"},
                   submit_host="login1", qos="normal")
    allocation = Allocation((NodeAllocation("node1", (4, 5), cpus=(0, 1, 2, 3), mem_mb=90_000),
                             NodeAllocation("node2", (1, 0), cpus=(8, 9, 10, 11), mem_mb=90_000),
                             NodeAllocation("dgx7", (0, 1), cpus=(0, 1, 2, 3), mem_mb=90_000)))
    base = LaunchDescription(job_id=41, attempt=0, user="u", uid=1000, gid=1000, spec=spec, allocation=allocation,
                             node_rank=node_rank, master_addr="node1", master_port=29500, restart_count=1,
                             kill_wait_s=5.0, time_limit_s=600, account="physics", partition="gpu", qos="normal",
                             cluster_name="tiny")
    spec_changes = {k: v for k, v in changes.items() if k in ("ntasks_per_node", "ntasks", "cpus_per_task", "workdir",
                                                               "submit_dir", "gpus", "cpus_per_gpu")}
    others = {k: v for k, v in changes.items() if k not in spec_changes}
    return replace(base, spec=replace(spec, **spec_changes), **others)  # type: ignore[arg-type]


def test_batch_script_gets_slurms_job_variables() -> None:
    [rank] = plan(slurm_context(LaunchMode.SINGLE), ["script"])
    env = rank.env
    assert (env["SLURM_JOB_ID"], env["SLURM_JOBID"], env["SLURM_JOB_NAME"]) == ("41", "41", "train")
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "dgx7,node[1-2]"
    assert (env["SLURM_JOB_NUM_NODES"], env["SLURM_NNODES"]) == ("3", "3")
    assert env["SLURM_TASKS_PER_NODE"] == "1(x3)"  # sbatch's default: one task per node
    assert "SLURM_NTASKS" not in env and "SLURM_NTASKS_PER_NODE" not in env  # none asked for
    assert (env["SLURM_GPUS_ON_NODE"], env["SLURM_JOB_GPUS"], env["SLURM_CPUS_ON_NODE"]) == ("2", "4,5", "4")
    assert env["SLURM_MEM_PER_NODE"] == "90000"
    # GPU_DEVICE_ORDINAL (ROCm's, OpenCL's) is CUDA_VISIBLE_DEVICES's list, as Slurm 22.05 sets both
    assert env["GPU_DEVICE_ORDINAL"] == env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert env["SLURM_TOPOLOGY_ADDR_PATTERN"] == "node"
    assert (env["SLURM_SUBMIT_DIR"], env["SLURM_SUBMIT_HOST"]) == ("/home/u/run", "login1")
    # gsub -D elsewhere: the job runs there, and SLURM_SUBMIT_DIR still names where gsub ran, as in Slurm
    [moved] = plan(slurm_context(LaunchMode.SINGLE, workdir="/scratch/run", submit_dir="/home/u/run"), ["script"])
    assert (moved.cwd, moved.env["SLURM_SUBMIT_DIR"], moved.env["GARRISON_SUBMIT_DIR"]) == (
        "/scratch/run", "/home/u/run", "/home/u/run")
    assert (env["SLURM_JOB_PARTITION"], env["SLURM_JOB_ACCOUNT"], env["SLURM_JOB_QOS"]) == ("gpu", "physics", "normal")
    assert (env["SLURM_RESTART_COUNT"], env["SLURM_CLUSTER_NAME"]) == ("1", "tiny")
    # The batch shell is task 0 of the batch step, as slurmstepd tells it (Slurm 22.05 sets these four; Lightning's
    # SLURMEnvironment reads SLURM_PROCID wherever SLURM_NTASKS is set); no torchrun agent exists.
    assert {name: env[name] for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS")} == {
        "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_GTIDS": "0"}
    assert "SLURM_ARRAY_JOB_ID" not in env
    assert not [name for name in env if name.startswith("TORCHELASTIC_")]
    assert not {"SLURM_JOB_START_TIME", "SLURM_GPUS", "SLURM_CPUS_PER_GPU"} & set(env)  # none known or asked for


def test_start_and_end_times_and_the_gpus_asked_for_are_told_as_sbatch_tells_them() -> None:
    [rank] = plan(slurm_context(LaunchMode.SINGLE, start_time=1_700_000_000.7, gpus=6, cpus_per_gpu=8), ["script"])
    env = rank.env
    assert (env["SLURM_JOB_START_TIME"], env["SLURM_JOB_END_TIME"]) == ("1700000000", "1700000600")
    assert (env["SLURM_GPUS"], env["SLURM_CPUS_PER_GPU"]) == ("6", "8")
    # Without a time limit, a year on, as slurmctld records the end of a job without one.
    [rank] = plan(slurm_context(LaunchMode.SINGLE, start_time=1_700_000_000.0, time_limit_s=UNLIMITED_TIME_S),
                  ["script"])
    assert rank.env["SLURM_JOB_END_TIME"] == str(1_700_000_000 + 365 * 24 * 3600)
    # A first run has no SLURM_RESTART_COUNT, as under slurmd; a rerun has it.
    [first] = plan(slurm_context(LaunchMode.SINGLE, restart_count=0), ["script"])
    assert "SLURM_RESTART_COUNT" not in first.env and first.env["GARRISON_RESTART_COUNT"] == "0"


def test_ntasks_per_node_gives_the_job_its_task_counts_even_for_a_batch_script() -> None:
    [rank] = plan(slurm_context(LaunchMode.SINGLE, ntasks_per_node=4), ["script"])
    env = rank.env
    assert (env["SLURM_NTASKS"], env["SLURM_NPROCS"], env["SLURM_NTASKS_PER_NODE"]) == ("12", "12", "4")
    assert (env["SLURM_TASKS_PER_NODE"], env["SLURM_CPUS_PER_TASK"]) == ("4(x3)", "1")


def test_per_rank_launch_gives_each_rank_its_slurm_task_ids() -> None:
    ranks = plan(slurm_context(LaunchMode.RANK, node_rank=1), ["train"])
    ids = [(r.env["SLURM_PROCID"], r.env["SLURM_LOCALID"], r.env["SLURM_NODEID"]) for r in ranks]
    assert ids == [("2", "0", "1"), ("3", "1", "1")]
    assert (ranks[0].env["SLURM_NTASKS"], ranks[0].env["SLURM_TASKS_PER_NODE"]) == ("6", "2(x3)")
    assert ranks[0].env["SLURM_JOB_GPUS"] == "0,1"  # the node's GPU ids, sorted, as Slurm lists them
    assert ranks[0].env["TORCHELASTIC_RUN_ID"] == "garrison-41"  # ours, where Garrison stands in for torchrun


def test_node_launch_drops_inherited_torchelastic_variables() -> None:
    [rank] = plan(slurm_context(LaunchMode.NODE, node_rank=2), ["torchrun", "train.py"])
    assert not [name for name in rank.env if name.startswith("TORCHELASTIC_")]
    assert (rank.env["SLURM_PROCID"], rank.env["SLURM_NODEID"], rank.env["SLURM_NTASKS"]) == ("2", "2", "3")


def test_array_task_sees_its_array_index_set() -> None:
    launch = slurm_context(LaunchMode.SINGLE, array_job_id=40, array_task_id=3, array_task_count=4,
                           array_task_min=1, array_task_max=7, array_task_step=2)
    env = plan(launch, ["script"])[0].env
    assert (env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]) == ("40", "3")
    assert [env[f"SLURM_ARRAY_TASK_{k}"] for k in ("COUNT", "MIN", "MAX", "STEP")] == ["4", "1", "7", "2"]


def test_unbound_node_reports_the_agents_cpus() -> None:
    from dataclasses import replace

    launch = slurm_context(LaunchMode.SINGLE)
    bare = Allocation(tuple(replace(n, cpus=(), mem_mb=0) for n in launch.allocation.nodes))
    env = plan_ranks(replace(launch, allocation=bare), PATHS, ["script"], cpus_on_node=16)[0].env
    assert env["SLURM_CPUS_ON_NODE"] == "16" and "SLURM_CPUS_PER_TASK" not in env
    assert "SLURM_MEM_PER_NODE" not in env


def test_tasks_per_node_text_is_slurms_form() -> None:
    from garrison.nodeagent.launch.env import tasks_per_node_text

    assert tasks_per_node_text([4, 4, 2]) == "4(x2),2"
    assert tasks_per_node_text([1]) == "1"
    assert tasks_per_node_text([2, 1, 2]) == "2,1,2"


def test_ntasks_and_cpus_per_task_are_the_batch_scripts_counts_as_under_sbatch() -> None:
    [rank] = plan(slurm_context(LaunchMode.SINGLE, ntasks=8, cpus_per_task=6), ["script"])
    env = rank.env
    # -n 8 over 3 nodes, block-wise as sbatch lays them out: 3, 3, 2.
    assert (env["SLURM_NTASKS"], env["SLURM_TASKS_PER_NODE"], env["SLURM_CPUS_PER_TASK"]) == ("8", "3(x2),2", "6")
    assert "SLURM_NTASKS_PER_NODE" not in env


def test_batch_output_names_expand_the_node_and_the_batch_step_as_sbatch_does() -> None:
    # Real scripts' patterns (DynamicCascades.jl `--output=%x-%A_%a-%N.out`, ARCCA's `-o output-%A_%a-%J.o`):
    # sbatch gives %N the batch node's name and %J the job id; they were left as written before.
    launch = context(LaunchMode.SINGLE, node_rank=0)
    launch = replace(launch, spec=replace(launch.spec, output="%x-%j-%N.out", error="e-%J.err"))
    rank = plan(launch, ["train"])[0]
    assert rank.stdout == "/home/u/t-12-a.out"
    assert rank.stderr == "/home/u/e-12.err"


def test_a_cpu_job_is_not_told_of_gpus_and_memory_variables_name_the_option_given() -> None:
    # As slurmd sets them (checked against Slurm 22.05 with scribble's hello.sh and ARCCA's array scripts):
    # a job without GPUs has no SLURM_GPUS_ON_NODE/SLURM_JOB_GPUS (a `${SLURM_GPUS_ON_NODE:-1}` found 0 here),
    # --mem-per-cpu gives SLURM_MEM_PER_CPU (not _PER_NODE), and --ntasks-per-gpu and --open-mode are passed on.
    from dataclasses import replace

    launch = slurm_context(LaunchMode.SINGLE)
    cpu_only = Allocation(tuple(replace(n, gpus=()) for n in launch.allocation.nodes))
    spec = replace(launch.spec, gpus_per_node=None, mem_per_cpu_mb=1024, open_mode="append")
    env = plan(replace(launch, spec=spec, allocation=cpu_only), ["script"])[0].env
    assert "SLURM_GPUS_ON_NODE" not in env and "SLURM_JOB_GPUS" not in env
    assert env["SLURM_MEM_PER_CPU"] == "1024" and "SLURM_MEM_PER_NODE" not in env
    assert env["SLURM_OPEN_MODE"] == "a"

    per_gpu = replace(launch.spec, mem_per_gpu_mb=8192, ntasks_per_gpu=1)
    env = plan(replace(launch, spec=per_gpu), ["script"])[0].env
    assert env["SLURM_MEM_PER_GPU"] == "8192" and "SLURM_MEM_PER_NODE" not in env
    assert env["SLURM_NTASKS_PER_GPU"] == "1" and env["SLURM_GPUS_ON_NODE"] == "2"
    env = plan(replace(launch, spec=replace(launch.spec, gpus_per_task=1)), ["script"])[0].env
    assert env["SLURM_GPUS_PER_TASK"] == "1"
    assert "SLURM_OPEN_MODE" not in env


def test_each_rank_is_told_its_attempts_scratch_directory_whatever_the_submitter_exported() -> None:
    ranks = plan(context(LaunchMode.SINGLE, node_rank=0, env={"HOME": "/home/u", "SLURM_TMPDIR": "/old"}),
                 ["script"])
    assert [rank.env["SLURM_TMPDIR"] for rank in ranks] == ["/var/job/tmp"]


def test_a_job_submitted_from_inside_another_keeps_none_of_its_job_variables() -> None:
    """A job that submits its successor (or a pipeline's next stage) exports its own SLURM_* job variables with
    everything else: the new job's are its own, and those it does not set are gone, not the submitter's (its
    array index in a job that is no array task, its task count as every srun's default, its restart count
    in a first run). Variables a user sets for srun on purpose stay."""
    submitters = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_JOB_ID": "77", "SLURM_NTASKS": "8", "SLURM_NPROCS": "8",
                  "SLURM_RESTART_COUNT": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_GPUS": "0,1,2,3",
                  "SLURM_GPUS_ON_NODE": "4", "SLURM_MEM_PER_CPU": "100", "SLURM_TASK_PID": "99",
                  "SLURM_TMPDIR": "/old", "GARRISON_ARRAY_TASK_ID": "5", "SLURM_CPU_BIND": "none",
                  "SLURM_MPI_TYPE": "pmix", "HOME": "/home/u"}
    [rank] = plan(context(LaunchMode.SINGLE, node_rank=0, env=submitters), ["script"])
    env = rank.env
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_ID",
                 "SLURM_MEM_PER_CPU", "SLURM_TASK_PID", "GARRISON_ARRAY_TASK_ID"):
        assert name not in env, name
    assert (env["SLURM_RESTART_COUNT"], env["SLURM_JOB_ID"], env["SLURM_TMPDIR"]) == ("2", "12", "/var/job/tmp")
    assert (env["SLURM_GPUS_ON_NODE"], env["SLURM_JOB_GPUS"]) == ("2", "4,5")  # its own
    assert (env["SLURM_CPU_BIND"], env["SLURM_MPI_TYPE"]) == ("none", "pmix")
