"""From a launch description to each rank's process on this node: argv, environment, output files. Pure.

Per-rank mode gives every rank exactly the environment torchrun gives its workers (RANK, LOCAL_RANK,
GROUP_RANK, WORLD_SIZE, MASTER_ADDR, ... see docs/), so a scheduler-launched gang needs no torchrun.
CUDA_VISIBLE_DEVICES lists the node's allocated GPUs in local-rank order: entry LOCAL_RANK is the rank's
own GPU, as under torchrun (scripts call torch.cuda.set_device(LOCAL_RANK)).

Every launch also gets Slurm's variables (SLURM_JOB_ID, SLURM_JOB_NODELIST, ... as sbatch sets them, see
docs/quickstart.md), so Slurm batch scripts run unchanged. TORCHELASTIC_* are set only where Garrison stands in
for torchrun's agent (per-rank launches): Lightning takes their presence for a torchrun job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from garrison.model.domain import Allocation, JobSpec, LaunchMode
from garrison.model.hostlist import compress_hostlist
from garrison.model.launch import LaunchDescription
from garrison.model.outputpath import resolve_output_path


@dataclass(frozen=True, slots=True)
class AttemptPaths:
    """The agent-local paths of one attempt, which the controller's launch description cannot know."""

    error_file_dir: str = ""  # where TORCHELASTIC_ERROR_FILE points, per rank
    checkpoint_dir: str = ""  # stable across requeues: where the job keeps its checkpoints
    checkpoint_mark: str = ""  # touching it tells the scheduler work so far is saved (gcheckpoint)


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
    if spec.launch == LaunchMode.NODE:
        return 1
    if spec.ntasks_per_node is not None:
        return spec.ntasks_per_node
    return max(1, len(allocation.nodes[node_rank].gpus))


