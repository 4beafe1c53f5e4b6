"""Which attempts are live, what each holds where, and which parts of a scheduling plan still hold.

The ledger is the one bookkeeping of attempts and GPUs that both the daemon (ClusterState) and the
simulator (gsim's Replay) keep, and ``apply(plan, now) -> PlanResult`` is the one way a plan is applied.
Like Nomad's plan applier, it assumes the plan may be stale: the core computed it on a snapshot, and jobs,
nodes and GPUs may have changed since. Each start and preemption is checked against the ledger as it is
now and accepted only if it still holds; the rest is rejected with a typed reason, never half applied.

The ledger knows no store and no wire format. A caller that persists (the daemon) passes ``before_commit``:
it is called with the accepted result before the ledger changes, so a failed write leaves memory as it was.

GPU ownership is tracked per job *attempt* and per node, not per job state: a GPU is free only when the
attempt that held it has reported that every rank on that node ended (its process groups are empty). A
requeued job can therefore start again elsewhere while the ranks of its old attempt are still being killed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from garrison.controller.sched.cycle import Plan, Preempt
from garrison.model.domain import Allocation, AttemptUsage, JobState, Node, NodeResult, NodeState


@dataclass(slots=True)
class LiveAttempt:
    """An attempt whose ranks may still run somewhere."""

    job_id: int
    attempt: int
    allocation: Allocation
    pending_nodes: set[str]  # nodes that have not reported the end of their ranks
    started_nodes: set[str] = field(default_factory=set)
    results: dict[str, NodeResult] = field(default_factory=dict)
    # Nodes whose result is in `results` but not yet acknowledged: nothing durable says their ranks ended
    # (lifecycle.held_acks), so the agents keep the results on disk to report them to a restarted controller.
    held_acks: set[str] = field(default_factory=set)
    outcome: JobState | None = None  # decided when the attempt is being stopped early
    outcome_reason: str = ""
    requeue_as: JobState = JobState.NODE_FAIL  # the attempt's recorded state when outcome is a requeue
    last_checkpoint: float | None = None  # reported by the job (gcheckpoint / GARRISON_CHECKPOINT_MARK)
    running_usage: dict[str, AttemptUsage] = field(default_factory=dict)  # per node, so far (memory only)
    terminate_at: float | None = None  # end of a preemption grace period: then SIGTERM, then SIGKILL
    warned: bool = False  # the --signal warning before the time limit has been sent
    stale: bool = False  # the job has moved on (requeued); only its leftovers are being stopped

    @property
    def stopping(self) -> bool:
        """Being stopped (an outcome is decided) or a leftover: no longer a candidate for preemption."""
        return self.stale or self.outcome is not None


class Rejected(enum.Enum):
    """Why a part of a plan no longer holds."""

    JOB_NOT_PENDING = "job no longer pending"  # cancelled, started or ended since the snapshot (or unknown)
    JOB_HELD = "job held"
    NODE_GONE = "node gone"  # not in the cluster
    NODE_DOWN = "node down"  # DOWN, or its agent is not connected
    NODE_DRAINED = "node drained"
    GPUS_TAKEN = "GPUs taken"  # another attempt holds one of them
    CPUS_TAKEN = "CPUs taken"  # another attempt holds one of the CPUs, or the node has no such CPU
    MEMORY_SHORT = "memory short"  # the node's free host memory is less than the start asks for
    ATTEMPT_ENDED = "attempt ended"  # the victim's attempt is no longer live
    ATTEMPT_STOPPING = "attempt already stopping"  # the victim is being stopped (or preempted) already


@dataclass(frozen=True, slots=True)
class StartedAttempt:
    """A start the ledger accepted: the job's attempt number ``attempt`` on ``allocation``."""

    job_id: int
    attempt: int
    allocation: Allocation
    partition: str | None = None  # the one it starts in, for a job that names several (plan.Start.partition)


