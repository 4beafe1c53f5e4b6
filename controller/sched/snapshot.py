"""The immutable input of one scheduling cycle.

A snapshot is built from the controller's in-memory state (never by re-reading the database) and handed
to ``schedule``; the same types are built by the tests and by the simulator with a virtual clock. Every
field past the first few has a default, so a caller that knows only GPUs and a queue (the simulator, a
unit test) builds a valid snapshot without inventing CPUs, accounts or usage: what is absent is simply not
constrained (no accounts: every account is a root with one share; no usage: everyone's fair share is 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from garrison.controller.sched.attained import Service
from garrison.controller.sched.dependencies import JobDependencies
from garrison.model.accounts import Accounting
from garrison.model.cpulist import parse_cpu_list as parse_cpu_list
from garrison.model.domain import Allocation, JobSpec, NodeInventory

if TYPE_CHECKING:
    from garrison.controller.sched.priority import PriorityContext

# How long a job may run when neither it, its partition nor anything else says (Slurm's default is the
# partition's; a snapshot built without partitions still needs an end time for backfill).
FALLBACK_TIME_LIMIT_S = 3600


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    schedulable: bool  # UP and connected
    gpu_names: tuple[str, ...]  # by GPU index
    free_gpus: frozenset[int]
    nvlink: tuple[tuple[int, ...], ...] = ()  # lanes between GPU pairs, by index
    partitions: frozenset[str] = frozenset()
    drained: bool = False
    topo: tuple[tuple[str, ...], ...] = ()  # nvidia-smi topo -m labels (PIX, PXB, PHB, NODE, SYS, NV#)
    gpu_memory_mib: tuple[int, ...] = ()  # by GPU index; () = unknown
    gpu_cpus: tuple[frozenset[int], ...] = ()  # by GPU index: the CPUs on its NUMA node
    cpus: int = 0  # 0: the node does not report CPUs, and jobs asking for CPUs do not fit on it
    free_cpus: frozenset[int] = frozenset()
    memory_mb: int = 0
    free_memory_mb: int = 0
    switches: tuple[str, ...] = ()  # network topology path, top level first (block, rack, leaf switch)
    features: frozenset[str] = frozenset()  # from the agent's configuration (sbatch -C)
    idle: bool = True  # no job attempt holds anything here (an --exclusive job needs that, even of 0-GPU jobs)
    held_exclusively: bool = False  # an --exclusive job runs here: no other job may join it

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: int
    spec: JobSpec
    partition: str
    submit_time: float
    priority: int = 0  # an admin's adjustment, added to the computed priority
    array_job_id: int | None = None
    held: bool = False
    dependencies: JobDependencies | None = None  # its -d list, typed (the core decides: dependencies.py)
    user: str = ""
    account: str = ""  # "" : spec.account, else "default"
    qos: str = ""  # "" : spec.qos, else the accounting's default QoS
    time_limit_s: int | None = None  # None: spec.time_limit_s, else the partition default
    service: Service = ()  # (start, end, GPUs) of its earlier attempts, for attained service (attained.py)
    # sbatch -p a,b: the partitions tried after ``partition`` when it cannot start there now, in order (each
    # placement in one partition: a gang never spans two). Its priority, gates and reservation are the first's.
    other_partitions: tuple[str, ...] = ()

    @property
    def account_name(self) -> str:
        return self.account or self.spec.account or "default"

    @property
    def qos_name(self) -> str:
        return self.qos or self.spec.qos or ""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job attempt that holds GPUs now: what backfill needs to know when they come free, what quotas
    count, and what preemption may take back."""

    job_id: int
    attempt: int
    allocation: Allocation
    start_time: float
    time_limit_s: int
    user: str = ""
    account: str = "default"
    qos: str = ""
    partition: str = ""
    array_job_id: int | None = None
    checkpoint_time: float | None = None  # when its work was last saved; None: the attempt start
    stopping: bool = False  # already being stopped: its GPUs come free soon, and it is no victim
    warning_lead_s: int | None = None  # its --signal lead time (None: it asked for none), for preemption grace
    service: Service = ()  # (start, end, GPUs) of the job's earlier attempts, for attained service (attained.py)

    @property
    def expected_end(self) -> float:
        return self.start_time + self.time_limit_s

    def gpu_count(self) -> int:
        return self.allocation.gpu_count()


@dataclass(frozen=True, slots=True)
class UsageView:
    """GPU-seconds charged to one (account, user) association."""

    decayed_gpu_s: float = 0.0  # for fair share, halved every half-life
    period_gpu_s: float = 0.0  # raw, since the start of the current quota period (GPU-hour quotas)


EMPTY_ACCOUNTING = Accounting()


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]
    # Running tasks per array job id, for --array=...%N limits, *in addition* to those listed in `running`
    # (a caller that lists its running jobs leaves this empty).
    running_array_tasks: tuple[tuple[int, int], ...] = ()
    running: tuple[RunningJob, ...] = ()
    accounting: Accounting = EMPTY_ACCOUNTING
    usage: Mapping[tuple[str, str], UsageView] = field(default_factory=dict)  # (account, user) -> usage
    # (user, job name) of every job that holds resources, for -d singleton (filled only when a job needs it)
    running_names: frozenset[tuple[str, str]] = frozenset()
    # The last plan's priorities' context (Plan.pricing): with SchedulerConfig.priority_interval_s, a cycle
    # prices its queue as of it while it is recent enough (cycle.py). None: priced as of the cycle's now.
    pricing: PriorityContext | None = field(default=None, compare=False)


def node_view(
    inventory: NodeInventory,
    name: str,
    *,
    schedulable: bool,
    free_gpus: frozenset[int],
    partitions: frozenset[str],
    drained: bool = False,
    used_cpus: frozenset[int] = frozenset(),
    used_memory_mb: int = 0,
    switches: tuple[str, ...] = (),
    idle: bool = True,
    held_exclusively: bool = False,
) -> NodeView:
    """The scheduler's view of a node from what its agent discovered."""
    gpu_cpus = tuple(parse_cpu_list(g.cpu_affinity) for g in inventory.gpus)
    all_cpus = frozenset(range(inventory.cpus))
    return NodeView(
        name=name,
        schedulable=schedulable,
        gpu_names=tuple(g.name for g in inventory.gpus),
        free_gpus=free_gpus,
        nvlink=inventory.nvlink,
        partitions=partitions,
        drained=drained,
        topo=inventory.topo,
        gpu_memory_mib=tuple(g.memory_mib for g in inventory.gpus),
        gpu_cpus=gpu_cpus,
        cpus=inventory.cpus,
        free_cpus=all_cpus - used_cpus,
        memory_mb=inventory.memory_mb,
        free_memory_mb=max(0, inventory.memory_mb - used_memory_mb),
        switches=switches,
        features=frozenset(inventory.features),
        idle=idle,
        held_exclusively=held_exclusively,
    )