def tasks_per_node_text(counts: Sequence[int]) -> str:
    """Slurm's SLURM_TASKS_PER_NODE form: [4, 4, 2] -> "4(x2),2"."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(parts)


def slurm_environment(launch: LaunchDescription, counts: Sequence[int], cpus_on_node: int) -> dict[str, str]:
    """The variables sbatch gives a batch job (and srun its tasks, for the counts), from the launch.

    ``counts`` are the ranks each node starts. A batch script (``--launch single``) starts one process,
    but its job has as many tasks as it asked for: ``--ntasks-per-node`` on every node, as under sbatch
    (SLURM_NTASKS is then set), else one per node. ``cpus_on_node`` stands in when the scheduler bound
    no CPUs (the job then has all of the node's).
    """
    spec = launch.spec
    nodes = launch.allocation.nodes
    here = nodes[launch.node_rank]
    names = compress_hostlist(launch.allocation.node_names)
    if spec.launch == LaunchMode.SINGLE:
        if spec.ntasks_per_node is None and spec.ntasks is not None:
            # -n alone: sbatch's block distribution, the first nodes taking one more when it does not divide.
            share, extra = divmod(spec.ntasks, len(nodes))
            tasks = [share + (1 if index < extra else 0) for index in range(len(nodes))]
        else:
            tasks = [spec.ntasks_per_node or 1] * len(nodes)
        ntasks_known = spec.ntasks_per_node is not None or spec.ntasks is not None
    else:
        tasks = list(counts)
        ntasks_known = True
    cpus = len(here.cpus) or cpus_on_node
    env = {
        "SLURM_JOB_ID": str(launch.job_id),
        "SLURM_JOBID": str(launch.job_id),
        "SLURM_JOB_NAME": spec.name,
        "SLURM_JOB_USER": launch.user,
        "SLURM_JOB_UID": str(launch.uid),
        "SLURM_JOB_GID": str(launch.gid),
        "SLURM_JOB_NODELIST": names,
        "SLURM_NODELIST": names,
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "SLURM_NNODES": str(len(nodes)),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(tasks),
        "SLURM_JOB_CPUS_PER_NODE": tasks_per_node_text([len(n.cpus) or cpus_on_node for n in nodes]),
        "SLURM_CPUS_ON_NODE": str(cpus),
        "SLURM_GPUS_ON_NODE": str(len(here.gpus)),
        "SLURM_JOB_GPUS": ",".join(str(g) for g in sorted(here.gpus)),
        "SLURMD_NODENAME": here.node,
        "SLURM_TOPOLOGY_ADDR": here.node,
        "SLURM_SUBMIT_DIR": spec.workdir,
        "SLURM_RESTART_COUNT": str(launch.restart_count),
        "SLURM_JOB_PARTITION": launch.partition,
        "SLURM_JOB_ACCOUNT": launch.account,
        "SLURM_CLUSTER_NAME": launch.cluster_name,
    }
    if ntasks_known:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(sum(tasks))
    if spec.ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(spec.ntasks_per_node)
    if spec.cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(spec.cpus_per_task)  # -c, as sbatch sets it
    elif here.cpus and tasks[launch.node_rank]:
        # The CPUs bound on this node, shared out among its tasks (Slurm sets it for -c).
        env["SLURM_CPUS_PER_TASK"] = str(max(1, len(here.cpus) // tasks[launch.node_rank]))
    if spec.gpus_per_node is not None:
        env["SLURM_GPUS_PER_NODE"] = str(spec.gpus_per_node)
    if here.mem_mb:
        env["SLURM_MEM_PER_NODE"] = str(here.mem_mb)
    if spec.submit_host:
        env["SLURM_SUBMIT_HOST"] = spec.submit_host
    if launch.qos:
        env["SLURM_JOB_QOS"] = launch.qos
    if launch.array_job_id is not None and launch.array_task_id is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(launch.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(launch.array_task_id)
        if launch.array_task_count:
            env["SLURM_ARRAY_TASK_COUNT"] = str(launch.array_task_count)
            env["SLURM_ARRAY_TASK_MIN"] = str(launch.array_task_min)
            env["SLURM_ARRAY_TASK_MAX"] = str(launch.array_task_max)
            env["SLURM_ARRAY_TASK_STEP"] = str(launch.array_task_step)
    return env


def _resolve_output(pattern: str | None, launch: LaunchDescription, rank: int) -> str:
    """The rank's file by the one rule gjob shows too (garrison.model.outputpath)."""
    return resolve_output_path(
        pattern, workdir=launch.spec.workdir, job_id=launch.job_id, rank=rank, node_rank=launch.node_rank,
        array_job_id=launch.array_job_id, array_task_id=launch.array_task_id, user=launch.user,
        job_name=launch.spec.name,
    )


def plan_ranks(
    launch: LaunchDescription, paths: AttemptPaths, argv: Sequence[str], cpus_on_node: int = 0
) -> list[RankPlan]:
    """Every rank this node starts for the attempt, with its complete environment. ``cpus_on_node``: the
    node's CPUs, for SLURM_CPUS_ON_NODE when the scheduler bound none."""
    spec = launch.spec
    nodes = launch.allocation.nodes
    counts = [ranks_on_node(spec, launch.allocation, i) for i in range(len(nodes))]
    local_count = counts[launch.node_rank]
    first_rank = sum(counts[: launch.node_rank])
    world = sum(counts)
    gpus = nodes[launch.node_rank].gpus

    common: dict[str, str] = dict(spec.env)
    if spec.launch != LaunchMode.RANK:
        # Exported from a submitting torchrun worker, they would make Lightning take the job for torchrun's.
        for name in [name for name in common if name.startswith("TORCHELASTIC_")]:
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
            "GARRISON_SUBMIT_DIR": spec.workdir,
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
        }
    )
    if paths.checkpoint_dir:
        common["GARRISON_CHECKPOINT_DIR"] = paths.checkpoint_dir
    if paths.checkpoint_mark:
        common["GARRISON_CHECKPOINT_MARK"] = paths.checkpoint_mark
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
        stdout = _resolve_output(spec.output, launch, rank)
        stderr = _resolve_output(spec.error, launch, rank) if spec.error else stdout
        plans.append(RankPlan(rank=rank, argv=tuple(argv), env=env, cwd=spec.workdir, stdout=stdout, stderr=stderr))
    return plans
