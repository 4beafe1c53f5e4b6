"""sbatch's resource options mapped onto what the scheduler understands, with Slurm's meaning. Pure.

The scheduler knows total GPUs (``gpus``), GPUs per node, tasks per node, CPUs per GPU, CPUs per node (for
a job without GPUs), host memory per node (``mem_mb``) and memory per GPU (``mem_per_gpu_mb``). sbatch's
task-based options (-n, --gpus-per-task, --ntasks-per-gpu, -c, --mem-per-cpu) are turned into those here:

- ``-n 8 --gpus-per-task 1`` -> 8 GPUs; ``--ntasks-per-node 4 --gpus-per-task 1`` -> 4 GPUs on each node;
- ``-n 8 --ntasks-per-node 4`` -> 2 nodes; ``--ntasks-per-gpu 2 -G 4`` -> 8 tasks;
- ``-c C`` -> C x tasks per node CPUs on each node (CPUs per GPU for a job with GPUs);
- ``--mem-per-cpu M`` -> M x CPUs per node (or per GPU) of memory.

Conflicting combinations raise ResourceError naming both options, as sbatch refuses them. ``resolve`` is
idempotent: the controller applies it to whatever arrives (it never trusts the CLI), gsub to fail early.
"""

from __future__ import annotations

from dataclasses import replace

from garrison.model.jobspec import JobSpec


