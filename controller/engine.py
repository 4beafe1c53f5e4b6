"""The controller's engine: runs scheduling cycles, timers and the agent links around ClusterState.

All state changes happen on the asyncio event loop thread, one at a time; a scheduling cycle computes its
plan off the loop on an immutable snapshot and the plan is re-checked when applied (ClusterState
.apply_plan, through the attempt ledger). The engine hands the instructions that state operations return
to the agents' sessions.

It speaks only the domain: commands and results are controller/commands.py's values, and an agent's session
(controller/rpc/services.py) turns what the engine sends it into messages. So the engine imports no
protobuf, no gRPC and no wire conversion.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from garrison.config import ControllerConfig
from garrison.controller import metrics
from garrison.controller.accounting_query import AccountingQuery
from garrison.controller.agent_backlog import AgentBacklog
from garrison.controller.allocations import Allocations
from garrison.controller.bulk import CHUNK_JOBS, BulkWriter, NewJobs, Pacer
from garrison.controller.clock import Clock
from garrison.controller.commands import (
    AgentEvent,
    AgentLink,
    AttemptFinished,
    AttemptStarted,
    CancelCommand,
    CancelResult,
    CheckpointMarked,
    JobFilter,
    LeaseGrant,
    NodeRow,
    PartitionRow,
    Registration,
    RunningUsageReported,
    StillAlive,
    SubmitCommand,
    Submitted,
    TestSubmitResult,
    Welcome,
)
from garrison.controller.cycles import CycleDue
from garrison.controller.dependency import format_dependency, parse_dependency, typed_dependencies
from garrison.controller.instructions import EndSession, ReleaseGang
from garrison.controller.policy import Policy
from garrison.controller.rendezvous import RendezvousPorts
from garrison.controller.sched.cycle import Plan, SchedulerConfig, schedule
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.signals import DEFAULT_WARNING_SIGNAL, parse_signal_request
from garrison.controller.snapshots import pending_view
from garrison.controller.state import (
    AckResult,
    ClusterState,
    Instruction,
    Launch,
    SignalAttempt,
)
from garrison.controller.step_commands import (
    StepInstruction,
    StepNodeFinished,
    StepOutputReceived,
    StepTasksExited,
)
from garrison.controller.steps import StepManager
from garrison.controller.store.errors import JobIdsTaken, StoreUnavailable
from garrison.controller.submitcaps import check_submit_cap
from garrison.controller.userjobs import UserJobs
from garrison.controller.validate import Resolved, ValidationError, validate_submission
from garrison.model.construct import replacer
from garrison.model.domain import Job, JobSpec, JobState, Principal
from garrison.model.jobrefs import MAX_ID, JobLookup, parse_job_ref
from garrison.model.launch import LaunchDescription
from garrison.model.partitions import in_partition

log = logging.getLogger("garrison.controller")
_T = TypeVar("_T")
# A job with its wait reason: the first cycle after a restart (or after a large array's submission) sets
# 50,000 of them, 0.33 s through dataclasses.replace, 0.09 s copied slot by slot.
_with_reason = replacer(Job, "reason")

Report = AttemptStarted | CheckpointMarked | AttemptFinished | RunningUsageReported  # what changes jobs


class PermissionDenied(Exception):
    """The principal may not do this (gRPC PERMISSION_DENIED)."""


class NotFound(Exception):
    """No such job (gRPC NOT_FOUND)."""


def _matches(job: Job, selection: JobFilter) -> bool:
    """squeue's and scancel's filters: each one given must hold (an empty one holds for every job)."""
    return (
        (not selection.users or job.user in selection.users)
        and (not selection.states or job.state in selection.states)
        and (not selection.names or job.spec.name in selection.names)
        and (not selection.partitions or any(in_partition(job.partition, name) for name in selection.partitions))
        and (not selection.accounts or job.account in selection.accounts)
    )


MAX_BEGIN_AHEAD_S = 366 * 86400  # gsub --begin
TEST_JOB_ID = MAX_ID + 1  # gsub --test-only's job: an id no real job can have
TEST_ONLY_MAX_RESERVATIONS = 500
STORE_RETRY_CYCLE_S = 1.0  # a plan the database would not take is planned again this soon
MAX_CYCLE_REST_S = 5.0  # the longest rest after a long scheduling cycle
# After a cycle that planned, the next one waits at least this long: the changes that arrive meanwhile (jobs
# submitted one by one, the ends of a burst of short jobs) are planned together, with one snapshot, one plan
# and one launch message per agent, instead of a cycle each. A lone change after a quiet spell is planned at
# once, so an idle cluster starts a job as soon as before. (e2e_throughput.py, 2,000 jobs submitted one by
# one: the controller's CPU per job 1.5-1.8 ms against 1.9-2.2 without; docs/performance.md.)
CYCLE_GATHER_S = 0.01
# A cycle plans on the event loop itself, not the planning thread, when it has at most this many pending jobs
# and the last plan took less than this much CPU (run_cycle).
INLINE_PLAN_MAX_PENDING = 64
INLINE_PLAN_MAX_CPU_S = 0.002
REASONS_PER_TURN = 2000  # pending jobs' reasons updated per turn of the event loop  # jobs a --test-only estimate plans ahead of the tested one, at most


class Engine:
    def __init__(
        self, config: ControllerConfig, state: ClusterState, clock: Clock, rendezvous: RendezvousPorts | None = None
    ) -> None:
        self.config = config
        # Without the controller's key (tests), a secret of this process's own.
        self.rendezvous = rendezvous or RendezvousPorts(os.urandom(32), config.rendezvous_ports)
        self._ports: dict[tuple[int, int], tuple[str, int]] = {}  # live attempt -> (head node, its port)
        state.max_launch_failures = config.max_launch_failures
        self.state = state
        self.clock = clock
        self.sessions: dict[str, AgentLink] = {}
        self.admin_uids = {0, os.getuid()}
        # Set whenever the state's generation moves (ClusterState.scheduling_inputs_changed): the scheduler
        # loop then asks CycleDue whether a cycle is due, and otherwise sleeps until the clock makes one due.
        self._wake = asyncio.Event()
        self.due = CycleDue(config.schedule_interval_s)
        state.generation_listeners.append(self._wake.set)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sched")
        # Plans given to the planning thread and not done yet (_on_planning_thread, between_plans()).
        self._plans_in_flight = 0
        self._no_plan_in_flight = asyncio.Event()
        self._no_plan_in_flight.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.cycle_count = 0
        self.last_cycle_ms = 0.0
        self._last_plan_cpu_s = math.inf  # the last plan's CPU time: the first plan is made on the thread
        # Accounts, QoS, partitions, usage and the core's configuration (the scheduling issue).
        self.policy = Policy(config, state, clock.now())
        # gacct's reads of the store's whole history, on a pool of their own.
        self.accounting_query = AccountingQuery(state.store)
        # galloc's allocations: their status, keep-alive leases and release (controller/allocations.py).
        self.allocations = Allocations(self)
        # Large arrays written and cancelled in chunks, and each user's jobs in the queue (issue 20).
        self.bulk = BulkWriter(state)
        self.user_jobs = UserJobs(state.jobs)
        state.job_observers.append(self.user_jobs.job_changed)
        # Agents' reports waiting for the database to take writes again (controller/agent_backlog.py).
        self.backlog = AgentBacklog(config.store_retry_s)
        # Agents' reports of this turn of the event loop, applied together at its end (flush_reports).
        self._turn_reports: list[tuple[AgentLink, Report, float]] = []
        # The store's job id counter as this controller last moved it; None: not known (``_job_ids``).
        self._next_job_id: int | None = None
        self._outage_logged_at = -math.inf

        # Job steps (gsrun): started in running jobs, their output routed to their clients.
        self.steps = StepManager(
            state.store, lambda: self.state.jobs, self._send_step, self._node_address, clock.now,
            config.kill_wait_s, self.is_admin, self._batch_rendezvous,
        )
        self.steps.recover()

    def _store_unavailable(self, what: str, error: StoreUnavailable) -> None:
        """Log an outage seen by a background step, at most every few seconds: the step is retried."""
        now = time.monotonic()
        if now - self._outage_logged_at >= 5.0:
            self._outage_logged_at = now
            log.warning("%s waits for the database: %s", what, error.cause or error)

    # ---------------------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._scheduler_loop(), name="scheduler"),
            asyncio.create_task(self._timer_loop(), name="timers"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for session in list(self.sessions.values()):
            session.close()
        self._pool.shutdown(wait=False)
        self.bulk.close()
        self.accounting_query.close()
        try:
            self.policy.save_usage(self.clock.now())
        except StoreUnavailable as error:  # usage since the last save is lost; jobs and attempts are not
            log.warning("usage not saved at shutdown, the database is unavailable: %s", error.cause)

    def request_schedule(self) -> None:
        """Something a cycle reads has changed (the state's own mutators say so themselves; this is for the
        callers that know better, and costs at most one cycle)."""
        self.state.scheduling_inputs_changed()

    def cycle_due(self) -> str | None:
        """Why a scheduling cycle is due now (controller/cycles.py), or None."""
        return self.due.why(self.state.generation, self.clock.now())

    async def _scheduler_loop(self) -> None:
        await self._make_first_views()
        while True:
            if self.cycle_due() is None:
                # Nothing a cycle reads has changed: sleep until something does, or the clock makes a cycle
                # due. (No await between the check and the clear: a change cannot slip in between.)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.due.seconds_to_wait(self.clock.now()))
                continue
            try:
                if await self.run_cycle():
                    # A cycle over 100,000 pending jobs takes seconds of CPU, which its thread shares with the
                    # event loop (one GIL): rest as long as it took, so that requests get at least half; and
                    # at least CYCLE_GATHER_S, so that changes arriving together are planned together.
                    await asyncio.sleep(max(CYCLE_GATHER_S, min(self.last_cycle_ms / 1000, MAX_CYCLE_REST_S)))
            except StoreUnavailable as error:  # nothing of the plan was kept; the next cycle plans again
                self._store_unavailable("scheduling cycle", error)
                # The plan was not applied and the state has not moved, so nothing else would make a cycle due
                # before the interval: plan again soon, as the interval of 1 s used to.
                self.due.retry_at(self.clock.now() + STORE_RETRY_CYCLE_S)
            except Exception:  # a bug in one cycle must not stop scheduling for good
                log.exception("scheduling cycle failed")
                await asyncio.sleep(1.0)  # nor spin on the same snapshot

    async def _make_first_views(self) -> None:
        """Before the first cycle, the views of every pending job it would otherwise make in one piece on the
        event loop, made a chunk at a time (controller/snapshots.py): a restarted controller with 50,000 jobs
        answers its first requests in between instead of after them."""
        pacer = Pacer()
        while self.state.snapshots.make_first_views(self.state, pacer.size):
            await pacer.pause(pacer.size)

    async def run_cycle(self) -> Plan | None:
        """One scheduling cycle: snapshot, plan (off the event loop), apply, wait reasons. None when nothing
        is pending (there is nothing to plan, which counts as planned)."""
        generation = self.state.generation
        now = self.clock.now()
        # The cycle's time and CPU (garrison_scheduling_cycle_*) count its snapshot too: held and dependent jobs
        # once made it the largest part of a cycle, unseen by the figure.
        started, snapshot_began = time.perf_counter(), time.thread_time()
        snapshot = self.policy.snapshot()
        snapshot_cpu_s = time.thread_time() - snapshot_began
        if not snapshot.pending:
            self.due.planned(generation, now, None)
            return None
        log.debug("scheduling cycle: %s", self.cycle_due())
        if len(snapshot.pending) <= INLINE_PLAN_MAX_PENDING and self._last_plan_cpu_s < INLINE_PLAN_MAX_CPU_S:
            # A small plan, as the last one was: computed here. Handing it to the planning thread and back (a
            # queue, a thread woken, the GIL passed twice, the loop woken through its self-pipe) cost more
            # than planning a few jobs, once or twice per job that runs (issue 23); the thread is for plans
            # long enough that requests must be answered meanwhile.
            plan, cpu_s = self._compute_plan_timed(snapshot, now, self.policy.scheduler)
        else:
            plan, cpu_s = await self._on_planning_thread(
                self._compute_plan_timed, snapshot, now, self.policy.scheduler
            )
        self._last_plan_cpu_s = cpu_s
        self.last_cycle_ms = (time.perf_counter() - started) * 1000
        applying = time.thread_time()
        self.cycle_count += 1
        self.due.planned(generation, now, plan.wake_at, plan.reprice_at)
        self.policy.remember(snapshot, plan, now)
        before = self.state.generation
        if self._apply_plan(plan) and len(plan.starts) < self.policy.scheduler.max_starts_per_cycle:
            self.due.applied(before, self.state.generation)
        cpu_s += time.thread_time() - applying + snapshot_cpu_s
        metrics.observe_scheduling_cycle(time.perf_counter() - started, cpu_s)
        await self._record_wait_reasons(plan.waiting)
        return plan

    async def between_plans(self) -> None:
        """Return once no plan is being computed on the planning thread. For work on the event loop that can
        wait a cycle and would otherwise take the GIL from the plan: a metrics scrape's pass over 50,000 jobs
        during a cycle doubled that cycle's time (scale.py --waiting dependency: 54-57 ms against 27-30 ms of
        CPU)."""
        await self._no_plan_in_flight.wait()

    async def _on_planning_thread(self, plan: Callable[..., _T], *args: object) -> _T:
        """``plan(*args)`` on the planning thread, counted as in flight until it is done (between_plans())."""
        self._plans_in_flight += 1
        self._no_plan_in_flight.clear()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, plan, *args)
        finally:
            self._plans_in_flight -= 1
            if not self._plans_in_flight:
                self._no_plan_in_flight.set()

    @staticmethod
    def _compute_plan(snapshot: Snapshot, now: float, config: SchedulerConfig) -> Plan:
        return schedule(snapshot, now, config)

    @staticmethod
    def _compute_plan_timed(snapshot: Snapshot, now: float, config: SchedulerConfig) -> tuple[Plan, float]:
        """The plan, and the CPU time its thread spent on it."""
        began = time.thread_time()
        plan = schedule(snapshot, now, config)
        return plan, time.thread_time() - began

    def _apply_plan(self, plan: Plan) -> bool:
        """Apply what still holds of the plan; True when all of it did and it asked for no preemption (the
        state is then what the plan counted on)."""
        now = self.clock.now()
        # The ledger accepts what still holds of the (possibly stale) plan; the rest is dropped, with why.
        result, instructions = self.state.apply_plan(plan, now)
        for rejection in result.rejected:
            kind = "preemption" if rejection.victim else "start"
            log.info("plan: job=%d node=%s %s rejected: %s", rejection.job_id, rejection.node or "-", kind,
                     rejection.reason.value)
            metrics.record_plan_rejection(kind, rejection.reason.name)
        for victim in result.preempting:
            try:
                instructions += self.preempt(victim.job_id, victim.grace_s, now)
            except StoreUnavailable as error:  # this victim is left running; a later cycle chooses again
                self._store_unavailable("preemption", error)
        self.execute(instructions)
        return not result.rejected and not plan.preempts

    async def _record_wait_reasons(self, waiting: Mapping[int, str]) -> None:
        """Each pending job's reason as gqueue shows it, from the last plan; in chunks, paced, since a cycle
        over 100,000 newly pending tasks changes them all (controller/bulk.py's Pacer)."""
        pacer = Pacer()
        # Only the reasons that differ from those recorded: a cycle over 50,000 jobs that still wait for what
        # they waited for changes nothing here (a dict comparison, in C, and no more; else one pass over them).
        # A job whose reason is recorded has had its Job's reason set with it, and a job that leaves the
        # queue loses its record (ClusterState).
        recorded = self.state.wait_reasons
        if waiting == recorded:
            return
        # A pass in a comprehension, not a set difference of the two item views: that hashes every (job,
        # reason) pair, ~5x the time at 50,000 pending jobs of which one is new.
        get = recorded.get
        changed = [(job_id, reason) for job_id, reason in waiting.items() if get(job_id) != reason]
        for count, (job_id, reason) in enumerate(changed, 1):
            job = self.state.jobs.get(job_id)
            if job is None or job.state != JobState.PENDING:
                continue  # cancelled, purged or started since the snapshot: no reason to keep for it
            self.state.wait_reasons[job_id] = reason
            # Only a changed reason makes a new Job: unchanged jobs keep their cached scheduling views.
            # A requeued job (pending with attempts behind it) keeps the reason it was requeued for.
            if job.reason != reason and not job.attempts:
                self.state.jobs[job_id] = _with_reason(job, reason)
            if count % REASONS_PER_TURN == 0:
                await pacer.pause(REASONS_PER_TURN)

    async def _timer_loop(self) -> None:
        interval = min(0.2, self.config.heartbeat_interval_s)
        while True:
            await asyncio.sleep(interval)
            try:
                self.tick(self.clock.now())
            except Exception:
                log.exception("timer tick failed")

    def tick(self, now: float) -> None:
        """The timer's work. Each step stands alone: one that cannot write while the database is down leaves
        its part as it was and catches up on the first tick after the database is back."""
        try:
            self.policy.charge_usage(now)
        except StoreUnavailable as error:
            self._store_unavailable("usage", error)
        for node in self.backlog.retry(now):
            session = self.sessions.get(node)
            if session is not None:
                session.close()  # the agent reconnects and reports what is not acknowledged again
        self.state.flush_nodes()
        instructions = self.state.expire_time_limits(now)
        instructions += self.state.expire_heartbeats(now)
        try:
            instructions += self.allocations.expire_leases(now)
        except StoreUnavailable as error:  # lapsed allocations are cancelled on the first tick that can write
            self._store_unavailable("allocation leases", error)
        self.state.purge_finished(now, self.config.finished_job_retention_s)
        try:
            self.steps.check_jobs()
        except StoreUnavailable as error:  # the steps of ended jobs are ended on a later tick
            self._store_unavailable("job steps", error)
        if instructions:
            self.execute(instructions)
            self.request_schedule()

    # ---------------------------------------------------------------------------------------------
    # Instructions -> agent messages

    def execute(self, instructions: Iterable[Instruction]) -> None:
        for ins in instructions:
            session = self.sessions.get(ins.node)
            if session is None:
                continue  # the node is not connected; reconciliation on its return covers this
            if isinstance(ins, Launch):
                session.send(self.launch_description(ins))
                log.info("launch job=%d attempt=%d node=%s", ins.job.job_id, ins.attempt, ins.node)
            elif isinstance(ins, SignalAttempt):
                session.send(ins)
                log.info("%s job=%d attempt=%d node=%s", ins.action, ins.job_id, ins.attempt, ins.node)
            elif isinstance(ins, AckResult | ReleaseGang):
                session.send(ins)
            elif isinstance(ins, EndSession):
                log.warning("node %s: closing its stream (%s)", ins.node, ins.reason)
                # Forgotten at once: what the old stream still carries renews nothing; the agent registers anew.
                del self.sessions[ins.node]
                session.close()

    def _send_step(self, node: str, instruction: StepInstruction) -> bool:
        session = self.sessions.get(node)
        if session is None:
            return False
        session.send(instruction)
        return True

    def _node_address(self, node: str) -> str:
        session = self.sessions.get(node)
        return session.address if session is not None else node

    def launch_description(self, ins: Launch) -> LaunchDescription:
        """What ``ins.node`` is told to start: the attempt as that node of its gang sees it, with the head
        node's address (as its agent gave it, or its name when it is not connected) for the rendezvous."""
        job = ins.job
        attempt = job.attempts[ins.attempt]
        names = attempt.allocation.node_names
        spec = job.spec
        warning = parse_signal_request(spec.signal) if spec.signal else None
        return LaunchDescription(
            job_id=job.job_id,
            attempt=ins.attempt,
            user=job.user,
            uid=job.uid,
            gid=job.gid,
            spec=job.spec,
            allocation=attempt.allocation,
            node_rank=names.index(ins.node),
            master_addr=self._node_address(names[0]),
            master_port=self._master_port(job.job_id, ins.attempt, names[0]),
            restart_count=job.restart_count,
            kill_wait_s=self.config.kill_wait_s,
            time_limit_s=job.time_limit_s,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            account=job.account,
            partition=job.partition,
            qos=spec.qos or "",
            cluster_name=self.config.cluster_name,
            array_task_count=spec.array_task_count,
            array_task_min=spec.array_task_min,
            array_task_max=spec.array_task_max,
            array_task_step=spec.array_task_step,
            batch_signal=warning.signum if warning is not None and warning.batch_only else 0,
            start_time=attempt.start_time,
            start_barrier=len(names) > 1,
        )

    def _batch_rendezvous(self, job: Job) -> tuple[str, int] | None:
        """The MASTER_ADDR and MASTER_PORT the running attempt's batch environment was given (launch_description),
        or None where this controller has not chosen its port (it restarted since)."""
        if not job.attempts:
            return None
        attempt = len(job.attempts) - 1
        known = self._ports.get((job.job_id, attempt))
        if known is None:
            return None
        return self._node_address(known[0]), known[1]

    def _master_port(self, job_id: int, attempt: int, head: str) -> int:
        """The attempt's rendezvous port (controller/rendezvous.py), the same for every node of its gang
        and every resend, and none that another live attempt on the same head node has."""
        key = (job_id, attempt)
        known = self._ports.get(key)
        if known is not None:
            return known[1]
        for ended in [k for k in self._ports if k not in self.state.live]:
            del self._ports[ended]
        taken = {port for node, port in self._ports.values() if node == head}
        port = self.rendezvous.port_for(job_id, attempt, taken)
        self._ports[key] = (head, port)
        return port

    def preempt(self, job_id: int, grace_s: float, now: float) -> list[Instruction]:
        """Start preempting a running job: its --signal (default SIGUSR1) now, SIGTERM after ``grace_s``, the
        grace the scheduling core decided (sched/preemption.py preemption_grace: the QoS's, which the job's
        --signal lead time may shorten, or lengthen up to the admin's maximum), requeued when its ranks end."""
        job = self.state.jobs.get(job_id)
        if job is None:
            return []
        warning = parse_signal_request(job.spec.signal) if job.spec.signal else None
        signum = warning.signum if warning else DEFAULT_WARNING_SIGNAL
        grace = float(grace_s)
        instructions = self.state.preempt(job_id, grace, int(signum), now)
        if instructions:
            log.info("job=%d node=%s preempting: signal %d, grace %.0fs", job_id,
                     ",".join(sorted({i.node for i in instructions})), signum, grace)
            metrics.record_preemption()
        return instructions

    # ---------------------------------------------------------------------------------------------
    # Client operations

    def _checked_submission(self, principal: Principal, command: SubmitCommand) -> tuple[Resolved, list[int]]:
        """Everything a submission is checked for, before anything is stored (submit and test_submit)."""
        spec = command.spec
        indices = list(command.array_indices)
        resolved = validate_submission(
            spec, principal, self.config, self.state.nodes, indices, self.policy.accounting
        )
        if spec.nice < 0 and not self.is_admin(principal):
            raise PermissionDenied("only admins may give a negative --nice (it raises the job's priority)")
        if resolved.spec.dependency is not None:
            resolved = replace(resolved, spec=replace(resolved.spec, dependency=self.known_dependency(resolved.spec.dependency)))
        begin = resolved.spec.begin_time
        if begin is not None and not (math.isfinite(begin) and begin <= self.clock.now() + MAX_BEGIN_AHEAD_S):
            raise ValidationError("--begin: at most a year ahead")
        return resolved, indices

    def submit(self, principal: Principal, command: SubmitCommand) -> Submitted:
        """A submission written in one transaction: for a small one (controller/bulk.py's CHUNK_JOBS or
        fewer jobs), or where no event loop runs; the RPC layer calls ``submit_async``."""
        for _ in range(2):  # a second time only if another writer took the ids (JobIdsTaken)
            new, held = self._new_jobs(principal, command)
            with self._ids_taken_again(), self.state.atomically() as pending:  # ids, jobs and hold in one
                pending.job_ids = new.job_ids
                jobs = new.build()
                self.state.add_jobs(jobs)
                if held:
                    self.state.hold([job.job_id for job in jobs], by_admin=False)
            if self._next_job_id is not None:
                return self._submitted(principal, new, held)
        raise AssertionError("job ids reserved with allocate_job_ids were taken")

    async def submit_async(self, principal: Principal, command: SubmitCommand) -> Submitted:
        """A submission; a large array's tasks are written in chunks, so others' requests are answered
        meanwhile (controller/bulk.py)."""
        for _ in range(2):  # a second time only if another writer took the ids (JobIdsTaken)
            new, held = self._new_jobs(principal, command)
            with self._ids_taken_again():
                await self.bulk.add_jobs(new, hold=held)
            if self._next_job_id is not None:
                return self._submitted(principal, new, held)
        raise AssertionError("job ids reserved with allocate_job_ids were taken")

    @contextlib.contextmanager
    def _ids_taken_again(self) -> Iterator[None]:
        """Around storing a submission: if it fails, the store's job id counter is in doubt (a commit whose
        outcome is unknown may have moved it), so the next submission reserves its ids from the store again
        (``_job_ids``). JobIdsTaken (another writer moved the counter) is swallowed: ``_next_job_id`` is
        None after it, and the caller submits again."""
        try:
            yield
        except JobIdsTaken:
            log.warning("job ids were taken by another writer of the store; reserving them again")
            self._next_job_id = None
        except BaseException:
            self._next_job_id = None
            raise

    def _job_ids(self, count: int) -> tuple[int, bool]:
        """The first of ``count`` consecutive ids for a submission, and whether its own transaction takes them
        from the store's counter (the controller knows the counter's value: one transaction fewer per
        submission). A large array, stored in several transactions, and the first submission after a start
        or a failed write reserve them in a transaction of their own first (ids lost to a failed submission
        are then never reused)."""
        if count <= CHUNK_JOBS and self._next_job_id is not None:
            first = self._next_job_id
            self._next_job_id = first + count
            return first, True
        first = self.state.store.allocate_job_ids(count)
        self._next_job_id = first + count
        return first, False

    def _new_jobs(self, principal: Principal, command: SubmitCommand) -> tuple[NewJobs, bool]:
        """The checked submission's jobs (one, or an array's tasks with consecutive ids), not stored yet."""
        resolved, indices = self._checked_submission(principal, command)
        check_submit_cap(self.user_jobs, principal.user, len(indices) or 1, self.config.max_submit_jobs)
        now = self.clock.now()
        count = len(indices) or 1
        first, take_ids = self._job_ids(count)
        common = dict(
            spec=resolved.spec,
            user=principal.user,
            uid=principal.uid,
            gid=principal.gid,
            account=resolved.account,
            partition=resolved.partition,
            time_limit_s=resolved.time_limit_s,
            submit_time=now,
        )
        if indices:
            common["spec"] = with_array_summary(resolved.spec, indices)

            def task(i: int) -> Job:
                return Job(job_id=first + i, array_job_id=first, array_task_id=indices[i], **common)  # type: ignore[arg-type]

            return NewJobs(first, count, task, take_ids), command.hold
        return NewJobs(first, 1, lambda _: Job(job_id=first, **common), take_ids), command.hold  # type: ignore[arg-type]

    def _submitted(self, principal: Principal, new: NewJobs, held: bool) -> Submitted:
        """What follows a submission once its jobs are stored (and held) and in memory."""
        log.info("submitted job=%d node=- tasks=%d user=%s%s", new.first, new.count, principal.user,
                 " held" if held else "")
        self.request_schedule()
        return Submitted(job_id=new.first, task_count=new.count)

    async def test_submit(self, principal: Principal, command: SubmitCommand) -> TestSubmitResult:
        """sbatch --test-only: check the job as a submission is checked, then run the scheduling core on the
        cluster as it is now with the job added, and say when and where it would start. Nothing is stored
        and nothing starts: the core is pure, and its plan is only read. (An array is estimated as its
        first task.)"""
        resolved, _ = self._checked_submission(principal, command)
        now = self.clock.now()
        job = Job(job_id=TEST_JOB_ID, spec=resolved.spec, user=principal.user, uid=principal.uid, gid=principal.gid,
                  account=resolved.account, partition=resolved.partition, time_limit_s=resolved.time_limit_s,
                  submit_time=now)
        view = pending_view(job)
        snapshot = self.policy.snapshot()
        if resolved.spec.dependency is not None:
            # Typed against the jobs as they are now, as the snapshot types a pending job's: the core then says
            # whether it waits (on a job still to end, or on a running singleton of the same name), or would
            # start as any other job (its dependencies met already, a singleton with no other of its name).
            lookup = JobLookup(self.state.jobs)
            first_task = command.array_indices[0] if command.array_indices else None  # estimated as its first task
            typed = typed_dependencies(parse_dependency(resolved.spec.dependency),
                                       lambda ref: lookup.find(*parse_job_ref(ref)), (principal.user, resolved.spec.name),
                                       first_task)
            view = replace(view, dependencies=typed)
            if typed.singleton:
                snapshot = replace(snapshot, running_names=frozenset(
                    (j.user, j.spec.name) for j in self.state.jobs.values() if j.state.holds_resources))
        snapshot = replace(snapshot, pending=(*snapshot.pending, view))
        # Plan a reservation for every job up to this one (for as many as a test may cost), so the estimate
        # does not depend on how deep in the queue it lands.
        depth = min(len(snapshot.pending), TEST_ONLY_MAX_RESERVATIONS)
        config = self.policy.scheduler
        config = replace(config, reservations=max(config.reservations, depth),
                         max_job_test=max(config.max_job_test, depth))
        plan = await self._on_planning_thread(self._compute_plan, snapshot, now, config)
        reason = ""
        allocation = next((s.allocation for s in plan.starts if s.job_id == TEST_JOB_ID), None)
        if allocation is None:
            allocation = next((r.allocation for r in plan.reservations if r.job_id == TEST_JOB_ID), None)
            reason = plan.waiting.get(TEST_JOB_ID, "")
        start = plan.estimated_starts.get(TEST_JOB_ID)
        return TestSubmitResult(
            partition=resolved.partition,
            reason=reason,
            estimated_start=max(start, now) if start is not None else None,
            nodes=tuple(node.node for node in allocation.nodes) if allocation is not None else (),
        )

    def known_dependency(self, text: str) -> str:
        """The dependency list, written the one way, once every job it names is known here (as sbatch
        refuses a dependency on a job that does not exist)."""
        dependencies = parse_dependency(text)  # validate_submission has checked the syntax
        try:
            self._resolve_refs(dependencies.job_refs())
        except NotFound as exc:
            raise ValidationError(f"--dependency: {exc}") from None
        return format_dependency(dependencies)

    def _resolve_refs(self, refs: Sequence[str]) -> list[Job]:
        jobs = [job for found in self._resolve_each(refs) for job in found]
        return list({job.job_id: job for job in jobs}.values())  # a job named twice (5 and 5_2) counts once

    def _resolve_each(self, refs: Sequence[str]) -> list[list[Job]]:
        """The jobs each reference stands for, in order. NotFound for one that stands for none."""
        lookup = JobLookup(self.state.jobs)  # one pass over the jobs however many references there are
        resolved: list[list[Job]] = []
        for text in refs:
            try:
                found = lookup.find(*parse_job_ref(text))
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
            if not found:
                raise NotFound(f"no such job {text}")
            resolved.append(found)
        return resolved

    def is_admin(self, principal: Principal) -> bool:
        """Whether ``principal`` may run admin operations (gadmin) and manage every job: root, the
        controller's own user, and the configured admins and admin groups."""
        return principal.uid in self.admin_uids or self.policy.is_admin(principal)

    def may_manage(self, principal: Principal, job: Job) -> bool:
        return (
            principal.uid == job.uid or self.is_admin(principal) or self.policy.coordinates(principal, job.account)
        )

    def cancel(self, principal: Principal, command: CancelCommand) -> CancelResult:
        """gcancel: cancel the selected jobs, or with ``signal`` send it to the ranks of those running."""
        signum = command.signal
        jobs = self._jobs_to_control(principal, command.jobs, "signal" if signum is not None else "cancel")
        if signum is not None:
            return self._signal_jobs(principal, jobs, signum, list(command.jobs.job_refs))
        cancelled, instructions = self.state.cancel([j.job_id for j in jobs], self.clock.now())
        self.execute(instructions)
        if cancelled:
            log.info("%s cancelled %d job(s)", principal.user, len(cancelled))
            self.request_schedule()
        return CancelResult(cancelled=tuple(cancelled))

    async def cancel_async(self, principal: Principal, command: CancelCommand) -> CancelResult:
        """gcancel, with the pending ones of many jobs (a large array) cancelled in chunks so that others'
        requests are answered meanwhile (controller/bulk.py)."""
        if command.signal is not None:
            return self.cancel(principal, command)
        jobs = self._jobs_to_control(principal, command.jobs, "cancel")
        now = self.clock.now()
        pending = [job.job_id for job in jobs if job.state == JobState.PENDING]
        cancelled = await self.bulk.cancel(pending, now) if len(pending) > CHUNK_JOBS else []
        # The rest (running jobs, and any that a cycle started meanwhile) the ordinary way.
        done = set(cancelled)
        others, instructions = self.state.cancel([j.job_id for j in jobs if j.job_id not in done], self.clock.now())
        self.execute(instructions)
        cancelled += others
        if cancelled:
            log.info("%s cancelled %d job(s)", principal.user, len(cancelled))
            self.request_schedule()
        return CancelResult(cancelled=tuple(cancelled))

    def _jobs_to_control(self, principal: Principal, selection: JobFilter, verb: str) -> list[Job]:
        if selection.job_refs:
            jobs = self._resolve_refs(selection.job_refs)
        elif selection.has_filters:
            jobs = list(self.state.jobs.values())
        else:
            raise ValidationError(f"nothing to {verb}: give job ids, a user, states, names, partitions or accounts")
        jobs = [j for j in jobs if _matches(j, selection)]
        if not selection.job_refs:
            # Filters alone select only the caller's jobs unless an admin asks.
            jobs = [j for j in jobs if self.may_manage(principal, j)]
        for job in jobs:
            if not self.may_manage(principal, job):
                raise PermissionDenied(f"job {job.display_id} belongs to {job.user}; only its owner may {verb} it")
        return jobs

    def _signal_jobs(self, principal: Principal, jobs: list[Job], signum: int, refs: list[str]) -> CancelResult:
        """Signal the running ones of ``jobs``; report each of ``refs`` (the ids the user named) of which none
        was running: an array with some tasks running counts as signalled."""
        signalled: list[int] = []
        for job in jobs:
            instructions = self.state.signal_running(job.job_id, signum)
            if instructions:
                self.execute(instructions)
                signalled.append(job.job_id)
        signalled_ids = set(signalled)
        selected = {job.job_id for job in jobs}
        not_running = [
            ref
            for ref, found in zip(refs, self._resolve_each(refs), strict=True)
            if not any(job.job_id in signalled_ids for job in found if job.job_id in selected)
        ]
        if signalled:
            log.info("%s sent signal %d to %d job(s)", principal.user, signum, len(signalled))
        return CancelResult(signalled=tuple(signalled), not_running=tuple(not_running))

    def list_jobs(self, selection: JobFilter) -> list[Job]:
        jobs: Iterable[Job]
        if selection.job_refs:
            jobs = self._resolve_refs(selection.job_refs)
        elif selection.users:
            jobs = self.user_jobs.of(selection.users)  # gqueue --me: the user's jobs, not the whole queue
        else:
            jobs = self.state.jobs.values()
        selected = [j for j in jobs if _matches(j, selection)]
        return sorted(selected, key=lambda j: j.job_id)

    def get_job(self, ref: str) -> Job:
        jobs = self._resolve_refs([ref])
        if len(jobs) != 1:
            try:
                job_id, _ = parse_job_ref(ref)
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
            direct = self.state.jobs.get(job_id)
            if direct is None:
                raise NotFound(f"no such job {ref}")
            return direct
        return jobs[0]

    def job_for_viewer(self, principal: Principal, ref: str) -> Job:
        """``get_job`` as ``principal`` may see it: a job's script and environment (which hold paths, tokens
        and keys as often as not) go to its owner and to admins only, as scontrol show job keeps them."""
        job = self.get_job(ref)
        if principal.uid == job.uid or self.is_admin(principal):
            return job
        return replace(job, spec=replace(job.spec, script=None, env={}))

    # ---------------------------------------------------------------------------------------------
    # Agent link

    def node_partitions(self, name: str) -> frozenset[str]:
        return self.policy.node_partitions(name)

    def agent_connected(self, session: AgentLink, registration: Registration) -> None:
        self.flush_reports()  # what the old stream reported comes before what the registration reconciles
        old = self.sessions.get(session.node)
        if old is not None and old is not session:
            old.close()
        # Reports queued from an earlier stream are reported again by this registration.
        self.backlog.drop(session.node)
        self.sessions[session.node] = session
        session.send(Welcome(heartbeat_interval_s=self.config.heartbeat_interval_s))
        # The lease before any launch or signal: a supervisor started on a node with no live lease would not
        # start its ranks.
        self._grant_lease(session, registration.lease_request)
        self.steps.node_connected(session.node)  # step launches the old stream may have lost
        now = self.clock.now()
        # The node is attached in memory whatever the database does; what it runs and what ended while it was
        # away is reconciled as a report of its own, retried while the database is down.
        self.state.attach_node(session.node, registration.inventory, self.node_partitions(session.node), now)
        log.info(
            "node %s registered: %d GPUs, %d running, %d finished results",
            session.node,
            len(registration.inventory.gpus),
            len(registration.running),
            len(registration.finished),
        )

        def reconcile() -> None:
            instructions = self.state.reconcile_node(
                session.node,
                [(r.job_id, r.attempt) for r in registration.running],
                list(registration.finished),
                now,
            )
            # Checkpoint marks of the running attempts, before any cycle could choose a preemption victim.
            for ref in registration.running:
                self._checkpointed(ref.job_id, ref.attempt, ref.checkpoint_time, now)
            self.execute(instructions)
            self.request_schedule()

        self.backlog.deliver(session.node, reconcile, now)

    def _grant_lease(self, session: AgentLink, request: int) -> None:
        """Answer a lease request of the node's current stream (fencing: garrison/model/lease.py). A node
        declared silent has had its stream closed, so only a new registration renews its lease."""
        if request:
            session.send(LeaseGrant(request=request, duration_s=self.config.node_lease_s))

    def _checkpointed(self, job_id: int, attempt: int, when: float, now: float) -> None:
        """An agent's report of a checkpoint mark: a time that is not a positive finite number is ignored,
        one in the future (a node clock ahead of ours) counts as now."""
        if math.isfinite(when) and when > 0:
            self.state.checkpointed(job_id, attempt, min(when, now))

    def agent_message(self, session: AgentLink, event: AgentEvent, grouped: bool = False) -> None:
        """One message of an agent's stream. With ``grouped`` (the agents' streams, controller/rpc), a report
        that changes jobs is applied at the end of the event loop's turn, in one transaction with the other
        reports of that turn (``flush_reports``); without, at once in a transaction of its own."""
        if self.sessions.get(session.node) is not session:
            return  # a stream that has been replaced by a newer connection
        now = self.clock.now()
        # Every message, whatever it says, shows the node is alive.
        if self.state.heartbeat(session.node, now):
            # Declared lost while its stream stayed open: end the stream; the agent reconnects at once and
            # its registration brings the node back and kills what the cluster has moved on from.
            log.warning("node %s is alive again on its open stream: asking it to register again", session.node)
            session.close()
            return
        if isinstance(event, AttemptStarted | CheckpointMarked | AttemptFinished | RunningUsageReported):
            if grouped and not self.backlog.waiting(session.node) and self._group_report(session, event, now):
                return
            # In order behind the node's reports still waiting for the database, if any.
            self.backlog.deliver(session.node, lambda: self._apply_report(session.node, event, now), now)
        elif isinstance(event, StillAlive):
            self._grant_lease(session, event.lease_request)
            if event.node_fault is not None:  # a heartbeat: it says whether the node has a fault
                try:
                    self.state.node_fault(session.node, event.node_fault)
                except StoreUnavailable as error:  # the next heartbeat says it again
                    self._store_unavailable("node fault", error)
        elif isinstance(event, StepOutputReceived | StepTasksExited | StepNodeFinished):
            self.steps.agent_event(session.node, event)

    def _group_report(self, session: AgentLink, event: Report, now: float) -> bool:
        """Keep a report for this turn's group commit (``flush_reports``); False where no event loop runs (a
        caller outside the daemon), and the report is applied at once instead."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if not self._turn_reports:
            loop.call_soon(self.flush_reports)
        self._turn_reports.append((session, event, now))
        return True

    def flush_reports(self) -> None:
        """Apply the reports kept during the last turn of the event loop in one store transaction (group
        commit): a started and a finished job cost one commit for all of them, not one each, as the agents'
        reports are the bulk of the controller's writes. Each agent's reports stay in the order it sent
        them, and a result is still acknowledged only once durable: the acknowledgements are sent after the
        commit. If the transaction fails (the database is down, or one report raised), memory is as it was
        before the group (controller/transaction.py), and each report is applied again on its own as before:
        one the store refuses waits in the backlog, in order, and one that fails fails alone."""
        reports, self._turn_reports = self._turn_reports, []
        if len(reports) > 1:
            try:
                with self.state.atomically():
                    effects = [self._report_effects(session.node, event, now) for session, event, now in reports]
            except Exception:  # noqa: BLE001 - nothing of the group was kept: each report alone, below
                log.debug("a group of %d reports was refused; applying them one by one", len(reports))
            else:
                metrics.record_report_group(len(reports))
                self._after_reports([ins for instructions, _ in effects for ins in instructions],
                                    any(ended for _, ended in effects))
                return
        for session, event, now in reports:
            if self.sessions.get(session.node) is not session:
                continue  # its stream ended meanwhile: the agent reports it again when it registers
            try:
                self.backlog.deliver(session.node, functools.partial(self._apply_report, session.node, event, now), now)
            except Exception:
                # What the stream's reader did with a report that raised before reports were grouped.
                log.exception("agent stream from %s failed", session.node)
                session.close()

    def _apply_report(self, node: str, event: Report, now: float) -> None:
        """An agent's report, applied all or nothing (StoreUnavailable: nothing changed, nothing sent)."""
        with self.state.atomically():
            instructions, ended = self._report_effects(node, event, now)
        self._after_reports(instructions, ended)

    def _report_effects(self, node: str, event: Report, now: float) -> tuple[list[Instruction], bool]:
        """A report's change to memory, inside the caller's transaction: the instructions to send once it has
        committed, and whether an attempt ended on the node (so a cycle may start something)."""
        if isinstance(event, AttemptStarted):
            return self.state.node_started(node, event.job_id, event.attempt), False
        if isinstance(event, CheckpointMarked):
            self._checkpointed(event.job_id, event.attempt, event.time, now)
            return [], False
        if isinstance(event, RunningUsageReported):
            self.state.running_usage(node, event.job_id, event.attempt, event.usage)
            return [], False
        return self.state.node_finished(node, event.result, now), True

    def _after_reports(self, instructions: list[Instruction], ended: bool) -> None:
        """What follows reports once they are durable: acknowledgements and releases sent, and a cycle."""
        self.execute(instructions)
        if ended:
            self.request_schedule()
            try:
                self.steps.check_jobs()
            except StoreUnavailable as error:  # the steps of ended jobs are ended on a later tick
                self._store_unavailable("job steps", error)

    def with_running_usage(self, job: Job) -> Job:
        """The job as gjob shows it: its running attempt with what its nodes have reported it used so far
        (kept in memory only; the stored figures are those reported at the attempt's end)."""
        attempt = job.current_attempt
        if attempt is None or attempt.usage is not None:
            return job
        usage = self.state.running_usage_of(job.job_id, attempt.attempt)
        if usage is None:
            return job
        attempts = (*job.attempts[:-1], replace(attempt, usage=usage))
        return replace(job, attempts=attempts)

    def agent_disconnected(self, session: AgentLink) -> None:
        self.flush_reports()  # the stream's last reports are applied (and acknowledged) as if read earlier
        if self.sessions.get(session.node) is session:
            del self.sessions[session.node]
            self.backlog.drop(session.node)  # the agent reports them again when it reconnects
            self.state.disconnect(session.node)
            log.warning("node %s disconnected", session.node)

    def nodes_view(self) -> list[NodeRow]:
        cpus, memory = self.state.held_cpus_and_memory()
        return [
            NodeRow(
                node=node,
                allocated_gpus=tuple(self.state.gpu_owner.get(node.name, {})),
                connected=node.name in self.state.connected,
                allocated_cpus=len(cpus.get(node.name, ())),
                allocated_memory_mb=memory.get(node.name, 0),
                partitions=tuple(sorted(self.node_partitions(node.name))),
            )
            for node in sorted(self.state.nodes.values(), key=lambda n: n.name)
        ]

    def partitions_view(self) -> list[PartitionRow]:
        return [
            PartitionRow(name=p.name, default=p.default, default_time_s=p.default_time_s, max_time_s=p.max_time_s)
            for p in self.policy.accounting.partitions
        ]


def with_array_summary(spec: JobSpec, indices: Sequence[int]) -> JobSpec:
    """The spec of an array's tasks, with the index set as Slurm's SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP give
    it: the step of an evenly spaced set (1-7:2 gives 2), else 1."""
    ordered = sorted(indices)
    gaps = {b - a for a, b in zip(ordered, ordered[1:], strict=False)}
    return replace(spec, array_task_count=len(ordered), array_task_min=ordered[0], array_task_max=ordered[-1],
                   array_task_step=gaps.pop() if len(gaps) == 1 else 1)
