"""What the controller needs from its durable store, independent of the database behind it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from garrison.model.accounts import Accounting, UsageState
from garrison.model.domain import Job, JobState, Node
from garrison.model.steps import Step


@dataclass(frozen=True)
class LoadedState:
    """Everything the controller rebuilds its in-memory state from at start-up."""

    jobs: list[Job]  # every job with its attempts (in attempt order), ordered by job_id
    nodes: list[Node]  # ordered by name
    next_job_id: int  # the first id allocate_job_ids has not handed out yet
    stops: tuple[AttemptStop, ...] = ()  # decisions to stop attempts, of jobs still COMPLETING


@dataclass(frozen=True)
class AttemptStop:
    """The controller's decision to stop an attempt, durable so that a restarted controller carries it out
    as decided: the job's outcome, the state its attempt is recorded with when the job is requeued
    (PREEMPTED, CANCELLED, NODE_FAIL...), why, and the end of a preemption's grace period (None when the
    attempt is being terminated now)."""

    job_id: int
    attempt: int
    outcome: JobState
    requeue_as: JobState
    reason: str
    terminate_at: float | None = None


@dataclass(frozen=True)
class StoreChanges:
    """Everything one controller operation changes, written in one transaction (``Store.write``): either
    all of it is durable or none of it is."""

    jobs: Sequence[Job] = ()
    holds: Mapping[int, bool | None] = field(default_factory=dict)  # job id -> held by an admin; None: released
    nodes: Sequence[Node] = ()
    stops: Sequence[AttemptStop] = ()
    # (first, end): job ids first..end-1 taken from the counter in this same transaction, which the counter
    # must still read ``first`` for (else ``JobIdsTaken``, and nothing is written). A submission's ids so
    # cost no transaction of their own (allocate_job_ids): the controller knows the counter's value.
    job_ids: tuple[int, int] | None = None

    def __bool__(self) -> bool:
        return bool(self.jobs or self.holds or self.nodes or self.stops or self.job_ids)


@dataclass(frozen=True)
class JobQuery:
    """Which job records accounting asks for; every given filter must hold, empty ones match anything.

    The window [``active_after``, ``active_before``] selects jobs that existed in any state at some moment
    of it, as sacct's -S/-E do: submitted by its end, and not yet ended (or still going) at its start.
    """

    job_ids: tuple[int, ...] = ()  # a job's id, or an array's id: every task of that array
    array_tasks: tuple[tuple[int, int], ...] = ()  # (array job id, task id), for 12_3
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    states: tuple[JobState, ...] = ()
    active_after: float | None = None
    active_before: float | None = None
    after_job_id: int = 0  # paging: only jobs with a larger id
    limit: int | None = None  # at most this many jobs, the lowest ids first


@dataclass(frozen=True)
class UsageRow:
    """GPU time charged to one (account, user) within a period."""

    account: str
    user: str
    gpu_seconds: float  # sum over attempts of allocated GPUs x the part of the attempt inside the period
    jobs: int  # jobs with at least one attempt overlapping the period
    attempts: int


class Store(Protocol):
    """The controller's durable copy of its state.

    The controller's memory is authoritative while it runs; it writes every change through to the store
    before acting on it (a submit is persisted before the client sees its job id), and reads everything back
    with ``load`` at start-up. Every method commits before it returns, so a change a method has returned from
    survives the controller being killed. Methods may be called from several threads.

    When the database cannot be reached or cannot take a write, every method raises
    ``errors.StoreUnavailable`` (and has changed nothing); the caller may retry.
    """

    def load(self) -> LoadedState:
        """Everything, after deleting the jobs of submissions begun and never ended (begin_submission)."""
        ...

    def allocate_job_ids(self, count: int) -> int:
        """Durably reserve ``count`` consecutive job ids and return the first; ids start at 1 and are never
        handed out twice, even if the controller crashes before it uses them."""
        ...

    def save_jobs(self, jobs: Sequence[Job]) -> None:
        """Insert or update each job and all of its attempts, in one transaction."""
        ...

    def write(self, changes: StoreChanges) -> None:
        """Write jobs (with their attempts), holds, nodes and attempt stops in one transaction, and move the
        job id counter on (``changes.job_ids``; ``errors.JobIdsTaken`` if it had moved on already)."""
        ...

    def begin_submission(self, first_job_id: int, count: int) -> None:
        """Record that jobs [first_job_id, first_job_id + count) are about to be saved in several
        transactions (a large array, controller/bulk.py). Until ``end_submission``, ``load`` deletes them:
        a controller killed midway must not run part of an array whose client never got its id."""
        ...

    def end_submission(self, first_job_id: int) -> None:
        """Every job of the submission begun at ``first_job_id`` is saved: it survives a restart now."""
        ...

    def save_node(self, node: Node) -> None:
        """Insert or update a node and its GPUs."""
        ...

    def delete_jobs(self, job_ids: Sequence[int]) -> None:
        """Remove jobs and their attempts (retention of finished jobs); unknown ids are ignored."""
        ...

    def query_jobs(self, query: JobQuery) -> list[Job]:
        """Jobs matching ``query`` with all of their attempts, ordered by job id: finished ones too, since the
        store keeps every job the controller has forgotten from memory."""
        ...

    def usage(
        self,
        start: float,
        end: float,
        now: float,
        users: Sequence[str] = (),
        accounts: Sequence[str] = (),
    ) -> list[UsageRow]:
        """GPU time per (account, user) in [start, end], ordered by account then user. An attempt still
        running counts up to ``now``."""
        ...

    # -- scheduling policy (controller/store/policy_tables.py) ---------------------------------------

    def load_accounting(self) -> Accounting | None:
        """The accounting data last saved (accounts, users, QoS, quotas, partitions), or None if it was
        never saved: the controller then seeds it from its configuration."""
        ...

    def save_accounting(self, accounting: Accounting) -> None:
        """Replace the whole accounting data with ``accounting``, in one transaction."""
        ...

    def load_usage(self) -> UsageState:
        """The usage ledger as last saved (no records and time 0 if never)."""
        ...

    def save_usage(self, state: UsageState) -> None:
        """Insert or update every record of ``state`` and its times, in one transaction."""
        ...

    def load_holds(self) -> dict[int, bool]:
        """Held jobs: job id -> whether an admin holds it (only an admin may release those)."""
        ...

    def set_holds(self, job_ids: Sequence[int], by_admin: bool) -> None:
        """Hold every job of ``job_ids`` (by an admin or not), in one transaction: a held array's tasks."""
        ...

    def set_hold(self, job_id: int, by_admin: bool | None) -> None:
        """Hold job ``job_id`` (by an admin or not), or with None release it."""
        ...

    # -- job steps (controller/store/step_tables.py) ---------------------------------------------------

    def save_step(self, step: Step) -> None:
        """Insert or update one job step (its job must be stored)."""
        ...

    def last_step_id(self, job_id: int) -> int | None:
        """The highest step number stored for the job, or None if it has none."""
        ...

    def query_steps(self, job_ids: Sequence[int] = (), users: Sequence[str] = (), limit: int = 10000,
                    running_only: bool = False) -> list[Step]:
        """Steps of these jobs and users (empty: any), ordered by job then step, at most ``limit``; with
        ``running_only`` only those not ended (what a restarted controller picks up again)."""
        ...

    def close(self) -> None: ...
