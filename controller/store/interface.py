"""What the controller needs from its durable store, independent of the database behind it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from garrison.model.accounts import Accounting, UsageState
from garrison.model.domain import Job, JobState, Node


@dataclass(frozen=True)
class LoadedState:
    """Everything the controller rebuilds its in-memory state from at start-up."""

    jobs: list[Job]  # every job with its attempts (in attempt order), ordered by job_id
    nodes: list[Node]  # ordered by name
    next_job_id: int  # the first id allocate_job_ids has not handed out yet


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
    """

    def load(self) -> LoadedState: ...

    def allocate_job_ids(self, count: int) -> int:
        """Durably reserve ``count`` consecutive job ids and return the first; ids start at 1 and are never
        handed out twice, even if the controller crashes before it uses them."""
        ...

    def save_jobs(self, jobs: Sequence[Job]) -> None:
        """Insert or update each job and all of its attempts, in one transaction."""
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

    def set_hold(self, job_id: int, by_admin: bool | None) -> None:
        """Hold job ``job_id`` (by an admin or not), or with None release it."""
        ...

    def close(self) -> None: ...
