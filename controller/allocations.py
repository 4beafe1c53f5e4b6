"""Interactive allocations (galloc, Slurm's salloc): their status, their keep-alive lease and their release.

An allocation is a job whose launch mode is ``allocation``: it goes through the same queue, priorities,
quotas and limits as batch work, and on its nodes it runs nothing but holds its resources (the agents keep a
placeholder; steps started in it run inside it). Its command runs on the submitting host, under galloc.

galloc asks for the allocation's status every third of ``allocation_keepalive_s``; each request renews the
allocation's lease. A lease not renewed for that long (galloc killed, its host gone or cut off) ends the
allocation as CANCELLED, so a vanished galloc never holds GPUs until the time limit. Leases live in memory
only: after a controller restart every allocation gets a full lease from then, and a galloc still alive
renews it within a third of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from garrison.controller.instructions import Instruction, Launch
from garrison.controller.validate import ValidationError
from garrison.model.domain import Job, JobState, LaunchMode, Principal
from garrison.model.slurmenv import allocation_environment

if TYPE_CHECKING:
    from garrison.controller.engine import Engine

log = logging.getLogger("garrison.controller.allocations")

LAPSED_REASON = "its galloc or srun went away (its keep-alive lapsed)"
MIN_CHECK_INTERVAL_S = 1.0  # leases are checked at most this often: the check reads every job


@dataclass(frozen=True, slots=True)
class AllocationStatus:
    """What galloc is told each time it renews its lease."""

    job_id: int
    state: JobState
    reason: str  # a pending job's wait reason, an ended job's reason
    keepalive_s: float  # the lease: galloc renews it every third of this
    position: int = 0  # in the last scheduling cycle's queue (1 is next); 0: not known yet
    estimated_start: float | None = None  # from the last cycle's plan; None: no estimate
    # Where the allocation is going while it is being stopped (TIMEOUT, CANCELLED, PENDING for a preemption's
    # requeue, COMPLETED or FAILED after a release), and once it has ended, its final state; else None.
    outcome: JobState | None = None
    nodes: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)  # once granted (RUNNING): the command's


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    released: bool  # False: the allocation was not running (still starting, being stopped, ended)
    state: JobState


class AllocationLeases:
    """Each live allocation's lease deadline, renewed by galloc's status requests.

    Which jobs are live allocations is kept up to date by ``job_changed`` (a job observer), so a check costs
    one look per allocation, not per job; the first check reads every job once, for the allocations loaded
    from the store at start-up (they are not observed)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._deadlines: dict[int, float] = {}
        self._live: dict[int, Job] = {}  # the allocations not yet ended, as last seen
        self._seeded = False
        self._next_check = 0.0

    def renew(self, job_id: int, now: float) -> None:
        self._deadlines[job_id] = now + self.lease_s

    def job_changed(self, before: Job | None, after: Job) -> None:
        if after.spec.launch != LaunchMode.ALLOCATION:
            return
        if after.state.is_terminal:
            self._live.pop(after.job_id, None)
            self._deadlines.pop(after.job_id, None)
        else:
            self._live[after.job_id] = after

    def lapsed(self, jobs: Iterable[Job], now: float) -> list[int]:
        """The allocations whose lease has run out, not yet being stopped. An allocation not heard of before
        (just submitted, or the controller restarted) gets a full lease from ``now``. ``jobs``: every job,
        read on the first call only."""
        if now < self._next_check:
            return []
        self._next_check = now + max(MIN_CHECK_INTERVAL_S, self.lease_s / 10)
        if not self._seeded:
            self._seeded = True
            for job in jobs:
                self.job_changed(None, job)
        found: list[int] = []
        for job_id, job in self._live.items():
            deadline = self._deadlines.setdefault(job_id, now + self.lease_s)
            if now >= deadline and job.state != JobState.COMPLETING:
                found.append(job_id)
        return found


