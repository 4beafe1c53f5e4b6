"""Domain types shared by the controller, the scheduling core, the store and the RPC layer.

Everything here is a frozen dataclass or an enum: plain values with no I/O, so the pure scheduling core
(controller/sched/) can take them as input and the simulator can build them without a database.
The only legal job state changes are listed in ``TRANSITIONS``; ``check_transition`` enforces them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

# What a user asks for lives in its own module, so the CLI can import it without the rest of these types.
from garrison.model.jobspec import JobSpec as JobSpec
from garrison.model.jobspec import LaunchMode as LaunchMode
from garrison.model.partitions import SEPARATOR as PARTITION_SEPARATOR


class JobState(enum.StrEnum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"  # allocated, ranks starting
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"  # ranks being stopped or reported; GPUs not yet free
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"  # killed by its memory limit (--mem) on some node, as in Slurm
    # Only ever the state of an *attempt* (never of a job): stopped to make room, and the job requeued.
    PREEMPTED = "PREEMPTED"
    # Only ever an attempt's: stopped by a requeue request (gcontrol/scontrol requeue, Lightning's auto-requeue),
    # and the job queued again; sacct -D shows Slurm's such runs as REQUEUED.
    REQUEUED = "REQUEUED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def holds_resources(self) -> bool:
        return self in RESOURCE_HOLDING_STATES


# A job in one of these holds its allocation (GPUs, CPUs, memory) on its nodes.
RESOURCE_HOLDING_STATES = frozenset({JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING})
TERMINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL,
     JobState.OUT_OF_MEMORY}
)

# The only legal job state changes. A requeue is X -> PENDING; a job whose ranks must be stopped first
# passes through COMPLETING, which keeps its GPUs allocated until every process group is empty.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.CONFIGURING, JobState.CANCELLED, JobState.FAILED}),
    JobState.CONFIGURING: frozenset(
        {
            JobState.RUNNING,
            JobState.COMPLETING,
            JobState.PENDING,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.NODE_FAIL,
            JobState.OUT_OF_MEMORY,
        }
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.COMPLETING,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
            JobState.NODE_FAIL,
            JobState.OUT_OF_MEMORY,
            JobState.PENDING,
        }
    ),
    JobState.COMPLETING: frozenset(
        {
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.TIMEOUT,
            JobState.NODE_FAIL,
            JobState.OUT_OF_MEMORY,
            JobState.PENDING,
        }
    ),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMEOUT: frozenset(),
    JobState.NODE_FAIL: frozenset(),
    JobState.OUT_OF_MEMORY: frozenset(),
    JobState.PREEMPTED: frozenset(),
    JobState.REQUEUED: frozenset(),
}



class IllegalTransition(ValueError):
    """A job state change that the transition table does not allow."""


def check_transition(current: JobState, new: JobState) -> None:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"illegal job state change {current} -> {new}")


class NodeState(enum.StrEnum):
    UP = "UP"
    DOWN = "DOWN"  # not heard from within the heartbeat timeout
    DRAIN = "DRAIN"  # admin said: no new work


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    node: str
    gpus: tuple[int, ...]  # GPU indices on that node, in local-rank order
    cpus: tuple[int, ...] = ()  # CPU ids chosen for the job (NUMA-local to its GPUs first); () = none asked
    mem_mb: int = 0  # host memory held on that node


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where one attempt of a job runs: node order is node rank (rank 0 lives on nodes[0])."""

    nodes: tuple[NodeAllocation, ...]

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.node for n in self.nodes)

    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def gpus_on(self, node: str) -> tuple[int, ...]:
        for n in self.nodes:
            if n.node == node:
                return n.gpus
        return ()


@dataclass(frozen=True, slots=True)
class AttemptUsage:
    """What an attempt used (sacct's MaxRSS and TotalCPU, seff's GPU figures): per node as an agent
    measured it in the attempt's cgroup, or over the whole attempt (``combine``). None: not measured."""

    max_rss_bytes: int | None = None
    cpu_time_s: float | None = None
    gpu_utilization_pct: float | None = None
    gpu_memory_bytes: int | None = None
    oom_kills: int = 0

    @staticmethod
    def combine(parts: Sequence[AttemptUsage]) -> AttemptUsage | None:
        """Peak memory of the largest node, CPU time summed, GPU utilisation averaged, GPU memory's peak."""
        if not parts:
            return None
        rss = [p.max_rss_bytes for p in parts if p.max_rss_bytes is not None]
        cpu = [p.cpu_time_s for p in parts if p.cpu_time_s is not None]
        util = [p.gpu_utilization_pct for p in parts if p.gpu_utilization_pct is not None]
        gpu_mem = [p.gpu_memory_bytes for p in parts if p.gpu_memory_bytes is not None]
        return AttemptUsage(
            max_rss_bytes=max(rss) if rss else None,
            cpu_time_s=sum(cpu) if cpu else None,
            gpu_utilization_pct=sum(util) / len(util) if util else None,
            gpu_memory_bytes=max(gpu_mem) if gpu_mem else None,
            oom_kills=sum(p.oom_kills for p in parts),
        )


