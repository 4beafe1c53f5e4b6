"""What a user asks for: ``JobSpec`` and its ``LaunchMode``.

Apart from garrison/model/domain.py (which re-exports both) because gsub builds a JobSpec on every call and the
other domain types cost it ~8 ms of dataclass creation at import. Plain values, no I/O; the controller
validates them (validate.py), never trusting the CLI.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

# Garrison's own credentials in a submitter's environment: never part of a job's. A job's environment is
# on disk on its nodes and in the queue; a token in it speaks for its user to anyone who reads it there.
# (GARRISON_TOKEN_FILE is only a path to the user's own 0600 file, and lets a job's gsub authenticate.)
CREDENTIAL_VARIABLES = frozenset({"GARRISON_TOKEN"})


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less Garrison's credentials (CREDENTIAL_VARIABLES)."""
    return {name: value for name, value in env.items() if name not in CREDENTIAL_VARIABLES}


class LaunchMode(enum.StrEnum):
    RANK = "rank"  # one process per allocated GPU (or --ntasks-per-node)
    NODE = "node"  # one process per node
    SINGLE = "single"  # once, on the first node, like an sbatch script
    # Nothing: the allocation is held for galloc (salloc), whose command runs on the submitting host, and
    # for the steps started in it. Never given to gsub --launch.
    ALLOCATION = "allocation"


# sbatch --time=UNLIMITED (INFINITE, 0): "no time limit imposed", which the partition's (and the QoS's) maximum
# bounds; the controller puts that maximum in its place when it accepts the job.
UNLIMITED_TIME_S = 2**31 - 1


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user asked for, validated by the controller (never trusted from the CLI)."""

    name: str
    command: tuple[str, ...]  # argv of each rank; a script is written to disk and run by path
    script: str | None = None  # batch script text, when submitted as a script
    nodes: int | None = None  # -N; None lets the scheduler choose the spread
    gpus: int | None = None  # -G total
    gpus_per_node: int | None = None
    gpu_type: str | None = None  # "a100" from --gpus a100:2, matched against the GPU name
    gpu_mem_mb: int = 0  # --gpu-mem: the least memory (MiB) each allocated GPU must have
    cpus_per_gpu: int = 0
    mem_mb: int = 0
    time_limit_s: int | None = None  # None: the partition default; UNLIMITED_TIME_S: its (and the QoS's) maximum
    account: str | None = None
    partition: str | None = None
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None  # pattern, %j %t %n %A %a expanded by the agent
    error: str | None = None
    launch: LaunchMode = LaunchMode.RANK
    ntasks_per_node: int | None = None
    requeue: bool = True
    max_restarts: int = 0
    qos: str | None = None
    signal: str | None = None  # --signal [R:]SIG@SECS, validated by controller/signals.py
    dependency: str | None = None  # -d afterok:12,afterany:13_2, validated by controller/dependency.py
    exclude: tuple[str, ...] = ()  # -x: nodes the job must not run on
    begin_time: float | None = None  # --begin: epoch seconds before which the job does not start
    nice: int = 0  # --nice: subtracted from the job's priority (negative only for admins)
    umask: int | None = None  # the submitter's umask, applied to the ranks
    array_max_running: int | None = None  # %N of --array: tasks of this array running at once
    # -- Slurm's variables (SLURM_SUBMIT_HOST, SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP) ----------------------------
    submit_host: str | None = None  # gsub's host name, informational only (the controller checks its form)
    # The directory gsub ran in (SLURM_SUBMIT_DIR), where -D/--chdir chose another working directory; None: workdir
    submit_dir: str | None = None
    # The array's index set, summarised by the controller at submission (not on the JobSpec message, like
    # array_max_running): 0 tasks when the job is not an array task.
    array_task_count: int = 0
    array_task_min: int = 0
    array_task_max: int = 0
    array_task_step: int = 0
    # Node selection (sbatch -C, -w, --exclusive)
    constraint: str | None = None  # -C: node features, "a100&ib" or "a100|h100" (garrison/model/features.py)
    nodelist: tuple[str, ...] = ()  # -w: nodes the job must include (more are added when -N is larger)
    exclusive: bool = False  # --exclusive: whole nodes (every GPU, CPU and MB of each), shared with no job
    # sbatch's resource options as given (garrison/model/resources.py maps them onto the fields above).
    ntasks: int | None = None  # -n/--ntasks: tasks of the whole job
    cpus_per_task: int | None = None  # -c/--cpus-per-task
    gpus_per_task: int | None = None  # --gpus-per-task
    ntasks_per_gpu: int | None = None  # --ntasks-per-gpu
    cpus_per_node: int = 0  # CPUs on each node of a job without GPUs (from -c and the tasks per node)
    mem_per_gpu_mb: int = 0  # --mem-per-gpu: host memory per allocated GPU, on each node
    mem_per_cpu_mb: int = 0  # --mem-per-cpu, as given (mapped onto mem_mb or mem_per_gpu_mb)
    comment: str | None = None  # --comment: stored and shown by gjob
    open_mode: str | None = None  # --open-mode append|truncate; None: truncate on the first attempt only
    mem_whole_node: bool = False  # --mem=0: all of each node's memory (then mem_mb is 0)

    def total_gpus(self) -> int:
        """Total GPUs this job needs (0 for a CPU-only job)."""
        if self.gpus is not None:
            return self.gpus
        if self.gpus_per_node is not None:
            return self.gpus_per_node * (self.nodes or 1)
        return 0
