"""The controller's engine: runs scheduling cycles, timers and the agent links around ClusterState.

All state changes happen on the asyncio event loop thread, one at a time; a scheduling cycle computes its
plan off the loop on an immutable snapshot and the plan is re-checked when applied (ClusterState
.apply_plan, through the attempt ledger). The engine turns the instructions that state operations return into messages on the
agents' streams.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from garrison.config import ControllerConfig
from garrison.controller import metrics
from garrison.controller.clock import Clock
from garrison.controller.dependency import format_dependency, parse_dependency
from garrison.controller.policy import Policy
from garrison.controller.sched.cycle import Plan, SchedulerConfig, schedule
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.signals import DEFAULT_WARNING_SIGNAL, parse_signal_name, parse_signal_request
from garrison.controller.snapshots import pending_view
from garrison.controller.state import (
    AckResult,
    ClusterState,
    Instruction,
    Launch,
    NodeResult,
    SignalAttempt,
)
from garrison.controller.validate import Resolved, ValidationError, validate_submission
from garrison.model.domain import Job, JobState, Principal
from garrison.model.jobrefs import MAX_ID, JobLookup, parse_job_ref
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire import convert

log = logging.getLogger("garrison.controller")


class PermissionDenied(Exception):
    """The principal may not do this (gRPC PERMISSION_DENIED)."""


class NotFound(Exception):
    """No such job (gRPC NOT_FOUND)."""


@dataclass(eq=False)
class AgentSession:
    node: str
    address: str
    queue: asyncio.Queue[pb.ControllerMessage | None] = field(default_factory=asyncio.Queue)
    refusal: str = ""  # why the agent's stream was cut (an undecodable message), told to it at the end

    def send(self, message: pb.ControllerMessage) -> None:
        self.queue.put_nowait(message)

    def close(self) -> None:
        self.queue.put_nowait(None)


def master_port(job_id: int, attempt: int) -> int:
    """A per-attempt rendezvous port, spread over 20000-39999 so concurrent jobs rarely collide."""
    return 20000 + (job_id * 7919 + attempt * 104729) % 20000


def _matches(
    job: Job,
    users: set[str],
    states: set[str],
    names: Sequence[str],
    partitions: Sequence[str],
    accounts: Sequence[str],
) -> bool:
    """squeue's and scancel's filters: each one given must hold (an empty one holds for every job)."""
    return (
        (not users or job.user in users)
        and (not states or job.state.value in states)
        and (not names or job.spec.name in names)
        and (not partitions or job.partition in partitions)
        and (not accounts or job.account in accounts)
    )


MAX_BEGIN_AHEAD_S = 366 * 86400  # gsub --begin
TEST_JOB_ID = MAX_ID + 1  # gsub --test-only's job: an id no real job can have
TEST_ONLY_MAX_RESERVATIONS = 500  # jobs a --test-only estimate plans ahead of the tested one, at most


class Engine:
    def __init__(self, config: ControllerConfig, state: ClusterState, clock: Clock) -> None:
        self.config = config
        self.state = state
        self.clock = clock
        self.sessions: dict[str, AgentSession] = {}
        self.admin_uids = {0, os.getuid()}
        self._wake = asyncio.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sched")
        self._tasks: list[asyncio.Task[None]] = []
        self.cycle_count = 0
        self.last_cycle_ms = 0.0
        # Accounts, QoS, partitions, usage and the core's configuration (the scheduling issue).
        self.policy = Policy(config, state, clock.now())

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
        self.policy.save_usage(self.clock.now())

    def request_schedule(self) -> None:
        self._wake.set()

    async def _scheduler_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.config.schedule_interval_s)
            self._wake.clear()
            try:
                snapshot = self.policy.snapshot()
                if not snapshot.pending:
                    continue
                started = time.perf_counter()
                now = self.clock.now()
                plan = await loop.run_in_executor(
                    self._pool, self._compute_plan, snapshot, now, self.policy.scheduler
                )
                self.last_cycle_ms = (time.perf_counter() - started) * 1000
                self.cycle_count += 1
                self.policy.remember(snapshot, plan, now)
                self._apply_plan(plan)
                metrics.observe_scheduling_cycle(time.perf_counter() - started)
            except Exception:  # a bug in one cycle must not stop scheduling for good
                log.exception("scheduling cycle failed")

    @staticmethod
    def _compute_plan(snapshot: Snapshot, now: float, config: SchedulerConfig) -> Plan:
        return schedule(snapshot, now, config)

    def _apply_plan(self, plan: Plan) -> None:
        now = self.clock.now()
        # The ledger accepts what still holds of the (possibly stale) plan; the rest is dropped, with why.
        result, instructions = self.state.apply_plan(plan, now)
        for rejection in result.rejected:
            log.debug("plan: job=%d %s dropped: %s", rejection.job_id,
                      "preemption" if rejection.victim else "start", rejection.reason.value)
        for victim in result.preempting:
            instructions += self.preempt(victim.job_id, victim.grace_s, now)
        self.state.wait_reasons.update(plan.waiting)
        for job_id, reason in plan.waiting.items():
            job = self.state.jobs.get(job_id)
            # Only a changed reason makes a new Job: unchanged jobs keep their cached scheduling views.
            if (job is not None and job.state == JobState.PENDING and job.reason != reason
                    and not job.reason.startswith("Requeued")):
                self.state.jobs[job_id] = replace(job, reason=reason)
        self.execute(instructions)

    async def _timer_loop(self) -> None:
        interval = min(0.2, self.config.heartbeat_interval_s)
        while True:
            await asyncio.sleep(interval)
            try:
                now = self.clock.now()
                self.policy.charge_usage(now)
                instructions = self.state.expire_time_limits(now)
                instructions += self.state.expire_heartbeats(now)
                self.state.purge_finished(now, self.config.finished_job_retention_s)
                if instructions:
                    self.execute(instructions)
                    self.request_schedule()
            except Exception:
                log.exception("timer tick failed")

    # ---------------------------------------------------------------------------------------------
    # Instructions -> agent messages

    def execute(self, instructions: Iterable[Instruction]) -> None:
        for ins in instructions:
            session = self.sessions.get(ins.node)
            if session is None:
                continue  # the node is not connected; reconciliation on its return covers this
            if isinstance(ins, Launch):
                session.send(pb.ControllerMessage(launch=self._launch_message(ins)))
                log.info("launch job=%d attempt=%d node=%s", ins.job.job_id, ins.attempt, ins.node)
            elif isinstance(ins, SignalAttempt):
                action = {"signal": pb.SignalJob.SIGNAL, "terminate": pb.SignalJob.TERMINATE, "kill": pb.SignalJob.KILL}[
                    ins.action
                ]
                session.send(
                    pb.ControllerMessage(
                        signal=pb.SignalJob(job_id=ins.job_id, attempt=ins.attempt, action=action, signal=ins.signal)
                    )
                )
                log.info("%s job=%d attempt=%d node=%s", ins.action, ins.job_id, ins.attempt, ins.node)
            elif isinstance(ins, AckResult):
                session.send(pb.ControllerMessage(ack=pb.AckResult(job_id=ins.job_id, attempt=ins.attempt)))

    def _launch_message(self, ins: Launch) -> pb.LaunchJob:
        job = ins.job
        attempt = job.attempts[ins.attempt]
        names = attempt.allocation.node_names
        head = self.sessions.get(names[0])
        msg = pb.LaunchJob(
            job_id=job.job_id,
            attempt=ins.attempt,
            user=job.user,
            uid=job.uid,
            gid=job.gid,
            spec=convert.spec_to_pb(job.spec),
            allocation=convert.allocation_to_pb(attempt.allocation),
            node_rank=names.index(ins.node),
            master_addr=head.address if head is not None else names[0],
            master_port=master_port(job.job_id, ins.attempt),
            restart_count=job.restart_count,
            kill_wait_s=self.config.kill_wait_s,
            time_limit_s=job.time_limit_s,
        )
        if job.array_job_id is not None:
            msg.array_job_id = job.array_job_id
        if job.array_task_id is not None:
            msg.array_task_id = job.array_task_id
        return msg

    def preempt(self, job_id: int, grace_s: float, now: float) -> list[Instruction]:
        """Start preempting a running job: its --signal (default SIGUSR1) now, SIGTERM after the grace period
        (the job's own --signal lead time when it asked for one), requeued when its ranks have ended."""
        job = self.state.jobs.get(job_id)
        if job is None:
            return []
        warning = parse_signal_request(job.spec.signal) if job.spec.signal else None
        signum = warning.signum if warning else DEFAULT_WARNING_SIGNAL
        grace = float(warning.seconds) if warning else grace_s
        instructions = self.state.preempt(job_id, grace, int(signum), now)
        if instructions:
            log.info("job=%d node=%s preempting: signal %d, grace %.0fs", job_id,
                     ",".join(sorted({i.node for i in instructions})), signum, grace)
            metrics.record_preemption()
        return instructions

    # ---------------------------------------------------------------------------------------------
    # Client operations

    def _checked_submission(self, principal: Principal, request: pb.SubmitJobRequest) -> tuple[Resolved, list[int]]:
        """Everything a submission is checked for, before anything is stored (submit and test_submit)."""
        spec = convert.spec_from_pb(request.spec)
        indices = list(request.array_indices)
        if request.HasField("array_max_running"):
            spec = replace(spec, array_max_running=request.array_max_running)
        resolved = validate_submission(
            spec, principal, self.config, self.state.nodes, indices, self.policy.accounting
        )
        if spec.nice < 0 and not self.is_admin(principal):
            raise PermissionDenied("only admins may give a negative --nice (it raises the job's priority)")
        if resolved.spec.dependency is not None:
            resolved = replace(resolved, spec=replace(resolved.spec, dependency=self._known_dependency(resolved.spec.dependency)))
        begin = resolved.spec.begin_time
        if begin is not None and not (math.isfinite(begin) and begin <= self.clock.now() + MAX_BEGIN_AHEAD_S):
            raise ValidationError("--begin: at most a year ahead")
        return resolved, indices

    def submit(self, principal: Principal, request: pb.SubmitJobRequest) -> tuple[int, int]:
        resolved, indices = self._checked_submission(principal, request)
        now = self.clock.now()
        count = len(indices) or 1
        first = self.state.store.allocate_job_ids(count)
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
            jobs = [
                Job(job_id=first + i, array_job_id=first, array_task_id=index, **common)  # type: ignore[arg-type]
                for i, index in enumerate(indices)
            ]
        else:
            jobs = [Job(job_id=first, **common)]  # type: ignore[arg-type]
        self.state.add_jobs(jobs)
        if request.hold:
            self.state.hold([job.job_id for job in jobs], by_admin=False)
        log.info("submitted job=%d node=- tasks=%d user=%s%s", first, count, principal.user,
                 " held" if request.hold else "")
        self.request_schedule()
        return first, count

    async def test_submit(self, principal: Principal, request: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
        """sbatch --test-only: check the job as a submission is checked, then run the scheduling core on the
        cluster as it is now with the job added, and say when and where it would start. Nothing is stored
        and nothing starts: the core is pure, and its plan is only read. (An array is estimated as its
        first task.)"""
        resolved, _ = self._checked_submission(principal, request)
        now = self.clock.now()
        job = Job(job_id=TEST_JOB_ID, spec=resolved.spec, user=principal.user, uid=principal.uid, gid=principal.gid,
                  account=resolved.account, partition=resolved.partition, time_limit_s=resolved.time_limit_s,
                  submit_time=now)
        response = pb.SubmitJobResponse(partition=resolved.partition)
        if resolved.spec.dependency is not None:
            response.reason = "Dependency"  # its start depends on other jobs' ends, which no plan knows
            return response
        snapshot = self.policy.snapshot()
        snapshot = replace(snapshot, pending=(*snapshot.pending, pending_view(job)))
        # Plan a reservation for every job up to this one (for as many as a test may cost), so the estimate
        # does not depend on how deep in the queue it lands.
        depth = min(len(snapshot.pending), TEST_ONLY_MAX_RESERVATIONS)
        config = self.policy.scheduler
        config = replace(config, reservations=max(config.reservations, depth),
                         max_job_test=max(config.max_job_test, depth))
        plan = await asyncio.get_running_loop().run_in_executor(self._pool, self._compute_plan, snapshot, now, config)
        allocation = next((s.allocation for s in plan.starts if s.job_id == TEST_JOB_ID), None)
        if allocation is None:
            allocation = next((r.allocation for r in plan.reservations if r.job_id == TEST_JOB_ID), None)
            response.reason = plan.waiting.get(TEST_JOB_ID, "")
        start = plan.estimated_starts.get(TEST_JOB_ID)
        if start is not None:
            response.estimated_start = max(start, now)
        if allocation is not None:
            response.nodes.extend(node.node for node in allocation.nodes)
        return response

    def _known_dependency(self, text: str) -> str:
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

    def cancel(self, principal: Principal, request: pb.CancelJobsRequest) -> pb.CancelJobsResponse:
        """gcancel: cancel the selected jobs, or with ``signal`` send it to the ranks of those running."""
        signum = None
        if request.signal:
            try:
                signum = parse_signal_name(request.signal, "signal")
            except ValueError as exc:
                raise ValidationError(str(exc)) from None
        jobs = self._jobs_to_control(principal, request, "signal" if signum is not None else "cancel")
        if signum is not None:
            return self._signal_jobs(principal, jobs, signum, list(request.job_ids))
        cancelled, instructions = self.state.cancel([j.job_id for j in jobs], self.clock.now())
        self.execute(instructions)
        if cancelled:
            log.info("%s cancelled %d job(s)", principal.user, len(cancelled))
            self.request_schedule()
        return pb.CancelJobsResponse(cancelled=cancelled)

    def _jobs_to_control(self, principal: Principal, request: pb.CancelJobsRequest, verb: str) -> list[Job]:
        states = {s.upper() for s in request.states}
        unknown = states - {s.value for s in JobState}
        if unknown:
            raise ValidationError(f"unknown job state {sorted(unknown)[0]!r}")
        filtered = bool(request.user or states or request.names or request.partitions or request.accounts)
        if request.job_ids:
            jobs = self._resolve_refs(request.job_ids)
        elif filtered:
            jobs = list(self.state.jobs.values())
        else:
            raise ValidationError(f"nothing to {verb}: give job ids, a user, states, names, partitions or accounts")
        users = {request.user} if request.user else set()
        jobs = [j for j in jobs if _matches(j, users, states, request.names, request.partitions, request.accounts)]
        if not request.job_ids:
            # Filters alone select only the caller's jobs unless an admin asks.
            jobs = [j for j in jobs if self.may_manage(principal, j)]
        for job in jobs:
            if not self.may_manage(principal, job):
                raise PermissionDenied(f"job {job.display_id} belongs to {job.user}; only its owner may {verb} it")
        return jobs

    def _signal_jobs(self, principal: Principal, jobs: list[Job], signum: int, refs: list[str]) -> pb.CancelJobsResponse:
        """Signal the running ones of ``jobs``; report each of ``refs`` (the ids the user named) of which none
        was running: an array with some tasks running counts as signalled."""
        response = pb.CancelJobsResponse()
        for job in jobs:
            instructions = self.state.signal_running(job.job_id, signum)
            if instructions:
                self.execute(instructions)
                response.signalled.append(job.job_id)
        signalled = set(response.signalled)
        selected = {job.job_id for job in jobs}
        for ref, found in zip(refs, self._resolve_each(refs), strict=True):
            if not any(job.job_id in signalled for job in found if job.job_id in selected):
                response.not_running.append(ref)
        if response.signalled:
            log.info("%s sent signal %d to %d job(s)", principal.user, signum, len(response.signalled))
        return response

    def list_jobs(self, request: pb.ListJobsRequest) -> list[Job]:
        states = {s.upper() for s in request.states}
        unknown = states - {s.value for s in JobState}
        if unknown:
            raise ValidationError(f"unknown job state {sorted(unknown)[0]!r}")
        jobs: Iterable[Job]
        jobs = self._resolve_refs(request.job_ids) if request.job_ids else self.state.jobs.values()
        users = set(request.users)
        selected = [j for j in jobs if _matches(j, users, states, request.names, request.partitions, request.accounts)]
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

    # ---------------------------------------------------------------------------------------------
    # Agent link

    def node_partitions(self, name: str) -> frozenset[str]:
        return self.policy.node_partitions(name)

    def agent_connected(self, session: AgentSession, register: pb.Register) -> None:
        old = self.sessions.get(session.node)
        if old is not None and old is not session:
            old.close()
        self.sessions[session.node] = session
        session.send(
            pb.ControllerMessage(registered=pb.RegisterAck(heartbeat_interval_s=self.config.heartbeat_interval_s))
        )
        now = self.clock.now()
        instructions = self.state.register_node(
            session.node,
            convert.inventory_from_pb(register.inventory),
            self.node_partitions(session.node),
            [(r.job_id, r.attempt) for r in register.running],
            [convert.result_from_pb(r) for r in register.finished],
            now,
        )
        # Checkpoint marks of the running attempts, before any cycle could choose a preemption victim.
        for ref in register.running:
            self._checkpointed(ref.job_id, ref.attempt, ref.checkpoint_time, now)
        log.info(
            "node %s registered: %d GPUs, %d running, %d finished results",
            session.node,
            len(register.inventory.gpus),
            len(register.running),
            len(register.finished),
        )
        self.execute(instructions)
        self.request_schedule()

    def _checkpointed(self, job_id: int, attempt: int, when: float, now: float) -> None:
        """An agent's report of a checkpoint mark: a time that is not a positive finite number is ignored,
        one in the future (a node clock ahead of ours) counts as now."""
        if math.isfinite(when) and when > 0:
            self.state.checkpointed(job_id, attempt, min(when, now))

    def agent_message(self, session: AgentSession, message: pb.AgentMessage) -> None:
        if self.sessions.get(session.node) is not session:
            return  # a stream that has been replaced by a newer connection
        now = self.clock.now()
        self.state.heartbeat(session.node, now)
        kind = message.WhichOneof("kind")
        if kind == "started":
            self.execute(self.state.node_started(session.node, message.started.job_id, message.started.attempt))
        elif kind == "checkpointed":
            c = message.checkpointed
            self._checkpointed(c.job_id, c.attempt, c.time, now)
        elif kind == "finished":
            result: NodeResult = convert.result_from_pb(message.finished)
            self.execute(self.state.node_finished(session.node, result, now))
            self.request_schedule()

    def agent_disconnected(self, session: AgentSession) -> None:
        if self.sessions.get(session.node) is session:
            del self.sessions[session.node]
            self.state.disconnect(session.node)
            log.warning("node %s disconnected", session.node)

    def nodes_view(self) -> list[pb.NodeInfo]:
        out = []
        cpus, memory = self.state.held_cpus_and_memory()
        for node in sorted(self.state.nodes.values(), key=lambda n: n.name):
            allocated = list(self.state.gpu_owner.get(node.name, {}))
            info = convert.node_to_pb(node, allocated, node.name in self.state.connected,
                                      len(cpus.get(node.name, ())), memory.get(node.name, 0))
            info.partitions.extend(sorted(self.node_partitions(node.name)))
            out.append(info)
        return out

    def partitions_view(self) -> list[pb.PartitionSummary]:
        return [
            pb.PartitionSummary(name=p.name, default=p.default, default_time_s=p.default_time_s, max_time_s=p.max_time_s)
            for p in self.policy.accounting.partitions
        ]
