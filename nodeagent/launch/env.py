"""From a launch description to each rank's process on this node: argv, environment, output files. Pure.

Per-rank mode gives every rank exactly the environment torchrun gives its workers (RANK, LOCAL_RANK,
GROUP_RANK, WORLD_SIZE, MASTER_ADDR, ... see docs/), so a scheduler-launched gang needs no torchrun.
CUDA_VISIBLE_DEVICES lists the node's allocated GPUs in local-rank order: entry LOCAL_RANK is the rank's
own GPU, as under torchrun (scripts call torch.cuda.set_device(LOCAL_RANK)). Behind a devices cgroup it numbers
them as the job's processes see them, from 0 (``cuda_device_numbers``).

Every launch also gets Slurm's variables (SLURM_JOB_ID, SLURM_JOB_NODELIST, ... as sbatch sets them, see
docs/quickstart.md), so Slurm batch scripts run unchanged. TORCHELASTIC_* are set only where Garrison stands in
for torchrun's agent (per-rank launches): Lightning takes their presence for a torchrun job.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from garrison.model.domain import Allocation, JobSpec, LaunchMode
from garrison.model.hostlist import compress_hostlist
from garrison.model.jobspec import without_credentials
from garrison.model.launch import LaunchDescription
from garrison.model.outputpath import resolve_output_path

# Slurm's job variables are the shared vocabulary's (galloc gives them to its command on the submit host).
from garrison.model.slurmenv import JOB_DESCRIBING_VARIABLES
from garrison.model.slurmenv import slurm_environment as slurm_environment
from garrison.model.slurmenv import tasks_per_node_text as tasks_per_node_text
from garrison.model.steps import StepLaunchDescription
from garrison.slurmpath import DEFAULT_PATH, with_slurm_path


@dataclass(frozen=True, slots=True)
class AttemptPaths:
    """The agent-local paths of one attempt, which the controller's launch description cannot know."""

    error_file_dir: str = ""  # where TORCHELASTIC_ERROR_FILE points, per rank
    checkpoint_dir: str = ""  # stable across requeues: where the job keeps its checkpoints
    checkpoint_mark: str = ""  # touching it tells the scheduler work so far is saved (gcheckpoint)
    tmp_dir: str = ""  # the attempt's own scratch directory on this node (SLURM_TMPDIR), removed when it ends


@dataclass(frozen=True, slots=True)
class RankPlan:
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdout: str
    stderr: str


def checkpoint_dir_for(spec: JobSpec, job_id: int) -> str:
    """The same directory for every attempt of a job (the submit directory is shared, as under Slurm)."""
    return os.path.join(spec.workdir, ".garrison", "checkpoints", str(job_id))


def ranks_on_node(spec: JobSpec, allocation: Allocation, node_rank: int) -> int:
    if spec.launch == LaunchMode.SINGLE:
        return 1 if node_rank == 0 else 0
    if spec.launch == LaunchMode.ALLOCATION:
        return 0  # galloc's allocation runs nothing itself: every node holds a placeholder
    if spec.launch == LaunchMode.NODE:
        return 1
    if spec.ntasks_per_node is not None:
        return spec.ntasks_per_node
    return max(1, len(allocation.nodes[node_rank].gpus))


def _resolve_output(pattern: str | None, launch: LaunchDescription, rank: int) -> str:
    """The rank's file by the one rule gjob shows too (garrison.model.outputpath)."""
    return resolve_output_path(
        pattern, workdir=launch.spec.workdir, job_id=launch.job_id, rank=rank, node_rank=launch.node_rank,
        array_job_id=launch.array_job_id, array_task_id=launch.array_task_id, user=launch.user,
        job_name=launch.spec.name, node_name=launch.node,
    )


