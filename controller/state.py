"""The controller's authoritative cluster state, in memory, written through to the store.

ClusterState is the facade the engine uses; it is made of three parts, each answering one question:

- controller/ledger.py: which attempts are live and what each holds where; whether a plan still holds
  (``AttemptLedger.apply``, shared with gsim);
- controller/lifecycle.py: how jobs move on as their attempts start, end and are stopped;
- controller/reconcile.py: nodes registering, reconnecting, going silent and being drained.

What is left here puts them together: loading everything from the store at start-up, the scheduling
core's snapshot, and applying a plan (the ledger decides, the store is written, then memory changes).
Every operation returns *instructions* (controller/instructions.py) that the engine carries out over the
agent links, so the whole job life cycle is testable without a network.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from garrison.controller.instructions import AckResult, Instruction, Launch, SignalAttempt
from garrison.controller.ledger import AttemptLedger, LiveAttempt, PlanResult
from garrison.controller.lifecycle import LEGACY_OUTCOME_PREFIX
from garrison.controller.reconcile import NodeReconciliation
from garrison.controller.sched.cycle import Plan, Start
from garrison.controller.sched.snapshot import EMPTY_ACCOUNTING, Snapshot, UsageView
from garrison.controller.snapshots import SnapshotCache
from garrison.model.domain import Allocation, Attempt, Job, JobState, Node, NodeResult
from garrison.model.partitions import first_partition

if TYPE_CHECKING:
    from garrison.controller.store import Store
    from garrison.model.accounts import Accounting

__all__ = [
    "AckResult", "ClusterState", "Instruction", "Launch", "LiveAttempt", "NodeResult", "SignalAttempt",
]

log = logging.getLogger("garrison.controller.state")


class ClusterState(NodeReconciliation):
    def __init__(self, store: Store, heartbeat_timeout_s: float, fence_delay_s: float | None = None) -> None:
        super().__init__(store, AttemptLedger(), heartbeat_timeout_s, fence_delay_s)
        self.snapshots = SnapshotCache()
        self.job_observers.append(self.snapshots.job_changed)
        self.job_observers.append(self._forget_wait_reason)

    def _forget_wait_reason(self, before: Job | None, job: Job) -> None:
        """A job that is no longer pending (started, cancelled, ended) waits for nothing: drop its reason."""
        if job.state != JobState.PENDING:
            self.wait_reasons.pop(job.job_id, None)

    # ---------------------------------------------------------------------------------------------
    # Start-up

    def load(self, now: float, retention_s: float) -> None:
        """Load everything from the store; live attempts are rebuilt from jobs that hold resources."""
        self.started_at = now
        loaded = self.store.load()
        stops = {(stop.job_id, stop.attempt): stop for stop in loaded.stops}
        for node in loaded.nodes:
            self.nodes[node.name] = node
            self.gpu_owner[node.name] = {}
        kept = [job for job in loaded.jobs
                if not (job.end_time is not None and now - job.end_time > retention_s and job.state.is_terminal)]
        self._remember_loaded(kept)
        pending = JobState.PENDING
        for job in kept:
            # Most of a large store is pending (an identity test, where holds_resources hashes the Enum).
            attempt = job.current_attempt if job.state is not pending and job.state.holds_resources else None
            if attempt is not None:
                live = LiveAttempt(
                    job_id=job.job_id,
                    attempt=attempt.attempt,
                    allocation=attempt.allocation,
                    pending_nodes=set(attempt.allocation.node_names),
                    started_nodes=set(attempt.allocation.node_names) if job.state != JobState.CONFIGURING else set(),
                )
                stop = stops.get((job.job_id, attempt.attempt))
                if job.state == JobState.COMPLETING and stop is None and job.reason.startswith(LEGACY_OUTCOME_PREFIX):
                    # Written by a controller from before AttemptStop (lifecycle.py): the outcome in the reason.
                    live.outcome = JobState(job.reason.removeprefix(LEGACY_OUTCOME_PREFIX))
                if job.state == JobState.COMPLETING and stop is not None:
                    # The decision as it was made: a preemption stays a preemption (recorded PREEMPTED, with
                    # its reason) and keeps what is left of its grace period.
                    live.outcome, live.requeue_as = stop.outcome, stop.requeue_as
                    live.outcome_reason, live.terminate_at = stop.reason, stop.terminate_at
                self.ledger.own(live)
        for job_id, by_admin in self.store.load_holds().items():
            if job_id in self.jobs and self.jobs[job_id].state == JobState.PENDING:
                self.held.add(job_id)
                if by_admin:
                    self.admin_held.add(job_id)
        log.info("loaded %d jobs and %d nodes from the store", len(self.jobs), len(self.nodes))

    # ---------------------------------------------------------------------------------------------
    # Queries

    def free_gpus(self, node: Node) -> frozenset[int]:
        return self.ledger.free_gpus(node)

    def held_cpus_and_memory(self) -> tuple[dict[str, set[int]], dict[str, int]]:
        """Per node, the CPUs and host memory (MB) that attempts still hold there (see the ledger)."""
        return self.ledger.held_cpus_and_memory()

    def snapshot(
        self,
        accounting: Accounting | None = None,
        usage: Mapping[tuple[str, str], UsageView] | None = None,
        switches: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Snapshot:
        """The scheduling core's input, from memory (controller/snapshots.py caches the views)."""
        return self.snapshots.build(self, accounting or EMPTY_ACCOUNTING, usage, switches)

    # ---------------------------------------------------------------------------------------------
    # Plans

    def apply_plan(self, plan: Plan, now: float) -> tuple[PlanResult, list[Instruction]]:
        """Commit what still holds of a plan (the ledger decides): the started jobs are written to the store
        before memory changes, so a failed write leaves memory as it was. Returns the ledger's result (its
        ``preempting`` are for the caller to carry out: the engine decides signals and grace) and the
        launches of the started attempts."""
        started: list[Job] = []

        def write_through(result: PlanResult, when: float) -> None:
            for start in result.started:
                job = self.jobs[start.job_id]
                attempt = Attempt(job_id=start.job_id, attempt=start.attempt, allocation=start.allocation,
                                  start_time=when)
                started.append(job.with_state(
                    JobState.CONFIGURING,
                    attempts=(*job.attempts, attempt),
                    start_time=when,
                    reason="",
                    restart_count=start.attempt,
                    # -p a,b: from here on the job is in the partition it started in (plan.Start.partition)
                    partition=start.partition or first_partition(job.partition),
                ))
            self._save(started)

        with self.atomically():  # the store commits the starts before the ledger's change is kept
            result = self.ledger.apply(plan, now, before_commit=write_through)
            for job in started:
                self.wait_reasons.pop(job.job_id, None)  # journaled: _save has seen the job
        instructions: list[Instruction] = []
        for job in started:
            attempt = len(job.attempts) - 1
            instructions.extend(Launch(node, job, attempt) for node in job.attempts[attempt].allocation.node_names)
        return result, instructions

    def start_attempts(self, starts: Sequence[tuple[int, Allocation]], now: float) -> list[Instruction]:
        """Commit the still-valid part of a plan's starts: jobs still pending whose GPUs are still free."""
        _, instructions = self.apply_plan(Plan(starts=tuple(Start(j, a) for j, a in starts)), now)
        return instructions
