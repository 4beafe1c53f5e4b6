"""Job steps (Slurm's srun inside an allocation): what gsrun asks for, where its tasks go, what a node is told.

A step runs ``ntasks`` tasks of one command on nodes of a RUNNING job's allocation. ``place_step`` is the one
rule for where they go (block-wise, as srun's default distribution) and which of the allocation's GPUs and
CPUs each task gets; it refuses, with a typed reason, a step the allocation could never hold and one that
only waits for other steps' resources. Pure: standard library and garrison.model only.

Numbering is Slurm's: a job's steps are ``JOBID.0``, ``JOBID.1``, ...; its batch script is ``JOBID.batch``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from garrison.model.domain import Allocation
from garrison.model.taskblocks import block_counts as block_counts

BATCH_STEP = "batch"
MAX_STEP_TASKS = 4096
MAX_STEP_ARGV_BYTES = 256 << 10
MAX_STEP_ENV_BYTES = 1 << 20


class StepState(enum.StrEnum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self is not StepState.RUNNING


class GpuBind(enum.StrEnum):
    """--gpu-bind: which of the step's GPUs on its node a task sees (CUDA_VISIBLE_DEVICES)."""

    DEFAULT = ""  # with --gpus-per-task its own GPUs, else every GPU of the job on the node
    NONE = "none"  # every GPU of the step on the node
    CLOSEST = "closest"  # its own GPUs (those the placement gave it, NUMA-local first)
    SINGLE = "single"  # single:N: each GPU shared by N consecutive tasks of the node
    MAP_GPU = "map_gpu"  # map_gpu:A,B,...: task LOCALID gets GPU list[LOCALID % len]


class CpuBind(enum.StrEnum):
    """--cpu-bind: the CPU affinity of each task."""

    DEFAULT = ""  # with -c, as cores; else the job's CPUs
    NONE = "none"  # the job's CPUs on the node, unbound per task
    CORES = "cores"  # its own -c CPUs out of the job's
    MAP_CPU = "map_cpu"  # map_cpu:A,B,...: task LOCALID bound to CPU list[LOCALID % len]


@dataclass(frozen=True, slots=True)
class StepRequest:
    """What gsrun asks for (after its options, environment and defaults); the controller checks all of it."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    ntasks: int | None = None  # -n
    nodes: int | None = None  # -N
    ntasks_per_node: int | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None  # -c
    nodelist: tuple[str, ...] = ()  # -w
    gpu_bind: GpuBind = GpuBind.DEFAULT
    gpu_bind_arg: tuple[int, ...] = ()  # single:N -> (N,), map_gpu:A,B -> (A, B)
    cpu_bind: CpuBind = CpuBind.DEFAULT
    cpu_bind_arg: tuple[int, ...] = ()  # map_cpu:A,B -> (A, B)
    label: bool = False  # --label: output lines prefixed "N: " (gsrun does it; kept for the record)
    kill_on_bad_exit: bool = False  # -K: a task ending non-zero stops the others
    pty: bool = False  # --pty: task 0 runs on a pseudo-terminal, its bytes both ways
    unbuffered: bool = False  # -u: output sent as written, not held back to whole lines
    name: str = ""  # --job-name for the step; default the command's name


class RefusalKind(enum.StrEnum):
    INVALID = "invalid"  # contradictory or malformed options
    EXCEEDS_ALLOCATION = "exceeds-allocation"  # more than the job holds: never runnable
    BUSY = "busy"  # the job holds enough, but other steps use it now


class StepRefused(Exception):
    """The step cannot be placed; ``kind`` says whether it never could or only not now."""

    def __init__(self, kind: RefusalKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class StepNode:
    """One node of a step: its tasks (global task ids, consecutive), their GPUs and CPUs."""

    node: str
    tasks: tuple[int, ...]
    task_gpus: tuple[tuple[int, ...], ...]  # per task: what it sees as CUDA_VISIBLE_DEVICES
    task_cpus: tuple[tuple[int, ...], ...]  # per task: its CPU affinity; () = the job's CPUs here
    held_gpus: tuple[int, ...] = ()  # GPUs the step holds exclusively here (--gpus-per-task)
    held_cpus: tuple[int, ...] = ()  # CPUs it holds exclusively here (-c on a job with bound CPUs)


@dataclass(frozen=True, slots=True)
class StepLayout:
    nodes: tuple[StepNode, ...]

    @property
    def ntasks(self) -> int:
        return sum(len(n.tasks) for n in self.nodes)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.node for n in self.nodes)

    def tasks_per_node(self) -> tuple[int, ...]:
        return tuple(len(n.tasks) for n in self.nodes)


@dataclass(frozen=True, slots=True)
class Step:
    """A step as the controller keeps and stores it."""

    job_id: int
    step_id: int
    name: str
    user: str
    uid: int
    argv: tuple[str, ...]
    layout: StepLayout
    state: StepState = StepState.RUNNING
    start_time: float = 0.0
    end_time: float | None = None
    exit_code: int | None = None  # the highest task exit code (128+N for a signal N), as srun's
    reason: str = ""

    @property
    def display_id(self) -> str:
        return f"{self.job_id}.{self.step_id}"


@dataclass(frozen=True, slots=True)
class StepLaunchDescription:
    """What one node is told to start for a step: its tasks, seen from that node."""

    job_id: int
    step_id: int
    user: str
    uid: int
    gid: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    layout: StepLayout
    node_index: int  # which entry of layout.nodes is the receiving node
    master_addr: str  # the step's first node, for torchrun's MASTER_ADDR
    master_port: int
    kill_wait_s: float
    pty: bool = False  # task 0 on a pseudo-terminal
    umask: int | None = None
    unbuffered: bool = False  # -u: output sent as written, not held back to whole lines

    @property
    def here(self) -> StepNode:
        return self.layout.nodes[self.node_index]


def parse_step_ref(text: str) -> tuple[int, str]:
    """"12.3" -> (12, "3"), "12.batch" -> (12, "batch"); ValueError for anything else."""
    head, dot, tail = text.strip().partition(".")
    if not dot or not head.isdigit() or not (tail.isdigit() or tail == BATCH_STEP):
        raise ValueError(f"invalid step id {text!r}: expected JOBID.STEP (12.0, 12.batch)")
    return int(head), tail


def _choose_nodes(allocation: Allocation, request: StepRequest, job_ref: str) -> list[int]:
    """Indices into the allocation of the step's nodes, in allocation order (-w nodes first chosen)."""
    names = list(allocation.node_names)
    for name in request.nodelist:
        if name not in names:
            raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                              f"-w {name}: not a node of job {job_ref}'s allocation ({','.join(names)})")
    wanted = request.nodes
    if wanted is None:
        if request.nodelist:
            wanted = len(set(request.nodelist))
        elif request.ntasks is not None and request.ntasks_per_node is not None:
            wanted = -(-request.ntasks // request.ntasks_per_node)
        elif request.ntasks is not None:
            wanted = min(request.ntasks, len(names))
        else:
            wanted = len(names)
    if wanted < 1:
        raise StepRefused(RefusalKind.INVALID, "-N must be at least 1")
    if wanted > len(names):
        raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                          f"-N {wanted}: job {job_ref}'s allocation has {len(names)} node(s)")
    if len(set(request.nodelist)) > wanted:
        raise StepRefused(RefusalKind.INVALID, f"-w names {len(set(request.nodelist))} nodes but -N is {wanted}")
    chosen = [i for i, name in enumerate(names) if name in request.nodelist]
    for i in range(len(names)):
        if len(chosen) >= wanted:
            break
        if i not in chosen:
            chosen.append(i)
    return sorted(chosen)