def with_node_defaults(env: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
    """``env`` with what the node supplies where it lacks it (``defaults``, from ``nodeagent.jobs.node_defaults``:
    the job user's HOME, USER, LOGNAME and SHELL from the node's user database, and where the controller is), and
    a PATH. A job submitted with ``--export=NONE`` has none of the submitter's variables; Slurm then loads the
    user's login environment (an implied ``--get-user-env``), scripts that ``cd $HOME/...`` rely on it, and
    ``srun`` inside it must still find the controller. A variable the job's environment has, even empty, stands."""
    result = dict(env)
    for name, value in defaults.items():
        if name not in result and value:
            result[name] = value
    result.setdefault("PATH", DEFAULT_PATH)
    return result


def cuda_device_numbers(gpus: Sequence[int], visible: Collection[int] | None) -> str:
    """CUDA_VISIBLE_DEVICES (and GPU_DEVICE_ORDINAL) naming ``gpus``, the node's GPU indices, in their order,
    for processes that can open only the GPUs of ``visible`` (their devices cgroup's); None: every GPU of
    the node, which they then see under the node's own indices.

    Why: CUDA (and NVML, nvidia-smi) numbers the devices a process can open from 0, in the node's order. A job
    given GPUs 2 and 5 behind its devices cgroup has CUDA devices 0 and 1, and CUDA_VISIBLE_DEVICES=2,5 would
    name devices it does not have ("no CUDA-capable device is detected"). Slurm numbers them the same way
    under ConstrainDevices=yes (its gres_use_local_device_index), and keeps the node's indices in
    SLURM_JOB_GPUS and SLURM_STEP_GPUS, as Garrison does."""
    if visible is None:
        return ",".join(str(gpu) for gpu in gpus)
    position = {gpu: index for index, gpu in enumerate(sorted(set(visible)))}
    missing = [gpu for gpu in gpus if gpu not in position]
    if missing:  # never, by construction: a step's GPUs are its job's
        raise ValueError(f"GPU {missing[0]} is not one of those the job may open on this node "
                         f"({','.join(str(gpu) for gpu in sorted(position)) or 'none'})")
    return ",".join(str(position[gpu]) for gpu in gpus)


# CUDA's own order is fastest first; NVML's indices (and so the numbers above) follow the PCI bus. Told to
# follow the bus too, CUDA numbers a node's GPUs as NVML does even where they are not all alike (an A100 beside
# a T4). A job's own setting stands.
CUDA_DEVICE_ORDER = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def plan_ranks(
    launch: LaunchDescription, paths: AttemptPaths, argv: Sequence[str], cpus_on_node: int = 0,
    slurm_path: str | None = None, defaults: Mapping[str, str] | None = None, devices_constrained: bool = False,
) -> list[RankPlan]:
    """Every rank this node starts for the attempt, with its complete environment. ``cpus_on_node``: the
    node's CPUs, for SLURM_CPUS_ON_NODE when the scheduler bound none; ``slurm_path``: the directory of Slurm's
    command names (garrison.slurmpath), put first on the PATH; ``defaults``: what the node supplies where the
    job's environment lacks it (``with_node_defaults``); ``devices_constrained``: the attempt's devices cgroup
    lets its processes open only its GPUs (``cuda_device_numbers``)."""
    spec = launch.spec
    nodes = launch.allocation.nodes
    counts = [ranks_on_node(spec, launch.allocation, i) for i in range(len(nodes))]
    local_count = counts[launch.node_rank]
    first_rank = sum(counts[: launch.node_rank])
    world = sum(counts)
    gpus = nodes[launch.node_rank].gpus

    # Also here, not only in gsub: a job queued by an older gsub, or a client that is not gsub.
    common: dict[str, str] = with_slurm_path(with_node_defaults(without_credentials(spec.env), defaults or {}),
                                             slurm_path)
    if spec.launch != LaunchMode.RANK:
        # Exported from a submitting torchrun worker, they would make Lightning take the job for torchrun's.
        for name in [name for name in common if name.startswith("TORCHELASTIC_")]:
            del common[name]
    # A submitting job's own (this job sets its own below, where they apply): slurmenv.JOB_DESCRIBING_VARIABLES.
    for name in JOB_DESCRIBING_VARIABLES.intersection(common):
        del common[name]
    common.update(slurm_environment(launch, counts, cpus_on_node))
    common.update(
        {
            "GARRISON_JOB_ID": str(launch.job_id),
            "GARRISON_JOB_NAME": spec.name,
            "GARRISON_ATTEMPT": str(launch.attempt),
            "GARRISON_RESTART_COUNT": str(launch.restart_count),
            "GARRISON_JOB_USER": launch.user,
            "GARRISON_NODELIST": ",".join(launch.allocation.node_names),
            "GARRISON_NNODES": str(len(nodes)),
            "GARRISON_NODE_RANK": str(launch.node_rank),
            "GARRISON_NODENAME": nodes[launch.node_rank].node,
            "GARRISON_GPUS_ON_NODE": str(len(gpus)),
            "GARRISON_TIME_LIMIT": str(launch.time_limit_s),
            "GARRISON_SUBMIT_DIR": spec.submit_dir or spec.workdir,
            "CUDA_VISIBLE_DEVICES": cuda_device_numbers(gpus, gpus if devices_constrained else None),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
        }
    )
    if paths.checkpoint_dir:
        common["GARRISON_CHECKPOINT_DIR"] = paths.checkpoint_dir
    if gpus:  # ROCm's and OpenCL's name for the same list, as Slurm sets it beside CUDA_VISIBLE_DEVICES
        common["GPU_DEVICE_ORDINAL"] = common["CUDA_VISIBLE_DEVICES"]
        common.setdefault(*CUDA_DEVICE_ORDER)
    else:
        common.pop("GPU_DEVICE_ORDINAL", None)  # a submitting job's, exported: this one has no GPUs
    if paths.checkpoint_mark:
        common["GARRISON_CHECKPOINT_MARK"] = paths.checkpoint_mark
    if paths.tmp_dir:
        # Where scripts written for the Alliance's (Compute Canada's) clusters put a job's virtualenv and data
        # (`virtualenv $SLURM_TMPDIR/env`): node-local, the job's own, gone when it ends. Always this attempt's,
        # never one exported from where gsub ran.
        common["SLURM_TMPDIR"] = paths.tmp_dir
    if launch.array_job_id is not None and launch.array_task_id is not None:
        common["GARRISON_ARRAY_JOB_ID"] = str(launch.array_job_id)
        common["GARRISON_ARRAY_TASK_ID"] = str(launch.array_task_id)
    if spec.launch == LaunchMode.RANK:
        common.update(
            {
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(local_count),
                "GROUP_RANK": str(launch.node_rank),
                "NODE_RANK": str(launch.node_rank),
                "GROUP_WORLD_SIZE": str(len(nodes)),
                "ROLE_NAME": "default",
                "ROLE_WORLD_SIZE": str(world),
                "TORCHELASTIC_RUN_ID": f"garrison-{launch.job_id}",
                "TORCHELASTIC_RESTART_COUNT": str(launch.restart_count),
                "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
            }
        )
        if local_count > 1 and "OMP_NUM_THREADS" not in spec.env:
            common["OMP_NUM_THREADS"] = "1"
    plans = []
    for local_rank in range(local_count):
        rank = first_rank + local_rank
        env = dict(common)
        if spec.launch == LaunchMode.RANK:
            env.update({"RANK": str(rank), "LOCAL_RANK": str(local_rank), "ROLE_RANK": str(rank)})
            if paths.error_file_dir:
                env["TORCHELASTIC_ERROR_FILE"] = os.path.join(paths.error_file_dir, f"error-{rank}.json")
        env["GARRISON_PROCID"] = str(rank)
        env["GARRISON_LOCALID"] = str(local_rank)
        if spec.launch != LaunchMode.SINGLE:
            # A per-rank or per-node launch is a step's tasks, as srun starts them.
            env.update({"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local_rank),
                        "SLURM_NODEID": str(launch.node_rank)})
        else:
            # The batch script is task 0 of the batch step on the first node, as slurmstepd tells it: Lightning's
            # SLURMEnvironment (chosen wherever SLURM_NTASKS is set, e.g. #SBATCH --ntasks=1) reads SLURM_PROCID
            # for the global rank and failed with a KeyError without it.
            env.update(BATCH_TASK_VARIABLES)
        stdout = _resolve_output(spec.output, launch, rank)
        stderr = _resolve_output(spec.error, launch, rank) if spec.error else stdout
        plans.append(RankPlan(rank=rank, argv=tuple(argv), env=env, cwd=spec.workdir, stdout=stdout, stderr=stderr))
    return plans


# What slurmstepd sets for the batch script (checked against Slurm 22.05): it is the batch step's one task.
BATCH_TASK_VARIABLES = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_GTIDS": "0"}


# ---------------------------------------------------------------------------------------------------------
# Job steps (gsrun): srun's task environment


def plan_step_tasks(step: StepLaunchDescription, io_dir: str, slurm_path: str | None = None,
                    defaults: Mapping[str, str] | None = None,
                    visible_gpus: Collection[int] | None = None, tmp_dir: str | None = None) -> list[RankPlan]:
    """This node's tasks of a step, each with the environment srun gives a task: gsrun's (as --export
    resolved it), then Slurm's step variables and torchrun's worker variables (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT of the step's first node unless the job's environment sets
    them), and CUDA_VISIBLE_DEVICES for
    the task's GPUs, numbered as its processes see them: ``visible_gpus`` are the GPUs the job's devices cgroup
    lets them open on this node, None where every GPU is visible (``cuda_device_numbers``). Output goes to
    ``io_dir`` (out-TASK, err-TASK), from where the agent streams it. ``tmp_dir``: the job's attempt's scratch
    directory on this node (SLURM_TMPDIR: this node's, not the one the batch script was given on the first)."""
    layout = step.layout
    here = step.here
    counts = layout.tasks_per_node()
    names = compress_hostlist(layout.node_names)
    common: dict[str, str] = with_slurm_path(with_node_defaults(
        {k: v for k, v in step.env.items() if not k.startswith("TORCHELASTIC_")}, defaults or {}), slurm_path)
    common.update({
        "SLURM_STEP_ID": str(step.step_id),
        "SLURM_STEPID": str(step.step_id),
        "SLURM_STEP_NODELIST": names,
        "SLURM_STEP_NUM_NODES": str(len(layout.nodes)),
        "SLURM_STEP_NUM_TASKS": str(layout.ntasks),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_NTASKS": str(layout.ntasks),
        "SLURM_NPROCS": str(layout.ntasks),
        # The step's own, as srun and slurmstepd set them (SLURM_JOB_NUM_NODES and SLURM_JOB_NODELIST stay the
        # job's): Lightning takes the head node from SLURM_NODELIST where no MASTER_ADDR is set.
        "SLURM_NNODES": str(len(layout.nodes)),
        "SLURM_NODELIST": names,
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_NODEID": str(step.node_index),
        "SLURM_GTIDS": ",".join(str(task) for task in here.tasks),  # this node's tasks, as slurmstepd lists them
        "SLURMD_NODENAME": here.node,
        "SLURM_TOPOLOGY_ADDR": here.node,
        "SLURM_JOB_ID": str(step.job_id),
        "SLURM_JOBID": str(step.job_id),
        "GARRISON_JOB_ID": str(step.job_id),
        "GARRISON_STEP_ID": str(step.step_id),
        "GARRISON_NODENAME": here.node,
        "MASTER_ADDR": step.master_addr,
        "MASTER_PORT": str(step.master_port),
        "WORLD_SIZE": str(layout.ntasks),
        "LOCAL_WORLD_SIZE": str(len(here.tasks)),
        "GROUP_RANK": str(step.node_index),
        "NODE_RANK": str(step.node_index),
    })
    if tmp_dir:
        common["SLURM_TMPDIR"] = tmp_dir
    else:
        common.pop("SLURM_TMPDIR", None)  # the first node's, inherited: no such directory here
    # srun itself sets no MASTER_ADDR/MASTER_PORT: a script that exports its own (MASTER_PORT=6000 before
    # `srun python train.py`) has its tasks meet there, as under Slurm.
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if step.env.get(name):
            common[name] = step.env[name]
    # The step's GPUs on this node: those it holds, or (a step that holds none) the job's its tasks see, as
    # slurmstepd names them on every node (the batch's SLURM_JOB_GPUS names the first node's).
    step_gpus = here.held_gpus or sorted({g for gpus in here.task_gpus for g in gpus})
    if step_gpus:
        common["SLURM_STEP_GPUS"] = ",".join(str(g) for g in step_gpus)
        # The step's count on this node, as slurmstepd sets it (torchrun --nproc_per_node=$SLURM_GPUS_ON_NODE
        # inside `srun --gpus-per-task=1` must not start the job's count of workers).
        common["SLURM_GPUS_ON_NODE"] = common["GARRISON_GPUS_ON_NODE"] = str(len(step_gpus))
        common.setdefault(*CUDA_DEVICE_ORDER)
    else:  # a step without GPUs (srun --gres=none) is not told the job's count, as slurmstepd does not
        for name in ("SLURM_GPUS_ON_NODE", "GARRISON_GPUS_ON_NODE"):
            common.pop(name, None)
    plans = []
    for local, task in enumerate(here.tasks):
        env = dict(common)
        env.update({
            "SLURM_PROCID": str(task), "SLURM_LOCALID": str(local), "RANK": str(task), "LOCAL_RANK": str(local),
            "GARRISON_PROCID": str(task), "GARRISON_LOCALID": str(local),
            "CUDA_VISIBLE_DEVICES": cuda_device_numbers(here.task_gpus[local], visible_gpus),
        })
        if here.task_gpus[local]:
            env["GPU_DEVICE_ORDINAL"] = env["CUDA_VISIBLE_DEVICES"]
        else:
            env.pop("GPU_DEVICE_ORDINAL", None)  # the job's, inherited: this task has none
        plans.append(RankPlan(rank=task, argv=tuple(step.argv), env=env, cwd=step.cwd,
                              stdout=os.path.join(io_dir, f"out-{task}"), stderr=os.path.join(io_dir, f"err-{task}")))
    return plans