class Allocations:
    """galloc's requests, and the lease check the engine's timer runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.leases = AllocationLeases(engine.config.allocation_keepalive_s)
        engine.state.job_observers.append(self.leases.job_changed)

    def _owned_allocation(self, principal: Principal, job_id: int) -> Job:
        from garrison.controller.engine import NotFound, PermissionDenied

        job = self.engine.state.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no such job {job_id}")
        if job.spec.launch != LaunchMode.ALLOCATION:
            raise ValidationError(f"job {job.display_id} is not an allocation (galloc)")
        if principal.uid != job.uid and not self.engine.is_admin(principal):
            raise PermissionDenied(f"job {job.display_id} belongs to {job.user}; only its owner may hold it")
        return job

    def _outcome(self, job: Job) -> JobState | None:
        """How the allocation ended, or is ending: its terminal state, or the decision taken for its attempt
        while it is being stopped (COMPLETING)."""
        if job.state.is_terminal:
            return job.state
        attempt = job.current_attempt
        if job.state == JobState.COMPLETING and attempt is not None:
            live = self.engine.state.live.get((job.job_id, attempt.attempt))
            return live.outcome if live is not None else None
        return None

    def keep(self, principal: Principal, job_id: int) -> AllocationStatus:
        """Renew the allocation's lease and say where it stands."""
        job = self._owned_allocation(principal, job_id)
        now = self.engine.clock.now()
        if not job.state.is_terminal:
            self.leases.renew(job_id, now)
        status = AllocationStatus(job_id=job_id, state=job.state, reason=job.reason,
                                  keepalive_s=self.leases.lease_s, outcome=self._outcome(job))
        if job.state == JobState.PENDING:
            last = self.engine.policy.last
            if last is not None:
                order = last.plan.order
                position = order.index(job_id) + 1 if job_id in order else 0
                start = last.plan.estimated_starts.get(job_id)
                return _with(status, position=position,
                             estimated_start=max(start, now) if start is not None else None)
            return status
        attempt = job.current_attempt
        if attempt is None:
            return status
        nodes = attempt.allocation.node_names
        status = _with(status, nodes=nodes)
        if job.state == JobState.RUNNING:
            launch = self.engine.launch_description(Launch(nodes[0], job, attempt.attempt))
            first = self.engine.state.nodes.get(nodes[0])
            cpus = first.inventory.cpus if first is not None else 0
            status = _with(status, environment=allocation_environment(launch, cpus))
        return status

    def release(self, principal: Principal, job_id: int, exit_code: int) -> ReleaseResult:
        """galloc's command has ended with ``exit_code``: end the allocation with it (a pending one, whose
        galloc gave up waiting, is cancelled)."""
        if not -255 <= exit_code <= 255:
            raise ValidationError(f"exit code must be between -255 and 255, got {exit_code}")
        job = self._owned_allocation(principal, job_id)
        now = self.engine.clock.now()
        if job.state == JobState.PENDING:
            cancelled, instructions = self.engine.state.cancel([job_id], now, reason="its galloc or srun gave up waiting")
            self.engine.execute(instructions)
            return ReleaseResult(released=bool(cancelled), state=self.engine.state.jobs[job_id].state)
        instructions = self.engine.state.release_allocation(job_id, exit_code, now)
        if instructions:
            log.info("%s released allocation job=%d (exit code %d)", principal.user, job_id, exit_code)
            self.engine.execute(instructions)
            self.engine.request_schedule()
        return ReleaseResult(released=bool(instructions), state=self.engine.state.jobs[job_id].state)

    def expire_leases(self, now: float) -> list[Instruction]:
        """Cancel the allocations whose galloc has not been heard from within the lease."""
        lapsed = self.leases.lapsed(self.engine.state.jobs.values(), now)
        if not lapsed:
            return []
        for job_id in lapsed:
            log.warning("job=%d node=- allocation's keep-alive lapsed: cancelling it", job_id)
        _, instructions = self.engine.state.cancel(lapsed, now, reason=LAPSED_REASON)
        return instructions


def _with(status: AllocationStatus, **changes: object) -> AllocationStatus:
    from dataclasses import replace

    return replace(status, **changes)  # type: ignore[arg-type]
