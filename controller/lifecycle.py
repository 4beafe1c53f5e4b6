"""The job lifecycle: how an attempt starts running, ends, is stopped, preempted, held or requeued.

Like Dask's worker state machine, every change enters through a few named operations that return
*instructions* (controller/instructions.py) instead of doing I/O, and every job change is written through
to the store before memory changes. What each attempt holds is the ledger's (controller/ledger.py); this
module decides what happens to jobs as their attempts' ranks start and end, and as users, admins and
timers intervene. Node arrivals and losses are controller/reconcile.py's; ClusterState
(controller/state.py) puts the parts together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from garrison.controller.instructions import AckResult, Instruction, SignalAttempt
from garrison.controller.ledger import AttemptLedger, LiveAttempt
from garrison.controller.signals import parse_signal_request
from garrison.model.domain import LAUNCH_FAILED_PREFIX, Job, JobState, LaunchMode, NodeResult

if TYPE_CHECKING:
    from garrison.controller.store import Store

log = logging.getLogger("garrison.controller.state")

# Job.reason of a COMPLETING job records why it is being stopped, so a restarted controller knows the
# outcome it had decided (CANCELLED, TIMEOUT, FAILED, NODE_FAIL, or PENDING for a requeue).
OUTCOME_PREFIX = "stopping:"


class JobLifecycle:
    """Jobs in memory, written through to the store, and the operations that move them on."""

    def __init__(self, store: Store, ledger: AttemptLedger) -> None:
        self.store = store
        self.ledger = ledger
        self.jobs: dict[int, Job] = {}
        # The ledger's collections, under the names the engine, policy and views have always used.
        self.live = ledger.live
        self.held = ledger.held
        self.admin_held: set[int] = set()  # held by an admin: only an admin may release them
        self.wait_reasons: dict[int, str] = {}
        # Called with (the job before, the job after) for every job change written through to the store
        # (before is None for a new job): metrics and job event logs. They must not raise or block.
        self.job_observers: list[Callable[[Job | None, Job], None]] = []

    def _remember(self, job: Job) -> None:
        """Keep a job in memory, and the ledger's queue of startable jobs in step with it."""
        self.jobs[job.job_id] = job
        if job.state == JobState.PENDING:
            self.ledger.queued[job.job_id] = len(job.attempts)
        else:
            self.ledger.queued.pop(job.job_id, None)

    def add_jobs(self, jobs: Sequence[Job]) -> None:
        self.store.save_jobs(jobs)
        for job in jobs:
            self._observe(self.jobs.get(job.job_id), job)
            self._remember(job)

    def _save(self, jobs: Iterable[Job]) -> None:
        batch = list(jobs)
        if batch:
            self.store.save_jobs(batch)
            for job in batch:
                self._observe(self.jobs.get(job.job_id), job)
                self._remember(job)

    def _observe(self, before: Job | None, after: Job) -> None:
        for observer in self.job_observers:
            try:
                observer(before, after)
            except Exception:  # an observer's bug must not undo a change the store already holds
                log.exception("job observer %r failed", observer)

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
        self.ledger.release_node(live, node)
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
            self._save([job.with_state(JobState.COMPLETING, reason=f"{OUTCOME_PREFIX}{outcome.value}")])
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
        self.ledger.begin_preemption(live, now + grace_s)
        assert job is not None
        if job.state in (JobState.CONFIGURING, JobState.RUNNING):
            self._save([job.with_state(JobState.COMPLETING, reason=f"{OUTCOME_PREFIX}{JobState.PENDING.value}")])
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
        self.ledger.close(live)
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
    # Job control (gcontrol): the caller has checked permissions.

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