@dataclass(frozen=True, slots=True)
class Rejection:
    job_id: int
    reason: Rejected
    victim: Preempt | None = None  # set when a preemption was rejected, None for a start
    node: str = ""  # the node that made a start fail, when a node did


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What held of a plan: starts (in plan order), preemptions to carry out, and each rejection."""

    started: tuple[StartedAttempt, ...] = ()
    preempting: tuple[Preempt, ...] = ()
    rejected: tuple[Rejection, ...] = ()


def _asks_host_resources(allocation: Allocation) -> bool:
    return any(n.cpus or n.mem_mb for n in allocation.nodes)


class _Taken:
    """What the starts a review has accepted so far take, per node (a later start may not take it too)."""

    def __init__(self) -> None:
        self.gpus: dict[str, set[int]] = {}
        self.cpus: dict[str, set[int]] = {}
        self.memory: dict[str, int] = {}

    def add(self, allocation: Allocation) -> None:
        for node_alloc in allocation.nodes:
            self.gpus.setdefault(node_alloc.node, set()).update(node_alloc.gpus)
            if node_alloc.cpus:
                self.cpus.setdefault(node_alloc.node, set()).update(node_alloc.cpus)
            if node_alloc.mem_mb:
                self.memory[node_alloc.node] = self.memory.get(node_alloc.node, 0) + node_alloc.mem_mb


class AttemptLedger:
    """Live attempts, the GPUs/CPUs/memory each holds per node, and the jobs waiting to start.

    ``nodes`` and ``connected`` say where attempts may start (UP and connected); ``queued`` maps each job
    that may start to the number its next attempt gets; ``held`` are queued jobs that must not start yet.
    The owners of these (ClusterState, Replay) change them directly; the ledger's own operations keep
    ``live`` and ``gpu_owner`` consistent with each other.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.connected: set[str] = set()
        self.queued: dict[int, int] = {}  # job id -> its next attempt number
        self.held: set[int] = set()
        self.live: dict[tuple[int, int], LiveAttempt] = {}
        self.gpu_owner: dict[str, dict[int, tuple[int, int]]] = {}

    # -- queries ----------------------------------------------------------------------------------------

    def free_gpus(self, node: Node) -> frozenset[int]:
        owned = self.gpu_owner.get(node.name, {})
        return frozenset(g.index for g in node.inventory.gpus if g.index not in owned)

    def held_gpu_count(self) -> int:
        return sum(len(owners) for owners in self.gpu_owner.values())

    def held_cpus_and_memory(self) -> tuple[dict[str, set[int]], dict[str, int]]:
        """Per node, the CPUs and host memory (MB) of attempts whose ranks there have not reported their end
        (what the scheduler must not hand out again, and what ginfo shows as allocated)."""
        cpus: dict[str, set[int]] = {}
        memory: dict[str, int] = {}
        for live in self.live.values():
            for node_alloc in live.allocation.nodes:
                if node_alloc.node not in live.pending_nodes:
                    continue
                if node_alloc.cpus:
                    cpus.setdefault(node_alloc.node, set()).update(node_alloc.cpus)
                if node_alloc.mem_mb:
                    memory[node_alloc.node] = memory.get(node_alloc.node, 0) + node_alloc.mem_mb
        return cpus, memory

    # -- ownership ----------------------------------------------------------------------------------------

    def own(self, live: LiveAttempt) -> None:
        """Record a live attempt and the GPUs it holds on every node of its allocation."""
        self.live[(live.job_id, live.attempt)] = live
        for node_alloc in live.allocation.nodes:
            owners = self.gpu_owner.setdefault(node_alloc.node, {})
            for gpu in node_alloc.gpus:
                owners[gpu] = (live.job_id, live.attempt)

    def own_leftover(self, job_id: int, attempt: int, allocation: Allocation, node: str) -> None:
        """Ranks of an attempt the job has left behind still run on ``node``: keep their GPUs busy (unless
        another attempt took them meanwhile) until the node reports them ended."""
        self.live[(job_id, attempt)] = LiveAttempt(job_id, attempt, allocation, pending_nodes={node}, stale=True)
        owners = self.gpu_owner.setdefault(node, {})
        for gpu in allocation.gpus_on(node):
            owners.setdefault(gpu, (job_id, attempt))

    def release_node(self, live: LiveAttempt, node: str) -> None:
        """The attempt's ranks on ``node`` have ended (or the node is lost): its GPUs there are free."""
        live.pending_nodes.discard(node)
        owners = self.gpu_owner.get(node, {})
        for gpu in live.allocation.gpus_on(node):
            if owners.get(gpu) == (live.job_id, live.attempt):
                del owners[gpu]

    def close(self, live: LiveAttempt) -> None:
        """Forget an attempt every node has reported on."""
        del self.live[(live.job_id, live.attempt)]

    # -- plans ----------------------------------------------------------------------------------------------

    def review(self, plan: Plan) -> PlanResult:
        """What of ``plan`` still holds now, without changing anything. Starts are checked in plan order,
        each against the GPUs the earlier accepted ones take; then the preemptions."""
        started: list[StartedAttempt] = []
        rejected: list[Rejection] = []
        taken = _Taken()
        host: tuple[dict[str, set[int]], dict[str, int]] | None = None  # held CPUs and memory, read once
        for start in plan.starts:
            job_id = start.job_id
            attempt = self.queued.get(job_id)
            if attempt is None:
                rejected.append(Rejection(job_id, Rejected.JOB_NOT_PENDING))
                continue
            if job_id in self.held:
                rejected.append(Rejection(job_id, Rejected.JOB_HELD))
                continue
            problem = self._allocation_problem(start.allocation, taken.gpus)
            if problem is None and _asks_host_resources(start.allocation):
                if host is None:
                    host = self.held_cpus_and_memory()
                problem = self._host_problem(start.allocation, taken, *host)
            if problem is not None:
                rejected.append(Rejection(job_id, problem[0], node=problem[1]))
                continue
            taken.add(start.allocation)
            started.append(StartedAttempt(job_id, attempt, start.allocation, start.partition))
        preempting: list[Preempt] = []
        for victim in plan.preempts:
            live = self.live.get((victim.job_id, victim.attempt))
            if live is None:
                rejected.append(Rejection(victim.job_id, Rejected.ATTEMPT_ENDED, victim=victim))
            elif live.stopping:
                rejected.append(Rejection(victim.job_id, Rejected.ATTEMPT_STOPPING, victim=victim))
            else:
                preempting.append(victim)
        return PlanResult(tuple(started), tuple(preempting), tuple(rejected))

    def _allocation_problem(
        self, allocation: Allocation, taken: dict[str, set[int]]
    ) -> tuple[Rejected, str] | None:
        for node_alloc in allocation.nodes:
            name = node_alloc.node
            node = self.nodes.get(name)
            if node is None:
                return Rejected.NODE_GONE, name
            if node.state == NodeState.DRAIN:
                return Rejected.NODE_DRAINED, name
            if node.state != NodeState.UP or name not in self.connected:
                return Rejected.NODE_DOWN, name
            owners = self.gpu_owner.get(name, {})
            earlier = taken.get(name, ())
            if any(g in owners or g in earlier for g in node_alloc.gpus):
                return Rejected.GPUS_TAKEN, name
        return None

    def _host_problem(
        self, allocation: Allocation, taken: _Taken, held_cpus: dict[str, set[int]], held_memory: dict[str, int]
    ) -> tuple[Rejected, str] | None:
        """CPUs and host memory, as placement checked them: the CPUs exist on the node and no live attempt (nor an
        earlier start of the plan) holds one; the memory fits beside what live attempts hold."""
        for node_alloc in allocation.nodes:
            name = node_alloc.node
            inventory = self.nodes[name].inventory
            busy = held_cpus.get(name, set())
            earlier = taken.cpus.get(name, set())
            if any(c >= inventory.cpus or c < 0 or c in busy or c in earlier for c in node_alloc.cpus):
                return Rejected.CPUS_TAKEN, name
            if node_alloc.mem_mb and (held_memory.get(name, 0) + taken.memory.get(name, 0) + node_alloc.mem_mb
                                      > inventory.memory_mb):
                return Rejected.MEMORY_SHORT, name
        return None

    def commit(self, result: PlanResult) -> None:
        """Record the accepted starts as live attempts holding their GPUs. (Preemptions are carried out by
        the job lifecycle, which marks their attempts as stopping: ``begin_preemption``.)"""
        for start in result.started:
            self.queued.pop(start.job_id, None)
            self.own(LiveAttempt(start.job_id, start.attempt, start.allocation,
                                 pending_nodes=set(start.allocation.node_names)))

    def apply(
        self, plan: Plan, now: float, before_commit: Callable[[PlanResult, float], None] | None = None
    ) -> PlanResult:
        """Accept what still holds of ``plan``. ``before_commit(result, now)`` runs before the ledger
        changes (the daemon writes the started jobs through to its store there); if it raises, nothing
        changes."""
        result = self.review(plan)
        if before_commit is not None:
            before_commit(result, now)
        self.commit(result)
        return result

    def begin_preemption(self, live: LiveAttempt, terminate_at: float) -> None:
        """The attempt is being preempted: requeued whatever its ranks exit with, terminated at
        ``terminate_at``; its GPUs stay held until its ranks have ended."""
        live.outcome = JobState.PENDING
        live.outcome_reason = "preempted"
        live.requeue_as = JobState.PREEMPTED
        live.terminate_at = terminate_at
