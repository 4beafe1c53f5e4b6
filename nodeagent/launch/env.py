"""From a launch description to each rank's process on this node: argv, environment, output files. Pure.

Per-rank mode gives every rank exactly the environment torchrun gives its workers (RANK, LOCAL_RANK,
GROUP_RANK, WORLD_SIZE, MASTER_ADDR, ... see docs/), so a scheduler-launched gang needs no torchrun.
CUDA_VISIBLE_DEVICES lists the node's allocated GPUs in local-rank order: entry LOCAL_RANK is the rank's
own GPU, as under torchrun (scripts call torch.cuda.set_device(LOCAL_RANK)).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from garrison.model.domain import Allocation, JobSpec, LaunchMode
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


def _resolve_output(pattern: str | None, launch: LaunchDescription, rank: int) -> str:
    """The rank's file by the one rule gjob shows too (garrison.model.outputpath)."""
    return resolve_output_path(
        pattern, workdir=launch.spec.workdir, job_id=launch.job_id, rank=rank, node_rank=launch.node_rank,
        array_job_id=launch.array_job_id, array_task_id=launch.array_task_id, user=launch.user,
        job_name=launch.spec.name,
    )


def plan_ranks(launch: LaunchDescription, paths: AttemptPaths, argv: Sequence[str]) -> list[RankPlan]:
    """Every rank this node starts for the attempt, with its complete environment."""
    spec = launch.spec
    nodes = launch.allocation.nodes
    counts = [ranks_on_node(spec, launch.allocation, i) for i in range(len(nodes))]
    local_count = counts[launch.node_rank]
    first_rank = sum(counts[: launch.node_rank])
    world = sum(counts)
    gpus = nodes[launch.node_rank].gpus

    common: dict[str, str] = dict(spec.env)
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
        stdout = _resolve_output(spec.output, launch, rank)
        stderr = _resolve_output(spec.error, launch, rank) if spec.error else stdout
        plans.append(RankPlan(rank=rank, argv=tuple(argv), env=env, cwd=spec.workdir, stdout=stdout, stderr=stderr))
    return plans
