"""Slurm's job variables (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, ...) for one node of an
attempt, as sbatch sets them. Pure.

The agent gives them to every rank (nodeagent/launch/env.py); the controller gives them to galloc, whose
command runs on the submitting host with the allocation's environment (``allocation_environment``), as
salloc's does. One rule for both, so a batch script and an interactive allocation see the same values.
"""

from __future__ import annotations

from collections.abc import Sequence

from garrison.model.domain import LaunchMode
from garrison.model.hostlist import compress_hostlist
from garrison.model.launch import LaunchDescription

# What describes one job, step or task: Slurm's output variables (and Garrison's of the same kind). A job
# submitted from inside another (a job that submits its successor, a pipeline's next stage, an salloc shell)
# arrives with the submitter's values of them in its environment; they are dropped before the new job's own
# are set (nodeagent/launch/env.py), so none that the new job does not set again survives to mislead it: the
# submitter's SLURM_ARRAY_TASK_ID in a job that is no array task, its SLURM_NTASKS as the default of every
# srun in a job that asked for no task count, its SLURM_RESTART_COUNT in a first run. Slurm leaves those it
# does not set (its users unset them by hand). Input variables (SLURM_CPU_BIND, SLURM_HINT, SLURM_MPI_TYPE,
# SLURM_EXPORT_ENV, ...), which users set on purpose, are not among them.
JOB_DESCRIBING_VARIABLES = frozenset({
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_CPUS_PER_NODE", "SLURM_CPUS_ON_NODE", "SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST", "SLURM_RESTART_COUNT",
    "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS", "SLURM_CLUSTER_NAME", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_JOB_DEPENDENCY", "SLURM_JOB_RESERVATION", "SLURM_PRIO_PROCESS",
    "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
    "SLURM_CPUS_PER_GPU", "SLURM_NTASKS_PER_GPU", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE",
    "SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU", "SLURM_MEM_PER_NODE", "SLURM_OPEN_MODE",
    "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_TMPDIR", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_GTIDS", "SLURM_TASK_PID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST",
    "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_GPUS",
    "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT", "SLURM_LAUNCH_NODE_IPADDR",
    "GARRISON_ARRAY_JOB_ID", "GARRISON_ARRAY_TASK_ID", "GARRISON_STEP_ID", "GARRISON_CHECKPOINT_DIR",
    "GARRISON_CHECKPOINT_MARK",
})

# A job without a time limit ends, for SLURM_JOB_END_TIME, a year after it started, as slurmctld records it.
UNLIMITED_END_S = 365 * 24 * 3600