@dataclass(frozen=True, slots=True)
class Attempt:
    """One start of a job. A requeue or restart makes a new attempt with the next number."""

    job_id: int
    attempt: int
    allocation: Allocation
    start_time: float
    end_time: float | None = None
    state: JobState = JobState.CONFIGURING
    exit_code: int | None = None
    reason: str = ""
    usage: AttemptUsage | None = None  # once it has ended, from the nodes' cgroups
    launch_failed: bool = False  # ended FAILED because its launch failed before any rank ran (retried)


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    spec: JobSpec
    user: str
    uid: int
    gid: int
    account: str
    partition: str
    time_limit_s: int
    submit_time: float
    state: JobState = JobState.PENDING
    reason: str = ""
    priority: int = 0
    array_job_id: int | None = None
    array_task_id: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    attempts: tuple[Attempt, ...] = ()
    restart_count: int = 0

    @property
    def current_attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def allocation(self) -> Allocation | None:
        att = self.current_attempt
        if att is None or not self.state.holds_resources:
            return None
        return att.allocation

    @property
    def display_id(self) -> str:
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    def with_state(self, new: JobState, **changes: object) -> Job:
        check_transition(self.state, new)
        if new == JobState.PENDING and self.state != JobState.PENDING and "partition" not in changes:
            spec_partition = self.spec.partition
            if spec_partition is not None and PARTITION_SEPARATOR in spec_partition:
                # -p a,b, requeued: it waits in every partition it named again (its spec keeps the list the
                # controller resolved), as Slurm's requeued job does, not only in the one it ran in.
                changes["partition"] = spec_partition
        return replace(self, state=new, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int
    cpu_affinity: str  # cpu list such as "0-19,40-59"
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """What an agent discovered on its node (through NVML, real or fake)."""

    hostname: str
    gpus: tuple[Gpu, ...]
    # nvlink[i][j] = number of NVLink lanes between GPU i and GPU j (0 when none; NVSwitch = all-to-all)
    nvlink: tuple[tuple[int, ...], ...]
    # topo[i][j] = nvidia-smi topo -m label for the pair: "X", "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"
    topo: tuple[tuple[str, ...], ...]
    cpus: int
    memory_mb: int
    model: str = ""  # machine description name, or "" for a real node
    features: tuple[str, ...] = ()  # from the agent's configuration (sbatch -C matches them)
    containment: str = ""  # what the agent enforces: "cgroup-v1: memory,...", "unconfined"; "" = not said


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    inventory: NodeInventory
    state: NodeState = NodeState.UP
    reason: str = ""
    last_heartbeat: float = 0.0

    @property
    def gpu_count(self) -> int:
        return len(self.inventory.gpus)

    @property
    def features(self) -> tuple[str, ...]:
        """What sbatch -C matches: the features the agent's configuration gave when it registered."""
        return self.inventory.features


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    nodes: tuple[str, ...] | None  # None: every node
    default_time_s: int
    max_time_s: int
    default: bool = False
    allowed_accounts: tuple[str, ...] | None = None  # None: any account


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking, as proven by a credential: never from a request body."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RankOutcome:
    rank: int
    exit_code: int  # -N: killed by signal N
    error: str = ""

    def describe(self) -> str:
        """``rank 0 exited with 3``, ``rank 0 was killed by signal 9 (Killed)``: a job's reason."""
        return f"rank {self.rank} {exit_description(self.exit_code)}"


def exit_description(code: int) -> str:
    """``exited with 3``; ``was killed by signal 9 (Killed)`` for -9 (a job's exit code when its process died
    of a signal)."""
    if code >= 0:
        return f"exited with {code}"
    import signal

    try:
        name = signal.strsignal(-code)
    except ValueError:
        name = None
    return f"was killed by signal {-code}" + (f" ({name})" if name else "")


@dataclass(frozen=True, slots=True)
class NodeResult:
    """What one node reports when every rank of an attempt on it has ended."""

    job_id: int
    attempt: int
    ranks: tuple[RankOutcome, ...]
    error: str = ""  # the launch failed on this node
    # The node's lease ran out and its supervisor stopped the ranks (fencing): the node's fault, not the job's.
    lease_expired: bool = False
    usage: AttemptUsage | None = None  # None: unconfined there
    out_of_memory: bool = False  # the memory limit's OOM killer killed one of its processes there
    launch_failed: bool = False  # the launch failed there before any rank ran: worth another attempt
    supervisor_lost: bool = False  # the attempt's supervisor died there without an end: the node's failure

    @property
    def failed(self) -> bool:
        return bool(self.error) or any(r.exit_code != 0 for r in self.ranks)

    def first_failure(self) -> RankOutcome | None:
        return next((r for r in self.ranks if r.exit_code != 0), None)