def _task_gpus(request: StepRequest, node: str, step_gpus: Sequence[int], own: Sequence[tuple[int, ...]],
               job_gpus: Sequence[int]) -> list[tuple[int, ...]]:
    count = len(own)
    bind = request.gpu_bind
    if bind == GpuBind.NONE:
        return [tuple(step_gpus)] * count
    if bind == GpuBind.SINGLE:
        per_gpu = request.gpu_bind_arg[0]
        if not step_gpus:
            raise StepRefused(RefusalKind.INVALID, "--gpu-bind=single: the step has no GPUs on " + node)
        needed = -(-count // per_gpu)
        if needed > len(step_gpus):
            raise StepRefused(RefusalKind.INVALID, f"--gpu-bind=single:{per_gpu}: {count} tasks on {node} need "
                              f"{needed} GPUs, the step has {len(step_gpus)} there")
        return [(step_gpus[i // per_gpu],) for i in range(count)]
    if bind == GpuBind.MAP_GPU:
        for gpu in request.gpu_bind_arg:
            if gpu not in job_gpus:
                raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                                  f"--gpu-bind=map_gpu: GPU {gpu} is not allocated to the job on {node}")
        return [(request.gpu_bind_arg[i % len(request.gpu_bind_arg)],) for i in range(count)]
    if request.gpus_per_task:  # DEFAULT or CLOSEST with GPUs per task: each its own
        return list(own)
    return [tuple(step_gpus)] * count


def _task_cpus(request: StepRequest, node: str, job_cpus: Sequence[int], own: Sequence[tuple[int, ...]]
               ) -> list[tuple[int, ...]]:
    count = len(own)
    if request.cpu_bind == CpuBind.NONE:
        return [()] * count
    if request.cpu_bind == CpuBind.MAP_CPU:
        if job_cpus:
            for cpu in request.cpu_bind_arg:
                if cpu not in job_cpus:
                    raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                                      f"--cpu-bind=map_cpu: CPU {cpu} is not allocated to the job on {node}")
        return [(request.cpu_bind_arg[i % len(request.cpu_bind_arg)],) for i in range(count)]
    return list(own)


def place_step(allocation: Allocation, busy: Mapping[str, tuple[frozenset[int], frozenset[int]]],
               request: StepRequest, job_ref: str) -> StepLayout:
    """Where the step's tasks run in ``allocation``; ``busy`` maps a node to the (GPUs, CPUs) other running
    steps hold there. StepRefused says why not: EXCEEDS_ALLOCATION for what the job could never give,
    BUSY for what other steps hold now, INVALID for options that contradict each other."""
    for option, value in (("-n", request.ntasks), ("--ntasks-per-node", request.ntasks_per_node),
                          ("--gpus-per-task", request.gpus_per_task), ("-c", request.cpus_per_task)):
        if value is not None and value < (0 if option == "--gpus-per-task" else 1):
            raise StepRefused(RefusalKind.INVALID, f"{option} must be at least 1")
    chosen = _choose_nodes(allocation, request, job_ref)
    nodes = len(chosen)
    ntasks = request.ntasks
    if ntasks is None:
        ntasks = nodes * (request.ntasks_per_node or 1)
    if ntasks > MAX_STEP_TASKS:
        raise StepRefused(RefusalKind.INVALID, f"-n {ntasks}: at most {MAX_STEP_TASKS} tasks a step")
    if ntasks < nodes:
        raise StepRefused(RefusalKind.INVALID, f"-n {ntasks} is fewer tasks than its {nodes} nodes (-N)")
    if request.ntasks_per_node is not None and ntasks > request.ntasks_per_node * nodes:
        raise StepRefused(RefusalKind.INVALID, f"-n {ntasks} with --ntasks-per-node {request.ntasks_per_node} "
                          f"needs {-(-ntasks // request.ntasks_per_node)} nodes, not {nodes}")
    counts = block_counts(ntasks, nodes, request.ntasks_per_node)
    if any(c == 0 for c in counts):
        raise StepRefused(RefusalKind.INVALID, f"-n {ntasks} leaves some of the step's {nodes} nodes without tasks")
    placed: list[StepNode] = []
    first = 0
    for index, count in zip(chosen, counts, strict=True):
        here = allocation.nodes[index]
        used_gpus, used_cpus = busy.get(here.node, (frozenset(), frozenset()))
        gpt = request.gpus_per_task or 0
        if gpt * count > len(here.gpus):
            total = gpt * ntasks
            raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                              f"{count} tasks x {gpt} GPUs on {here.node} need {gpt * count} GPUs; job {job_ref} "
                              f"holds {len(here.gpus)} there ({total} GPUs asked, {allocation.gpu_count()} allocated)")
        free_gpus = [g for g in here.gpus if g not in used_gpus]
        if gpt * count > len(free_gpus):
            raise StepRefused(RefusalKind.BUSY, f"{gpt * count} GPUs wanted on {here.node}, "
                              f"{len(free_gpus)} of the job's {len(here.gpus)} free there (other steps hold the rest)")
        held_gpus = tuple(free_gpus[: gpt * count])
        own_gpus = [held_gpus[i * gpt:(i + 1) * gpt] for i in range(count)]
        cpt = request.cpus_per_task
        held_cpus: tuple[int, ...] = ()
        own_cpus: list[tuple[int, ...]] = [()] * count
        if cpt is not None and here.cpus:
            if cpt * count > len(here.cpus):
                raise StepRefused(RefusalKind.EXCEEDS_ALLOCATION,
                                  f"{count} tasks x {cpt} CPUs on {here.node} need {cpt * count} CPUs; job "
                                  f"{job_ref} holds {len(here.cpus)} there")
            free_cpus = [c for c in here.cpus if c not in used_cpus]
            if cpt * count > len(free_cpus):
                raise StepRefused(RefusalKind.BUSY, f"{cpt * count} CPUs wanted on {here.node}, {len(free_cpus)} "
                                  "of the job's free there (other steps hold the rest)")
            held_cpus = tuple(free_cpus[: cpt * count])
            own_cpus = [held_cpus[i * cpt:(i + 1) * cpt] for i in range(count)]
        # gpus_per_task 0 (srun --gres=none or gpu:0) sees none of the job's GPUs; None sees them all, held by none
        step_gpus = held_gpus if gpt or request.gpus_per_task == 0 else here.gpus
        placed.append(StepNode(
            node=here.node,
            tasks=tuple(range(first, first + count)),
            task_gpus=tuple(_task_gpus(request, here.node, step_gpus, own_gpus, here.gpus)),
            task_cpus=tuple(_task_cpus(request, here.node, here.cpus, own_cpus)),
            held_gpus=held_gpus,
            held_cpus=held_cpus if request.cpu_bind != CpuBind.NONE or held_cpus else (),
        ))
        first += count
    return StepLayout(nodes=tuple(placed))


def step_exit_code(task_codes: Sequence[int]) -> int:
    """srun's exit status: the highest of its tasks' (a task killed by signal N counts as 128+N)."""
    return max(task_codes, default=0)