# Variables that describe the node a process runs on: galloc's command runs on the submitting host, not on
# an allocated node, so it gets none of them (salloc's neither).
NODE_LOCAL_VARIABLES = frozenset({"SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR", "SLURM_TOPOLOGY_ADDR_PATTERN",
                                  "SLURM_CPUS_ON_NODE"})


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
    if spec.launch in (LaunchMode.SINGLE, LaunchMode.ALLOCATION):
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
        "SLURMD_NODENAME": here.node,
        "SLURM_TOPOLOGY_ADDR": here.node,
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_SUBMIT_DIR": spec.submit_dir or spec.workdir,
        "SLURM_JOB_PARTITION": launch.partition,
        "SLURM_JOB_ACCOUNT": launch.account,
        "SLURM_CLUSTER_NAME": launch.cluster_name,
    }
    if launch.restart_count:
        # Only once requeued or restarted, as slurmd sets it: `"SLURM_RESTART_COUNT" in os.environ` means "a rerun".
        env["SLURM_RESTART_COUNT"] = str(launch.restart_count)
    if here.gpus:
        # Only a job with GPUs on the node is told of them, as slurmd does: a script's
        # `${SLURM_GPUS_ON_NODE:-1}` then means what it means under Slurm (a 0 here once made it 0).
        env["SLURM_GPUS_ON_NODE"] = str(len(here.gpus))
        env["SLURM_JOB_GPUS"] = ",".join(str(g) for g in sorted(here.gpus))
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
    if spec.ntasks_per_gpu is not None:
        env["SLURM_NTASKS_PER_GPU"] = str(spec.ntasks_per_gpu)
    if spec.gpus_per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = str(spec.gpus_per_task)  # srun's default --gpus-per-task in the job
    # The memory variable names the option given, as sbatch's do: a script that reads $SLURM_MEM_PER_CPU
    # (e.g. to size a JVM per thread) after --mem-per-cpu found it unset here before.
    if spec.mem_per_cpu_mb:
        env["SLURM_MEM_PER_CPU"] = str(spec.mem_per_cpu_mb)
    elif spec.mem_per_gpu_mb:
        env["SLURM_MEM_PER_GPU"] = str(spec.mem_per_gpu_mb)
    elif here.mem_mb:
        env["SLURM_MEM_PER_NODE"] = str(here.mem_mb)
    if spec.open_mode:
        env["SLURM_OPEN_MODE"] = spec.open_mode[0]  # "a" or "t", as sbatch exports --open-mode
    if spec.submit_host:
        env["SLURM_SUBMIT_HOST"] = spec.submit_host
    if launch.qos:
        env["SLURM_JOB_QOS"] = launch.qos
    if launch.start_time:
        # Epoch seconds, as slurmctld records them: scripts that checkpoint before the limit read the end.
        env["SLURM_JOB_START_TIME"] = str(int(launch.start_time))
        env["SLURM_JOB_END_TIME"] = str(int(launch.start_time) + min(launch.time_limit_s, UNLIMITED_END_S))
    if spec.gpus is not None:
        env["SLURM_GPUS"] = str(spec.gpus)  # only with -G, as sbatch sets it
    if spec.cpus_per_gpu:
        env["SLURM_CPUS_PER_GPU"] = str(spec.cpus_per_gpu)
    if launch.array_job_id is not None and launch.array_task_id is not None:
        env["SLURM_ARRAY_JOB_ID"] = str(launch.array_job_id)
        env["SLURM_ARRAY_TASK_ID"] = str(launch.array_task_id)
        if launch.array_task_count:
            env["SLURM_ARRAY_TASK_COUNT"] = str(launch.array_task_count)
            env["SLURM_ARRAY_TASK_MIN"] = str(launch.array_task_min)
            env["SLURM_ARRAY_TASK_MAX"] = str(launch.array_task_max)
            env["SLURM_ARRAY_TASK_STEP"] = str(launch.array_task_step)
    return env


def allocation_environment(launch: LaunchDescription, cpus_on_node: int) -> dict[str, str]:
    """What galloc's command gets (salloc's environment): Slurm's job variables as the allocation's first
    node sees them, without the node-local ones, and Garrison's own. SLURM_JOB_GPUS names the first node's
    GPUs, as salloc does; CUDA_VISIBLE_DEVICES is not set, since the submitting host's GPUs are not the
    allocation's. ``cpus_on_node``: the first node's CPUs, for a job the scheduler bound no CPUs to."""
    env = {
        name: value
        for name, value in slurm_environment(launch, [0] * len(launch.allocation.nodes), cpus_on_node).items()
        if name not in NODE_LOCAL_VARIABLES
    }
    nodes = launch.allocation.node_names
    env.update(
        {
            "GARRISON_JOB_ID": str(launch.job_id),
            "GARRISON_JOB_NAME": launch.spec.name,
            "GARRISON_JOB_USER": launch.user,
            "GARRISON_NODELIST": ",".join(nodes),
            "GARRISON_NNODES": str(len(nodes)),
            "GARRISON_TIME_LIMIT": str(launch.time_limit_s),
            "GARRISON_SUBMIT_DIR": launch.spec.workdir,
            "GARRISON_ATTEMPT": str(launch.attempt),
        }
    )
    return env
