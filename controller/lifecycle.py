"""The job lifecycle: how an attempt starts running, ends, is stopped, preempted, held or requeued.

Like Dask's worker state machine, every change enters through a few named operations that return
*instructions* (controller/instructions.py) instead of doing I/O, and every job change is written through
to the store before memory changes. What each attempt holds is the ledger's (controller/ledger.py); this
module decides what happens to jobs as their attempts' ranks start and end, and as users, admins and
timers intervene. Node arrivals and losses are controller/reconcile.py's; ClusterState
(controller/state.py) puts the parts together.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from garrison.controller.instructions import AckResult, Instruction, ReleaseGang, SignalAttempt
from garrison.controller.ledger import AttemptLedger, LiveAttempt
from garrison.controller.signals import parse_signal_request
from garrison.controller.store.errors import StoreUnavailable
from garrison.controller.store.interface import AttemptStop
from garrison.controller.transaction import MemoryCheckpoint, PendingWrites, atomic
from garrison.model.domain import (
    Attempt,
    AttemptUsage,
    Job,
    JobState,
    LaunchMode,
    NodeResult,
)

if TYPE_CHECKING:
    from garrison.controller.store import Store

log = logging.getLogger("garrison.controller.state")

# What a controller decided for an attempt it is stopping (CANCELLED, TIMEOUT, FAILED, NODE_FAIL, or PENDING
# for a requeue) is an AttemptStop, written with the job's COMPLETING state; the job's reason is the
# decision's reason, for people. Databases written before AttemptStop existed recorded the outcome in the
# reason as "stopping:STATE", which state.py still reads.
LEGACY_OUTCOME_PREFIX = "stopping:"

T = TypeVar("T")


def out_of_memory_reason(node: str, result: NodeResult) -> str:
    kills = result.usage.oom_kills if result.usage is not None else 0
    count = f"{kills} process{'es' if kills != 1 else ''}" if kills else "a process"
    return f"out of memory: the memory limit (--mem) killed {count} on {node}"


DEFAULT_MAX_LAUNCH_FAILURES = 5  # also the most attempts in a row whose supervisor died before the job ends
SUPERVISOR_LOST = "the attempt's supervisor died"  # in an attempt's reason: how the next one counts them
LAUNCH_BACKOFF_S = 1.0
MAX_LAUNCH_BACKOFF_S = 60.0


class JobLifecycle:
    """Jobs in memory, written through to the store, and the operations that move them on."""

    def __init__(self, store: Store, ledger: AttemptLedger) -> None:
        self.store = store
        self.ledger = ledger
        self.jobs: dict[int, Job] = {}
        # The ledger's collections, under the names the engine, policy and views have always used.
        self.live = ledger.live
        self.max_launch_failures = DEFAULT_MAX_LAUNCH_FAILURES  # controller.max_launch_failures
        self.held = ledger.held
        self.admin_held: set[int] = set()  # held by an admin: only an admin may release them
        self.wait_reasons: dict[int, str] = {}
        # Called with (the job before, the job after) for every job change written through to the store
        # (before is None for a new job): metrics and job event logs. They must not raise or block.
        self.job_observers: list[Callable[[Job | None, Job], None]] = []
        self._pending: PendingWrites | None = None  # the operation under way (controller/transaction.py)
        # Bumped by every change a scheduling cycle could see (jobs, holds, live attempts, nodes, policy): the
        # engine plans again only when it has moved since its last cycle's snapshot (controller/cycles.py).
        # The listeners (the engine's wake-up) are called on every bump; they must be cheap and not raise.
        self.generation = 0
        # (end time, job id) of the jobs that ended, oldest first, so that the timer's purge of the old ones
        # looks at those due rather than at every job in memory (50,000 pending ones, 5 times a second). An
        # entry whose job has changed since (or was rolled back) is dropped when it comes up.
        self._ended: list[tuple[float, int]] = []
        self.generation_listeners: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def atomically(self) -> Iterator[PendingWrites]:
        """Run an operation all or nothing: its writes go to the store in one transaction when it ends, and if
        that fails (StoreUnavailable) or the operation raises, memory is put back as it was. Nested calls join
        the outer operation."""
        if self._pending is not None:
            yield self._pending
            return
        pending = PendingWrites(MemoryCheckpoint(self))
        self._pending = pending
        try:
            yield pending
            self.store.write(pending.changes())
        except BaseException:
            pending.checkpoint.restore()
            raise
        finally:
            self._pending = None
        for before, after in pending.observed:
            self._observe(before, after)

    def _remember(self, job: Job) -> None:
        """Keep a job in memory, and the ledger's queue of startable jobs in step with it."""
        self._job_changing(job.job_id)
        self.jobs[job.job_id] = job
        if job.state == JobState.PENDING:
            self.ledger.queued[job.job_id] = len(job.attempts)
        else:
            self.ledger.queued.pop(job.job_id, None)
            if job.state.is_terminal and job.end_time is not None:
                heapq.heappush(self._ended, (job.end_time, job.job_id))

    def _remember_loaded(self, jobs: Iterable[Job]) -> None:
        """_remember for the jobs read from the store at start-up, in one pass: no operation is open and
        nothing listens yet, so one step of the generation stands for them all (a step and a journal check
        per job cost a restart with 50,000 jobs ~0.1 s)."""
        assert self._pending is None, "jobs are loaded before any operation"
        self.scheduling_inputs_changed()
        known, queued, ended = self.jobs, self.ledger.queued, self._ended
        pending = JobState.PENDING
        for job in jobs:
            known[job.job_id] = job
            if job.state is pending:
                queued[job.job_id] = len(job.attempts)
            elif job.end_time is not None and job.state.is_terminal:
                ended.append((job.end_time, job.job_id))
        heapq.heapify(ended)

    def add_jobs(self, jobs: Sequence[Job]) -> None:
        self._save(jobs)

    def remember_stored(self, jobs: Iterable[Job]) -> None:
        """The memory half of add_jobs, for new jobs already in the store (controller/bulk.py writes a large
        array's tasks in chunks first, then hands them here a chunk at a time)."""
        for job in jobs:
            self._observe(self.jobs.get(job.job_id), job)
            self._remember(job)
    def scheduling_inputs_changed(self) -> None:
        """Something a scheduling cycle reads has changed (or is about to): a cycle is due. Called before the
        change, so a change that is then rolled back costs one needless cycle, never a missed one."""
        self.generation += 1
        for listener in self.generation_listeners:
            listener()

    def _job_changing(self, job_id: int) -> None:
        """Before a job, its queue entry, hold or wait reason changes: the operation's checkpoint journals it."""
        self.scheduling_inputs_changed()
        if self._pending is not None:
            self._pending.checkpoint.job_changing(job_id)

    def _live_changing(self, live: LiveAttempt) -> None:
        """Before a live attempt's fields change: the operation's checkpoint journals them."""
        self.scheduling_inputs_changed()
        if self._pending is not None:
            self._pending.checkpoint.live_changing(live)

    def _save(self, jobs: Iterable[Job]) -> None:
        """Change jobs: in memory at once, in the store when the operation commits (or not at all)."""
        with self.atomically() as pending:
            for job in jobs:
                pending.jobs[job.job_id] = job
                pending.observed.append((self.jobs.get(job.job_id), job))
                self._remember(job)

    def _save_stop(self, live: LiveAttempt) -> None:
        """Make the decision to stop ``live`` durable with the job's COMPLETING state (see AttemptStop)."""
        assert live.outcome is not None
        with self.atomically() as pending:
            pending.stops[(live.job_id, live.attempt)] = AttemptStop(
                live.job_id, live.attempt, live.outcome, live.requeue_as, live.outcome_reason, live.terminate_at
            )

    def each_atomically(self, items: Iterable[T], step: Callable[[T], list[Instruction]]) -> tuple[list[Instruction], int]:
        """Run ``step`` on each item as an operation of its own, so that one failed write does not undo the
        others; an item whose write failed is left as it was, for the next timer tick to try again. Returns
        the instructions of the items that committed and how many did not."""
        instructions: list[Instruction] = []
        deferred = 0
        for item in items:
            try:
                with self.atomically():
                    done = step(item)
            except StoreUnavailable:
                deferred += 1
                continue
            instructions += done
        return instructions, deferred

    def _observe(self, before: Job | None, after: Job) -> None:
        for observer in self.job_observers:
            try:
                observer(before, after)
            except Exception:  # an observer's bug must not undo a change the store already holds
                log.exception("job observer %r failed", observer)

    @atomic
    def node_started(self, node: str, job_id: int, attempt: int) -> list[Instruction]:
        live = self.live.get((job_id, attempt))
        job = self.jobs.get(job_id)
        if live is None or job is None:
            # Ranks of an attempt we do not know (or no longer track): stop them.
            return [SignalAttempt(node, job_id, attempt, "kill")]
        if node not in live.allocation.node_names:
            return []  # a node reporting on an attempt it was never given: ignore it
        self._live_changing(live)
        live.started_nodes.add(node)
        names = live.allocation.node_names
        if live.stale or live.started_nodes < set(names):
            return []
        released = [node]  # a node reporting again (after a reconnect) may have missed its release
        if job.state == JobState.CONFIGURING:
            self._save([job.with_state(JobState.RUNNING)])
            released = list(names)
        if len(names) == 1 or live.outcome is not None:
            return []  # one node has no start barrier; a gang being stopped is not released
        # The gang's start barrier (all or nothing): every node has launched, so every node's ranks may start.
        return [ReleaseGang(n, live.job_id, live.attempt) for n in released]

    @atomic
    def node_finished(self, node: str, result: NodeResult, now: float) -> list[Instruction]:
        """Every rank of `result`'s attempt on `node` has ended; its GPUs there are free."""
        key = (result.job_id, result.attempt)
        instructions: list[Instruction] = []
        live = self.live.get(key)
        if live is None or node not in live.pending_nodes:
            if live is not None and node in live.held_acks:
                return instructions  # reported again (a reconnect): still held, as the first report was
            # A duplicate report (e.g. after a reconnect): acknowledge it again.
            return [AckResult(node, result.job_id, result.attempt)]
        self._live_changing(live)
        live.results[node] = result
        live.held_acks.add(node)
        live.started_nodes.add(node)
        self.ledger.release_node(live, node)
        if not live.stale and live.outcome is None:
            job = self.jobs[result.job_id]
            if result.lease_expired:
                # The node's supervisors stopped the ranks when its lease ran out (a controller outage longer
                # than the lease, an agent frozen or cut off): the node's failure, not the job's.
                live.requeue_as = JobState.NODE_FAIL
                outcome = JobState.PENDING if job.spec.requeue else JobState.NODE_FAIL
                instructions += self._stop(live, outcome, f"node {node} lease expired", now)
            elif result.supervisor_lost:
                # The attempt's supervisor (slurmstepd's part) was killed or crashed, taking its ranks: the node's
                # failure, requeued as for a lost node (Slurm's NODE_FAIL), unless it keeps happening to this
                # job, which then ends rather than loop.
                live.requeue_as = JobState.NODE_FAIL
                lost_before = self._supervisors_lost_in_a_row(job, live.attempt)
                retry = job.spec.requeue and lost_before + 1 < self.max_launch_failures
                why = f"node {node}: {SUPERVISOR_LOST} ({result.error})"
                outcome = JobState.PENDING if retry else JobState.NODE_FAIL
                if job.spec.requeue and not retry:  # FAILED: a NODE_FAIL of a requeueable job is requeued
                    why = f"{lost_before + 1} attempts in a row lost their supervisor, the last on {why}"
                    outcome = JobState.FAILED
                instructions += self._stop(live, outcome, why, now)
            elif result.out_of_memory:
                # The kernel enforced the job's memory limit there: as in Slurm, the job is OUT_OF_MEMORY
                # (whatever its ranks exited with), and the rest of the gang is stopped.
                instructions += self._stop(live, JobState.OUT_OF_MEMORY, out_of_memory_reason(node, result), now)
            elif result.failed:
                # One node's ranks failed: the gang cannot go on; stop the rest. A launch that failed before
                # any rank ran is worth another attempt; a rank's own failure is not (unless --max-restarts).
                rank = result.first_failure()
                why = result.error or (rank.describe() if rank else "failed")
                if rank is not None and rank.error:
                    why += f": {rank.error}"
                retry = result.launch_failed and job.spec.requeue
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
        return instructions + self.held_acks(live)

    def held_acks(self, live: LiveAttempt) -> list[Instruction]:
        """The acknowledgements of ``live``'s node results that may go out now: all of them once the attempt's
        fate is durable (it has ended, or its stop is decided and stored), none before.

        A gang node whose ranks ended while the other nodes' still run changes nothing in the store: its result
        is kept in memory. Acknowledged at once, the agent forgot it; a controller restarted before the gang
        ended loaded the attempt with that node still pending, found its agent running nothing and holding no
        result, and requeued as "ranks lost" a job whose ranks had all ended 0: it ran twice
        (tests/benchmarks/chaos.py). Held, the result waits on the agent's disk, and the agent reports it again
        when it registers with the restarted controller."""
        if not live.held_acks or (live.pending_nodes and live.outcome is None and not live.stale):
            return []
        self._live_changing(live)
        acks: list[Instruction] = [AckResult(n, live.job_id, live.attempt) for n in sorted(live.held_acks)]
        live.held_acks.clear()
        return acks

    def _stop(self, live: LiveAttempt, outcome: JobState, reason: str, now: float, kill: bool = False) -> list[Instruction]:
        """Decide the attempt's outcome and tell every node still running it to stop."""
        self._live_changing(live)
        live.outcome = outcome
        live.outcome_reason = reason
        job = self.jobs[live.job_id]
        if job.state in (JobState.CONFIGURING, JobState.RUNNING):
            self._save([job.with_state(JobState.COMPLETING, reason=reason)])
        self._save_stop(live)
        action = "kill" if kill else "terminate"
        return [SignalAttempt(node, live.job_id, live.attempt, action) for node in sorted(live.pending_nodes)]

    @atomic
    def preempt(self, job_id: int, grace_s: float, signum: int, now: float) -> list[Instruction]:
        """Warn every rank with `signum` (SIGUSR1: checkpoint now), terminate after the grace period, and
        requeue the job whatever its ranks exit with (a preempted job that exits 0 has not finished)."""
        job = self.jobs.get(job_id)
        attempt = job.current_attempt if job is not None else None
        live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
        if live is None or live.stale or live.outcome is not None:
            return []
        self._live_changing(live)
        self.ledger.begin_preemption(live, now + grace_s)
        assert job is not None
        if job.state in (JobState.CONFIGURING, JobState.RUNNING):
            self._save([job.with_state(JobState.COMPLETING, reason=live.outcome_reason or "preempted")])
        self._save_stop(live)  # the grace deadline with it: a restarted controller keeps what is left of it
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

    def running_usage(self, node: str, job_id: int, attempt: int, usage: AttemptUsage) -> None:
        live = self.live.get((job_id, attempt))
        if live is not None and node in live.pending_nodes:
            live.running_usage[node] = usage

    def running_usage_of(self, job_id: int, attempt: int) -> AttemptUsage | None:
        live = self.live.get((job_id, attempt))
        return None if live is None else AttemptUsage.combine(list(live.running_usage.values()))

    @staticmethod
    def _supervisors_lost_in_a_row(job: Job, attempt: int) -> int:
        in_a_row = 0
        for earlier in reversed(job.attempts[:attempt]):
            if earlier.state != JobState.NODE_FAIL or SUPERVISOR_LOST not in earlier.reason:
                break
            in_a_row += 1
        return in_a_row

    def _back_off_launch(self, job: Job, attempts: list[Attempt], reason: str, now: float) -> tuple[Job, str]:
        """A launch failed before any rank ran (its MASTER_PORT taken, say): the job waits 1, 2, 4... s
        (as a --begin time) before its next attempt, with a new port; after max_launch_failures of them in
        a row it ends FAILED, saying so, rather than being retried for ever (issue 20)."""
        in_a_row = 0
        for attempt in reversed(attempts):
            if attempt.state != JobState.FAILED or not attempt.launch_failed:
                break
            in_a_row += 1
        if in_a_row >= self.max_launch_failures:
            why = f"{in_a_row} launches failed in a row, the last: {reason}"
            return job.with_state(JobState.FAILED, attempts=tuple(attempts), end_time=now, exit_code=1, reason=why), why
        delay = min(LAUNCH_BACKOFF_S * 2 ** (in_a_row - 1), MAX_LAUNCH_BACKOFF_S)
        begin = max(job.spec.begin_time or 0.0, now + delay)
        return replace(job, spec=replace(job.spec, begin_time=begin)), reason

    def _finish(self, live: LiveAttempt, now: float) -> None:
        """Every node has reported: close the attempt and move the job on."""
        self._live_changing(live)
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
                reason = failure.error or (rank.describe() if rank else "")
        if outcome == JobState.FAILED and failure is not None and not reason:
            reason = failure.error
        if failure is None and job.exit_code is not None and job.spec.launch == LaunchMode.ALLOCATION:
            exit_code = job.exit_code  # galloc's command's, given when it released the allocation
        # --max-restarts counts restarts after rank failures only; preemptions, lost nodes and failed
        # launches requeue without using it up.
        rank_failures = sum(
            1
            for a in job.attempts[: live.attempt]
            if a.state == JobState.FAILED and not a.launch_failed
        )
        requeue = outcome == JobState.PENDING or (
            outcome == JobState.FAILED and rank_failures < job.spec.max_restarts
        ) or (outcome == JobState.NODE_FAIL and job.spec.requeue)
        attempts = list(job.attempts)
        attempt_state = live.requeue_as if outcome == JobState.PENDING else outcome
        if requeue and job.spec.launch == LaunchMode.ALLOCATION:
            # galloc's command has been told its nodes are gone (SIGHUP): an interactive allocation is never
            # requeued (salloc's neither), or it would hold GPUs again with nobody to use them.
            requeue = False
            if outcome == JobState.PENDING:
                outcome, reason = JobState.CANCELLED, reason or "preempted"
        usage = AttemptUsage.combine([r.usage for r in results if r.usage is not None])
        launch_failed = attempt_state == JobState.FAILED and any(r.launch_failed for r in results)
        attempts[live.attempt] = replace(
            attempts[live.attempt], end_time=now, state=attempt_state, exit_code=exit_code, reason=reason,
            usage=usage, launch_failed=launch_failed,
        )
        if requeue and launch_failed:
            job, reason = self._back_off_launch(job, attempts, reason, now)
            if job.state.is_terminal:
                self._save([job])
                return
        if requeue:
            self._save([job.with_state(JobState.PENDING, attempts=tuple(attempts), reason=f"Requeued: {reason}")])
            return
        self._save(
            [job.with_state(outcome, attempts=tuple(attempts), end_time=now, exit_code=exit_code, reason=reason)]
        )

    @atomic
    def cancel(self, job_ids: Iterable[int], now: float, reason: str = "cancelled") -> tuple[list[int], list[Instruction]]:
        cancelled: list[int] = []
        instructions: list[Instruction] = []
        pending_done: list[Job] = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.state.is_terminal:
                continue
            cancelled.append(job_id)
            if job.state == JobState.PENDING:
                self._job_changing(job_id)
                self.held.discard(job_id)
                pending_done.append(job.with_state(JobState.CANCELLED, end_time=now, reason=reason))
                continue
            attempt = job.current_attempt
            assert attempt is not None
            live = self.live.get((job_id, attempt.attempt))
            if live is not None and live.outcome is None:
                instructions += self._stop(live, JobState.CANCELLED, reason, now)
        self._save(pending_done)
        return cancelled, instructions

    @atomic
    def release_allocation(self, job_id: int, exit_code: int, now: float) -> list[Instruction]:
        """galloc's command has ended: stop the allocation's placeholders (and any step in it), for the job
        to end COMPLETED, or FAILED for a non-zero code as salloc's job does, with the command's exit code.
        [] when the allocation is not running (still starting, or already being stopped)."""
        job = self.jobs.get(job_id)
        attempt = job.current_attempt if job is not None else None
        live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
        if job is None or job.state != JobState.RUNNING or live is None or live.stale or live.outcome is not None:
            return []
        self._live_changing(live)
        live.outcome = JobState.COMPLETED if exit_code == 0 else JobState.FAILED
        live.outcome_reason = "" if exit_code == 0 else f"the allocation's command exited with {exit_code}"
        # The exit code is stored with the decision, so a controller restarted meanwhile still knows it.
        self._save([job.with_state(JobState.COMPLETING, reason=live.outcome_reason, exit_code=exit_code)])
        self._save_stop(live)
        return [SignalAttempt(node, job_id, live.attempt, "terminate") for node in sorted(live.pending_nodes)]

    # ---------------------------------------------------------------------------------------------
    # Job control (gcontrol): the caller has checked permissions.

    @atomic
    def hold(self, job_ids: Iterable[int], by_admin: bool) -> list[int]:
        """Keep pending jobs from starting until released; returns the jobs held."""
        changed = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue
            admin = by_admin or job_id in self.admin_held
            self._save_hold(job_id, admin)
            self.held.add(job_id)
            if admin:
                self.admin_held.add(job_id)
            changed.append(job_id)
        return changed

    @atomic
    def release(self, job_ids: Iterable[int]) -> list[int]:
        changed = []
        for job_id in job_ids:
            if job_id not in self.held:
                continue
            self._save_hold(job_id, None)
            self.held.discard(job_id)
            self.admin_held.discard(job_id)
            changed.append(job_id)
        return changed

    def _save_hold(self, job_id: int, by_admin: bool | None) -> None:
        with self.atomically() as pending:
            self._job_changing(job_id)
            pending.holds[job_id] = by_admin

    @atomic
    def requeue(self, job_ids: Iterable[int], now: float) -> tuple[list[int], list[Instruction]]:
        """Stop running jobs and put them back in the queue (their attempt ends REQUEUED)."""
        requeued: list[int] = []
        instructions: list[Instruction] = []
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            attempt = job.current_attempt if job is not None else None
            live = self.live.get((job_id, attempt.attempt)) if attempt is not None else None
            if live is None or live.stale or live.outcome is not None:
                continue
            self._live_changing(live)
            live.requeue_as = JobState.REQUEUED
            instructions += self._stop(live, JobState.PENDING, "requeued by request", now)
            requeued.append(job_id)
        return requeued, instructions

    @atomic
    def update_job(self, job: Job) -> None:
        """Replace a job's time limit, priority or QoS (not its state), written through."""
        current = self.jobs.get(job.job_id)
        if current is None or current.state != job.state:
            raise ValueError(f"job {job.job_id} changed state meanwhile")
        self._save([job])

    def expire_time_limits(self, now: float) -> list[Instruction]:
        """Time limits, --signal warnings before them, and the ends of preemption grace periods.

        The signals need no write and are sent whatever the database does. The attempts that reached their
        time limit are stopped in one operation; if its write fails (the database is down) they are left as
        they were, and the next tick that can write catches them up: no time limit is skipped."""
        instructions: list[Instruction] = []
        due: list[LiveAttempt] = []
        for live in list(self.live.values()):
            if live.terminate_at is not None and now >= live.terminate_at:
                live.terminate_at = None
                instructions += [
                    SignalAttempt(n, live.job_id, live.attempt, "terminate") for n in sorted(live.pending_nodes)
                ]
            if live.stale or live.outcome is not None:
                continue
            job = self.jobs.get(live.job_id)
            if job is None or live.attempt >= len(job.attempts):
                log.error("live attempt %d.%d has no job attempt in memory", live.job_id, live.attempt)
                continue
            elapsed = now - job.attempts[live.attempt].start_time
            if elapsed >= job.time_limit_s:
                due.append(live)
            elif job.spec.signal is not None and not live.warned:
                warning = parse_signal_request(job.spec.signal)
                if elapsed >= job.time_limit_s - warning.seconds:
                    live.warned = True
                    instructions += [
                        SignalAttempt(n, live.job_id, live.attempt, "signal", warning.signum)
                        for n in sorted(live.pending_nodes)
                    ]
        if due:
            try:
                with self.atomically():
                    stops = [i for live in due for i in self._stop(live, JobState.TIMEOUT, "time limit reached", now)]
            except StoreUnavailable:
                log.debug("time limits: %d attempt(s) wait for the database", len(due))
            else:
                instructions += stops
        return instructions

    def purge_finished(self, now: float, retention_s: float) -> list[int]:
        """Forget (in memory) terminal jobs older than the retention; the store keeps them."""
        old: list[int] = []
        ended = self._ended
        while ended and now - ended[0][0] > retention_s:
            end_time, job_id = heapq.heappop(ended)
            job = self.jobs.get(job_id)
            if job is not None and job.state.is_terminal and job.end_time == end_time:
                del self.jobs[job_id]
                old.append(job_id)
        return old