class ResourceError(ValueError):
    """One line naming the options that cannot go together."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _agree(name: str, given: int | None, derived: int, because: str) -> int:
    if given is not None and given != derived:
        raise ResourceError(f"{name} {given} conflicts with {because} (which make {derived})")
    return derived


def resolve(spec: JobSpec) -> JobSpec:
    """``spec`` with its sbatch task options mapped onto the scheduler's fields, or ResourceError."""
    ntasks, per_node, nodes = spec.ntasks, spec.ntasks_per_node, spec.nodes
    gpus, gpus_per_node = spec.gpus, spec.gpus_per_node
    for name, value in (("--ntasks", ntasks), ("--cpus-per-task", spec.cpus_per_task),
                        ("--gpus-per-task", spec.gpus_per_task), ("--ntasks-per-gpu", spec.ntasks_per_gpu)):
        if value is not None and value <= 0:
            raise ResourceError(f"{name} must be a positive number, got {value}")
    if spec.mem_per_gpu_mb < 0 or spec.mem_per_cpu_mb < 0 or spec.cpus_per_node < 0:
        raise ResourceError("--mem-per-gpu and --mem-per-cpu must not be negative")

    memory_options = [name for name, value in (("--mem", spec.mem_mb), ("--mem-per-gpu", spec.mem_per_gpu_mb),
                                               ("--mem-per-cpu", spec.mem_per_cpu_mb)) if value]
    if len(memory_options) > 1 and not (spec.mem_per_cpu_mb and len(memory_options) == 2):
        raise ResourceError(f"give only one of {' and '.join(memory_options)}")
    if spec.gpus_per_task is not None and spec.ntasks_per_gpu is not None:
        raise ResourceError("give either --gpus-per-task or --ntasks-per-gpu, not both")
    if spec.cpus_per_task is not None and spec.cpus_per_gpu and spec.total_gpus() == 0:
        raise ResourceError("--cpus-per-gpu needs GPUs; give --cpus-per-task for a job without GPUs")

    # Tasks and nodes.
    if ntasks is not None and per_node is not None:
        if nodes is None:
            nodes = _ceil_div(ntasks, per_node)
        elif ntasks > per_node * nodes:
            raise ResourceError(
                f"--ntasks {ntasks} cannot fit in --ntasks-per-node {per_node} x --nodes {nodes}"
            )
    if ntasks is not None and nodes is not None and ntasks < nodes:
        raise ResourceError(f"--ntasks {ntasks} is fewer than one task per node on --nodes {nodes}")
    if ntasks is not None and nodes is not None and per_node is None and ntasks % nodes == 0:
        per_node = ntasks // nodes

    # GPUs. Scripts often state one count several ways (--gpus-per-node=1 --gpus=1 --gpus-per-task=1); as in
    # Slurm, counts that agree are accepted and only a contradiction is refused. One form is kept: per node
    # where a per-node count was given or follows, the job's total otherwise.
    if gpus is not None and gpus_per_node is not None:
        if nodes is None and gpus % gpus_per_node == 0:
            nodes = gpus // gpus_per_node
        _agree("--gpus", gpus, gpus_per_node * (nodes or 1), "--gpus-per-node x --nodes")
        gpus = None
    if spec.gpus_per_task is not None:
        if per_node is not None and (ntasks is None or nodes is not None):
            gpus_per_node = _agree("--gpus-per-node", gpus_per_node, per_node * spec.gpus_per_task,
                                   "--ntasks-per-node x --gpus-per-task")
            if gpus is not None:
                _agree("--gpus", gpus, gpus_per_node * (nodes or 1), "--ntasks-per-node x --gpus-per-task x --nodes")
                gpus = None
        else:
            task_gpus = (ntasks or 1) * spec.gpus_per_task
            if gpus_per_node is None:
                gpus = _agree("--gpus", gpus, task_gpus, "--ntasks x --gpus-per-task")
            else:
                if nodes is None and task_gpus % gpus_per_node == 0:
                    nodes = task_gpus // gpus_per_node
                _agree("--gpus-per-node x --nodes", gpus_per_node * (nodes or 1), task_gpus,
                       "--ntasks x --gpus-per-task")
                if ntasks is not None and nodes is not None and ntasks < nodes:
                    raise ResourceError(f"--ntasks {ntasks} x --gpus-per-task {spec.gpus_per_task} needs "
                                        f"{nodes} nodes of --gpus-per-node {gpus_per_node}: a task cannot "
                                        "span nodes")
    if ntasks is not None and nodes is not None and per_node is None and ntasks % nodes == 0:
        per_node = ntasks // nodes  # the nodes may follow from the GPU counts: as above, so resolve is idempotent
    if spec.ntasks_per_gpu is not None:
        total = gpus if gpus is not None else (gpus_per_node * (nodes or 1) if gpus_per_node is not None else None)
        if total is None:
            if ntasks is None:
                raise ResourceError("--ntasks-per-gpu needs --gpus, --gpus-per-node or --ntasks")
            gpus = _ceil_div(ntasks, spec.ntasks_per_gpu)
        elif ntasks is None:
            ntasks = total * spec.ntasks_per_gpu
        elif ntasks > total * spec.ntasks_per_gpu:
            raise ResourceError(f"--ntasks {ntasks} cannot fit in --ntasks-per-gpu {spec.ntasks_per_gpu} "
                                f"x {total} GPUs")
    resolved = replace(spec, ntasks=ntasks, ntasks_per_node=per_node, nodes=nodes, gpus=gpus,
                       gpus_per_node=gpus_per_node)
    has_gpus = resolved.total_gpus() > 0

    # CPUs: Slurm's default is one CPU per task.
    cpus_per_gpu, cpus_per_node = spec.cpus_per_gpu, spec.cpus_per_node
    node_count = nodes or 1
    tasks_per_node = per_node if per_node is not None else _ceil_div(ntasks or 1, node_count)
    if spec.cpus_per_task is not None:
        wanted_per_node = spec.cpus_per_task * tasks_per_node
        if has_gpus:
            tasks_total = ntasks if ntasks is not None else tasks_per_node * node_count
            derived = (_ceil_div(wanted_per_node, gpus_per_node) if gpus_per_node is not None
                       else _ceil_div(spec.cpus_per_task * tasks_total, resolved.total_gpus()))
            if cpus_per_gpu and cpus_per_gpu != derived:
                raise ResourceError("give either --cpus-per-gpu or --cpus-per-task, not both")
            cpus_per_gpu = derived
        else:
            cpus_per_node = wanted_per_node
    elif not has_gpus and not cpus_per_node and (ntasks is not None or per_node is not None) and tasks_per_node > 1:
        # A CPU job's tasks get a CPU each without -c too, as Slurm gives them: HPCNow's `--ntasks=48` for
        # `srun --multi-prog` had one core for all its tasks here (SLURM_CPUS_ON_NODE=2 where Slurm says 48),
        # and `--ntasks-per-node=40` on 32-CPU nodes ran where Slurm refuses it. (A GPU job's CPUs follow its GPUs.)
        cpus_per_node = tasks_per_node
    # Memory.
    mem_mb, mem_per_gpu = spec.mem_mb, spec.mem_per_gpu_mb
    if spec.mem_per_cpu_mb:
        if has_gpus and cpus_per_gpu:
            derived_per_gpu = spec.mem_per_cpu_mb * cpus_per_gpu
            if mem_per_gpu and mem_per_gpu != derived_per_gpu or mem_mb:
                raise ResourceError(f"give only one of --mem-per-cpu and {'--mem' if mem_mb else '--mem-per-gpu'}")
            mem_per_gpu = derived_per_gpu
        else:
            cpus_here = cpus_per_node or (spec.cpus_per_task or 1) * tasks_per_node
            derived_mem = spec.mem_per_cpu_mb * cpus_here
            if mem_per_gpu or mem_mb and mem_mb != derived_mem:
                raise ResourceError(f"give only one of --mem-per-cpu and {'--mem' if mem_mb else '--mem-per-gpu'}")
            mem_mb = derived_mem
    if spec.mem_whole_node and (mem_mb or mem_per_gpu):
        raise ResourceError("--mem=0 (all of each node's memory) conflicts with --mem-per-gpu or --mem-per-cpu")
    if mem_per_gpu and not has_gpus:
        raise ResourceError("--mem-per-gpu needs GPUs (give --gpus, --gpus-per-node or --gres=gpu:N)")
    return replace(resolved, cpus_per_gpu=cpus_per_gpu, cpus_per_node=cpus_per_node, mem_mb=mem_mb,
                   mem_per_gpu_mb=mem_per_gpu)


def memory_per_node_mb(spec: JobSpec, gpus_on_node: int) -> int:
    """Host memory the job holds on a node where it has ``gpus_on_node`` GPUs."""
    return spec.mem_mb or spec.mem_per_gpu_mb * gpus_on_node
