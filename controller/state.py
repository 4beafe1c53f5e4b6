"""The controller's authoritative cluster state, in memory, written through to the store.

Like Dask's worker state machine, every change enters through a few named operations that return
*instructions* (launch this attempt on that node, signal, acknowledge a result) instead of doing I/O; the
engine (controller/engine.py) carries the instructions out over the agent links. So the whole job life
cycle, including crash recovery and reconciliation with agents, is testable without a network.

GPU ownership is tracked per job *attempt* and per node, not per job state: a GPU is free only when the
attempt that held it has reported that every rank on that node ended (its process groups are empty). A
requeued job can therefore start again elsewhere while the ranks of its old attempt are still being killed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from garrison.controller.sched.snapshot import EMPTY_ACCOUNTING, Snapshot, UsageView
from garrison.controller.signals import parse_signal_request
from garrison.controller.snapshots import SnapshotCache
from garrison.model.domain import (
    LAUNCH_FAILED_PREFIX,
    Allocation,
    Attempt,
    Job,
    JobState,
    LaunchMode,
    Node,
    NodeInventory,
    NodeResult,
    NodeState,
)

if TYPE_CHECKING:
    from garrison.controller.store import Store
    from garrison.model.accounts import Accounting

log = logging.getLogger("garrison.controller.state")


# --------------------------------------------------------------------------------------------------
# Instructions: what the engine must do on the agent links after a state change.


@dataclass(frozen=True, slots=True)
class Launch:
    node: str
    job: Job
    attempt: int


@dataclass(frozen=True, slots=True)
class SignalAttempt:
    node: str
    job_id: int
    attempt: int
    action: str  # "signal" | "terminate" | "kill"
    signal: int = 0


@dataclass(frozen=True, slots=True)
class AckResult:
    node: str
    job_id: int
    attempt: int


Instruction = Launch | SignalAttempt | AckResult


@dataclass(slots=True)
class LiveAttempt:
    """An attempt whose ranks may still run somewhere."""

    job_id: int
    attempt: int
    allocation: Allocation
    pending_nodes: set[str]  # nodes that have not reported the end of their ranks
    started_nodes: set[str] = field(default_factory=set)
    results: dict[str, NodeResult] = field(default_factory=dict)
    outcome: JobState | None = None  # decided when the attempt is being stopped early
    outcome_reason: str = ""
    requeue_as: JobState = JobState.NODE_FAIL  # the attempt's recorded state when outcome is a requeue
    last_checkpoint: float | None = None  # reported by the job (gcheckpoint / GARRISON_CHECKPOINT_MARK)
    terminate_at: float | None = None  # end of a preemption grace period: then SIGTERM, then SIGKILL
    warned: bool = False  # the --signal warning before the time limit has been sent
    stale: bool = False  # the job has moved on (requeued); only its leftovers are being stopped


# Job.reason of a COMPLETING job records why it is being stopped, so a restarted controller knows the
# outcome it had decided (CANCELLED, TIMEOUT, FAILED, NODE_FAIL, or PENDING for a requeue).
_OUTCOME_PREFIX = "stopping:"


class ClusterState:
    def __init__(self, store: Store, heartbeat_timeout_s: float) -> None:
        self.store = store
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.jobs: dict[int, Job] = {}
        self.nodes: dict[str, Node] = {}
        self.node_partitions: dict[str, frozenset[str]] = {}
        self.connected: set[str] = set()
        self.live: dict[tuple[int, int], LiveAttempt] = {}
        self.gpu_owner: dict[str, dict[int, tuple[int, int]]] = {}
        self.held: set[int] = set()
        self.admin_held: set[int] = set()  # held by an admin: only an admin may release them
        self.silent_drained: set[str] = set()  # drained nodes that stopped responding (still drained)
        self.snapshots = SnapshotCache()
        self.wait_reasons: dict[int, str] = {}
        self.started_at = 0.0
        # Called with (the job before, the job after) for every job change written through to the store
        # (before is None for a new job): metrics and job event logs. They must not raise or block.
        self.job_observers: list[Callable[[Job | None, Job], None]] = [self.snapshots.job_changed]

    # ---------------------------------------------------------------------------------------------
    # Start-up

    def load(self, now: float, retention_s: float) -> None:
        """Load everything from the store; live attempts are rebuilt from jobs that hold resources."""
        self.started_at = now
        loaded = self.store.load()
        for node in loaded.nodes:
            self.nodes[node.name] = node
            self.gpu_owner[node.name] = {}
        for job in loaded.jobs:
            if job.state.is_terminal and job.end_time is not None and now - job.end_time > retention_s:
                continue
            self.jobs[job.job_id] = job
            attempt = job.current_attempt
            if job.state.holds_resources and attempt is not None:
                live = LiveAttempt(
                    job_id=job.job_id,
                    attempt=attempt.attempt,
                    allocation=attempt.allocation,
                    pending_nodes=set(attempt.allocation.node_names),
                    started_nodes=set(attempt.allocation.node_names) if job.state != JobState.CONFIGURING else set(),
                )
                if job.state == JobState.COMPLETING and job.reason.startswith(_OUTCOME_PREFIX):
                    live.outcome = JobState(job.reason.removeprefix(_OUTCOME_PREFIX))
                self._own(live)
        for job_id, by_admin in self.store.load_holds().items():
            if job_id in self.jobs and self.jobs[job_id].state == JobState.PENDING:
                self.held.add(job_id)
                if by_admin:
                    self.admin_held.add(job_id)
        log.info("loaded %d jobs and %d nodes from the store", len(self.jobs), len(self.nodes))

    # ---------------------------------------------------------------------------------------------
    # Queries

    def free_gpus(self, node: Node) -> frozenset[int]:
        owned = self.gpu_owner.get(node.name, {})
        return frozenset(g.index for g in node.inventory.gpus if g.index not in owned)

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

    def snapshot(
        self,
        accounting: Accounting | None = None,
        usage: Mapping[tuple[str, str], UsageView] | None = None,
        switches: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Snapshot:
        """The scheduling core's input, from memory (controller/snapshots.py caches the views)."""
        return self.snapshots.build(self, accounting or EMPTY_ACCOUNTING, usage, switches)

    # ---------------------------------------------------------------------------------------------
    # Jobs

    def add_jobs(self, jobs: Sequence[Job]) -> None:
        self.store.save_jobs(jobs)
        for job in jobs:
            self._observe(self.jobs.get(job.job_id), job)
            self.jobs[job.job_id] = job

    def _save(self, jobs: Iterable[Job]) -> None:
        batch = list(jobs)
        if batch:
            self.store.save_jobs(batch)
            for job in batch:
                self._observe(self.jobs.get(job.job_id), job)
                self.jobs[job.job_id] = job

    def _observe(self, before: Job | None, after: Job) -> None:
        for observer in self.job_observers:
            try:
                observer(before, after)
            except Exception:  # an observer's bug must not undo a change the store already holds
                log.exception("job observer %r failed", observer)

    def _own(self, live: LiveAttempt) -> None:
        self.live[(live.job_id, live.attempt)] = live
        for node_alloc in live.allocation.nodes:
            owners = self.gpu_owner.setdefault(node_alloc.node, {})
            for gpu in node_alloc.gpus:
                owners[gpu] = (live.job_id, live.attempt)

    def _release_node(self, live: LiveAttempt, node: str) -> None:
        live.pending_nodes.discard(node)
        owners = self.gpu_owner.get(node, {})
        for gpu in live.allocation.gpus_on(node):
            if owners.get(gpu) == (live.job_id, live.attempt):
                del owners[gpu]

    def start_attempts(self, starts: Sequence[tuple[int, Allocation]], now: float) -> list[Instruction]:
        """Commit the still-valid part of a plan: jobs still pending whose GPUs are still free."""
        started: list[Job] = []
        instructions: list[Instruction] = []
        for job_id, allocation in starts:
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.PENDING or job_id in self.held:
                continue
            if not self._allocation_free(allocation):
                continue
            number = len(job.attempts)
            attempt = Attempt(job_id=job_id, attempt=number, allocation=allocation, start_time=now)
            job = job.with_state(
                JobState.CONFIGURING,
                attempts=(*job.attempts, attempt),
                start_time=now,
                reason="",
                restart_count=number,
            )
            live = LiveAttempt(job_id, number, allocation, pending_nodes=set(allocation.node_names))
            self._own(live)
            started.append(job)
            instructions.extend(Launch(node, job, number) for node in allocation.node_names)
            self.wait_reasons.pop(job_id, None)
        self._save(started)
        return instructions

    def _allocation_free(self, allocation: Allocation) -> bool:
        for node_alloc in allocation.nodes:
            node = self.nodes.get(node_alloc.node)
            if node is None or node.state != NodeState.UP or node.name not in self.connected:
                return False
            owners = self.gpu_owner.get(node.name, {})
            if any(g in owners for g in node_alloc.gpus):
                return False
        return True

    def node_started(self, node: str, job_id: int, attempt: int) -> list[Instruction]:
        live = self.live.get((job_id, attempt))
        job = self.jobs.get(job_id)
        if live is None or job is None:
            # Ranks of an attempt we do not know (or no longer track): stop them.
            return [SignalAttempt(node, job_id, attempt, "kill")]
        if node not in live.allocation.node_names:
            return []  # a node reporting on an attempt it was never given: ignore it
        live.started_nodes.add(node)
        if (
            not live.stale
            and job.state == JobState.CONFIGURING
            and live.started_nodes >= set(live.allocation.node_names)
        ):
            self._save([job.with_state(JobState.RUNNING)])
        return []

    def node_finished(self, node: str, result: NodeResult, now: float) -> list[Instruction]:
        """Every rank of `result`'s attempt on `node` has ended; its GPUs there are free."""
        key = (result.job_id, result.attempt)
        instructions: list[Instruction] = [AckResult(node, result.job_id, result.attempt)]
        live = self.live.get(key)
        if live is None or node not in live.pending_nodes:
            return instructions  # a duplicate report (e.g. after a reconnect): acknowledge it again
        live.results[node] = result
        live.started_nodes.add(node)
        self._release_node(live, node)
        if not live.stale and live.outcome is None:
            job = self.jobs[result.job_id]
            if result.failed:
                # One node's ranks failed: the gang cannot go on; stop the rest. A launch that failed before
                # any rank ran is worth another attempt; a rank's own failure is not (unless --max-restarts).
                rank = result.first_failure()
                why = result.error or (f"rank {rank.rank} exited with {rank.exit_code}" if rank else "failed")
                if rank is not None and rank.error:
                    why += f": {rank.error}"
                retry = result.error.startswith(LAUNCH_FAILED_PREFIX) and job.spec.requeue
                if retry:
                    live.requeue_as = JobState.FAILED
                instructions += self._stop(live, JobState.PENDING if retry else JobState.FAILED, why, now)
            elif (
                live.pending_nodes
                and job.spec.launch == LaunchMode.SINGLE
                and node == live.allocation.node_names[0]
            ):
                # The batch script ended; the rest of the allocation only held the nodes for it.
                instructions += self._stop(live, JobState.COMPLETED, "", now)
        if not live.pending_nodes:
            self._finish(live, now)
        return instructions

    def _stop(self, live: LiveAttempt, outcome: JobState, reason: str, now: float, kill: bool = False) -> list[Instruction]:
        """Decide the attempt's outcome and tell every node still running it to stop."""
        live.outcome = outcome
        live.outcome_reason = reason
        job = self.jobs[live.job_id]
        if job.state in (JobState.CONFIGURING, JobState.RUNNING):
            self._save([job.with_state(JobState.COMPLETING, reason=f"{_OUTCOME_PREFIX}{outcome.value}")])
        action = "kill" if kill else "terminate"
        return [SignalAttempt(node, live.job_id, live.attempt, action) for node in sorted(live.pending_nodes)]

    def preempt(self, job_id: int, grace_s: float, signum: int, now: float) -> list[Instruction]:
        """Warn every rank with `signum` (SIGUSR1: checkpoint now), terminate after the grace period, and
        requeue the job whatever its ranks exit with (a preempted job that exits 0 has not finished)."""
        job = self.jobs.get(job_id)
        attempt = job.current_attempt if job is not None else None
        live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
        if live is None or live.stale or live.outcome is not None:
            return []
        live.outcome = JobState.PENDING
        live.outcome_reason = "preempted"
        live.requeue_as = JobState.PREEMPTED
        live.terminate_at = now + grace_s
        assert job is not None
        if job.state in (JobState.CONFIGURING, JobState.RUNNING):
            self._save([job.with_state(JobState.COMPLETING, reason=f"{_OUTCOME_PREFIX}{JobState.PENDING.value}")])
        return [SignalAttempt(n, job_id, live.attempt, "signal", signum) for n in sorted(live.pending_nodes)]

    def signal_running(self, job_id: int, signum: int) -> list[Instruction]:
        """Send ``signum`` to every rank of the job's running attempt (gcancel --signal); nothing about the job
        changes. [] when the job is not RUNNING: a job still starting, or being stopped, is not signalled."""
        job = self.jobs.get(job_id)
        attempt = job.current_attempt if job is not None else None
        live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
        if job is None or job.state != JobState.RUNNING or live is None or live.stale or live.outcome is not None:
            return []
        return [SignalAttempt(n, job_id, live.attempt, "signal", signum) for n in sorted(live.pending_nodes)]

    def checkpointed(self, job_id: int, attempt: int, when: float) -> None:
        live = self.live.get((job_id, attempt))
        if live is not None:
            live.last_checkpoint = max(when, live.last_checkpoint or 0.0)

    def _finish(self, live: LiveAttempt, now: float) -> None:
        """Every node has reported: close the attempt and move the job on."""
        del self.live[(live.job_id, live.attempt)]
        if live.stale:
            return
        job = self.jobs[live.job_id]
        results = [live.results[n] for n in live.allocation.node_names if n in live.results]
        failure = next((r for r in results if r.failed), None)
        exit_code = 0
        if failure is not None:
            rank = failure.first_failure()
            exit_code = rank.exit_code if rank is not None else 1
        outcome = live.outcome
        reason = live.outcome_reason
        if outcome is None:
            outcome = JobState.FAILED if failure is not None else JobState.COMPLETED
            if failure is not None:
                rank = failure.first_failure()
                reason = failure.error or (f"rank {rank.rank} exited with {rank.exit_code}" if rank else "")
        if outcome == JobState.FAILED and failure is not None and not reason:
            reason = failure.error
        # --max-restarts counts restarts after rank failures only; preemptions, lost nodes and failed
        # launches requeue without using it up.
        rank_failures = sum(
            1
            for a in job.attempts[: live.attempt]
            if a.state == JobState.FAILED and not a.reason.startswith(LAUNCH_FAILED_PREFIX)
        )
        requeue = outcome == JobState.PENDING or (
            outcome == JobState.FAILED and rank_failures < job.spec.max_restarts
        ) or (outcome == JobState.NODE_FAIL and job.spec.requeue)
        attempts = list(job.attempts)
        attempt_state = live.requeue_as if outcome == JobState.PENDING else outcome
        attempts[live.attempt] = replace(
            attempts[live.attempt], end_time=now, state=attempt_state, exit_code=exit_code, reason=reason
        )
        if requeue:
            self._save([job.with_state(JobState.PENDING, attempts=tuple(attempts), reason=f"Requeued: {reason}")])
            return
        self._save(
            [job.with_state(outcome, attempts=tuple(attempts), end_time=now, exit_code=exit_code, reason=reason)]
        )

    def cancel(self, job_ids: Iterable[int], now: float) -> tuple[list[int], list[Instruction]]:
        cancelled: list[int] = []
        instructions: list[Instruction] = []
        pending_done: list[Job] = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.state.is_terminal:
                continue
            cancelled.append(job_id)
            if job.state == JobState.PENDING:
                self.held.discard(job_id)
                pending_done.append(job.with_state(JobState.CANCELLED, end_time=now, reason="cancelled"))
                continue
            attempt = job.current_attempt
            assert attempt is not None
            live = self.live.get((job_id, attempt.attempt))
            if live is not None and live.outcome is None:
                instructions += self._stop(live, JobState.CANCELLED, "cancelled", now)
        self._save(pending_done)
        return cancelled, instructions

    # ---------------------------------------------------------------------------------------------
    # Job control (gcontrol) and node drain (gadmin): the caller has checked permissions.

    def hold(self, job_ids: Iterable[int], by_admin: bool) -> list[int]:
        """Keep pending jobs from starting until released; returns the jobs held."""
        changed = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue
            admin = by_admin or job_id in self.admin_held
            self.store.set_hold(job_id, admin)
            self.held.add(job_id)
            if admin:
                self.admin_held.add(job_id)
            changed.append(job_id)
        return changed

    def release(self, job_ids: Iterable[int]) -> list[int]:
        changed = []
        for job_id in job_ids:
            if job_id not in self.held:
                continue
            self.store.set_hold(job_id, None)
            self.held.discard(job_id)
            self.admin_held.discard(job_id)
            changed.append(job_id)
        return changed

    def requeue(self, job_ids: Iterable[int], now: float) -> tuple[list[int], list[Instruction]]:
        """Stop running jobs and put them back in the queue (their attempt ends CANCELLED)."""
        requeued: list[int] = []
        instructions: list[Instruction] = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            attempt = job.current_attempt if job is not None else None
            live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
            if live is None or live.stale or live.outcome is not None:
                continue
            live.requeue_as = JobState.CANCELLED
            instructions += self._stop(live, JobState.PENDING, "requeued by request", now)
            requeued.append(job_id)
        return requeued, instructions

    def update_job(self, job: Job) -> None:
        """Replace a job's time limit, priority or QoS (not its state), written through."""
        current = self.jobs.get(job.job_id)
        if current is None or current.state != job.state:
            raise ValueError(f"job {job.job_id} changed state meanwhile")
        self._save([job])

    def set_drain(self, name: str, drain: bool, reason: str) -> Node:
        """Drain a node (no new jobs; running ones go on) or resume it."""
        node = self.nodes[name]
        if drain:
            node = replace(node, state=NodeState.DRAIN, reason=reason)
        else:
            self.silent_drained.discard(name)
            up = name in self.connected
            node = replace(node, state=NodeState.UP if up else NodeState.DOWN, reason="" if up else "not responding")
        self.store.save_node(node)
        self.nodes[name] = node
        return node

    def expire_time_limits(self, now: float) -> list[Instruction]:
        """Time limits, --signal warnings before them, and the ends of preemption grace periods."""
        instructions: list[Instruction] = []
        for live in list(self.live.values()):
            if live.terminate_at is not None and now >= live.terminate_at:
                live.terminate_at = None
                instructions += [
                    SignalAttempt(n, live.job_id, live.attempt, "terminate") for n in sorted(live.pending_nodes)
                ]
            if live.stale or live.outcome is not None:
                continue
            job = self.jobs[live.job_id]
            attempt = job.attempts[live.attempt]
            elapsed = now - attempt.start_time
            if elapsed >= job.time_limit_s:
                instructions += self._stop(live, JobState.TIMEOUT, "time limit reached", now)
            elif job.spec.signal is not None and not live.warned:
                warning = parse_signal_request(job.spec.signal)
                if elapsed >= job.time_limit_s - warning.seconds:
                    live.warned = True
                    instructions += [
                        SignalAttempt(n, live.job_id, live.attempt, "signal", warning.signum)
                        for n in sorted(live.pending_nodes)
                    ]
        return instructions

    # ---------------------------------------------------------------------------------------------
    # Nodes

    def register_node(
        self,
        name: str,
        inventory: NodeInventory,
        partitions: frozenset[str],
        running: Sequence[tuple[int, int]],
        finished: Sequence[NodeResult],
        now: float,
    ) -> list[Instruction]:
        """An agent (re)connected: record its inventory, then reconcile what it runs with what we think."""
        old = self.nodes.get(name)
        state = NodeState.UP
        reason = ""
        if old is not None and old.state == NodeState.DRAIN:
            state, reason = old.state, old.reason
        node = Node(name=name, inventory=inventory, state=state, reason=reason, last_heartbeat=now)
        self.store.save_node(node)
        self.nodes[name] = node
        self.node_partitions[name] = partitions
        self.gpu_owner.setdefault(name, {})
        self.connected.add(name)
        self.silent_drained.discard(name)

        instructions: list[Instruction] = []
        for result in finished:
            instructions += self.node_finished(name, result, now)
        reported_running = set(running)
        for job_id, attempt in sorted(reported_running):
            live = self.live.get((job_id, attempt))
            if live is None:
                # Ranks of an attempt the job has left behind (this node was declared down and the job
                # moved on): kill them, and keep their GPUs busy until the agent reports them ended.
                job = self.jobs.get(job_id)
                allocation = None
                if job is not None and attempt < len(job.attempts):
                    allocation = job.attempts[attempt].allocation
                if allocation is not None and name in allocation.node_names:
                    stale = LiveAttempt(job_id, attempt, allocation, pending_nodes={name}, stale=True)
                    self.live[(job_id, attempt)] = stale
                    owners = self.gpu_owner[name]
                    for gpu in allocation.gpus_on(name):
                        owners.setdefault(gpu, (job_id, attempt))
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            if name not in live.pending_nodes:
                instructions.append(SignalAttempt(name, job_id, attempt, "kill"))
                continue
            instructions += self.node_started(name, job_id, attempt)
            if live.outcome is not None or live.stale:
                instructions.append(SignalAttempt(name, job_id, attempt, "terminate"))
        finished_keys = {(r.job_id, r.attempt) for r in finished}
        for live in list(self.live.values()):
            key = (live.job_id, live.attempt)
            if name not in live.pending_nodes or key in reported_running or key in finished_keys:
                continue
            job = self.jobs[live.job_id]
            if live.stale or live.outcome is not None:
                # It was being stopped and the agent no longer has it: it has ended.
                instructions += self.node_finished(name, NodeResult(live.job_id, live.attempt, (), "lost"), now)
            elif name not in live.started_nodes and job.state == JobState.CONFIGURING:
                # The launch may never have reached the agent (controller crash): launches are idempotent.
                instructions.append(Launch(name, job, live.attempt))
            else:
                # The agent lost the ranks (its node rebooted): the attempt cannot go on.
                instructions += self._lose_node(live, name, "ranks lost on node " + name, now)
        return instructions

    def heartbeat(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is not None:
            self.nodes[name] = replace(node, last_heartbeat=now)

    def disconnect(self, name: str) -> None:
        self.connected.discard(name)

    def _lose_node(self, live: LiveAttempt, name: str, reason: str, now: float) -> list[Instruction]:
        instructions: list[Instruction] = []
        self._release_node(live, name)
        if not live.stale and live.outcome is None:
            job = self.jobs[live.job_id]
            outcome = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
            instructions += self._stop(live, outcome, reason, now, kill=True)
        if not live.pending_nodes:
            self._finish(live, now)
        return instructions

    def expire_heartbeats(self, now: float) -> list[Instruction]:
        """Nodes silent past the timeout go DOWN; the attempts running there are requeued or failed."""
        instructions: list[Instruction] = []
        for node in list(self.nodes.values()):
            if node.state == NodeState.DOWN or node.name in self.silent_drained:
                continue
            last = max(node.last_heartbeat, self.started_at)
            if now - last < self.heartbeat_timeout_s:
                continue
            if node.state == NodeState.DRAIN:
                # An admin's drain outlives the node going silent (a reboot for maintenance): it comes back
                # drained, not UP. Its jobs are lost all the same.
                log.warning("drained node %s missed heartbeats for %.1fs", node.name, now - last)
                self.silent_drained.add(node.name)
            else:
                log.warning("node %s missed heartbeats for %.1fs: DOWN", node.name, now - last)
                down = replace(node, state=NodeState.DOWN, reason="not responding")
                self.store.save_node(down)
                self.nodes[node.name] = down
            self.connected.discard(node.name)
            for live in list(self.live.values()):
                if node.name in live.pending_nodes:
                    instructions += self._lose_node(live, node.name, f"node {node.name} not responding", now)
        return instructions

    def purge_finished(self, now: float, retention_s: float) -> list[int]:
        """Forget (in memory) terminal jobs older than the retention; the store keeps them."""
        old = [
            j.job_id
            for j in self.jobs.values()
            if j.state.is_terminal and j.end_time is not None and now - j.end_time > retention_s
        ]
        for job_id in old:
            del self.jobs[job_id]
        return old
