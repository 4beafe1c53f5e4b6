"""Dependencies and singletons (sbatch -d), decided in the core on typed inputs.

The snapshot gives each pending job with a -d list its items as ``JobDependencies``: for each item its kind
and, for each job reference, the states of the jobs it stands for now (none: no such job is known any
more); a singleton job also has its (user, name), and the snapshot lists the (user, name) of every job
that holds resources. The core decides from those whether the dependency holds, may hold later, or never
will, and starts at most one pending singleton of a (user, name) per cycle. The text syntax (parsing,
formatting, resolving references) stays with the controller (controller/dependency.py).

The rules, as in Slurm:

- ``after``: each job has started (or was cancelled before it could), and, where the reference has a delay
  (``after:12+5``), that many minutes have passed since (the item's ``ready_at``, against the cycle's now);
- ``afterany``: each job has ended, however;
- ``afterok``: each job has completed with exit code 0;
- ``afternotok``: each job has ended otherwise (failed, timed out, cancelled, node failure);
- ``singleton``: no other job of the same user and name is running.

A job no longer known has ended: that satisfies ``after`` and ``afterany``, and since how it ended is not
known any more, never ``afterok`` or ``afternotok``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from garrison.model.domain import JobState


class DependencyKind(enum.Enum):
    AFTER = "after"
    AFTERANY = "afterany"
    AFTEROK = "afterok"
    AFTERNOTOK = "afternotok"
    SINGLETON = "singleton"


class DependencyStatus(enum.Enum):
    SATISFIED = "satisfied"
    WAITING = "waiting"  # may hold later
    NEVER = "never"  # can no longer hold: its owner should cancel the job


@dataclass(frozen=True, slots=True)
class DependencyItem:
    kind: DependencyKind
    # Per job reference, the states of the jobs it stands for now (() : none is known any more).
    refs: tuple[tuple[JobState, ...], ...] = ()
    # ``after`` only, per reference, where one has a delay (after:12+5): the moment its delay has passed since the
    # last of its jobs started (or was cancelled pending), None while one has not (0.0: no delay); () where no
    # reference has one.
    ready_at: tuple[float | None, ...] = ()


@dataclass(frozen=True, slots=True)
class JobDependencies:
    items: tuple[DependencyItem, ...]
    any_of: bool = False  # '?': one item must hold; ',': every item must
    singleton_key: tuple[str, str] | None = None  # (user, name) when an item is singleton

    @property
    def singleton(self) -> bool:
        return self.singleton_key is not None


def dependency_status(dependencies: JobDependencies, namesake_running: bool, now: float) -> DependencyStatus:
    """Whether the list holds ``now``, may hold later or never will (``namesake_running``: another job of the
    same user and name holds resources, for singleton)."""
    statuses = {_item_status(item, namesake_running, now) for item in dependencies.items}
    if dependencies.any_of:
        if DependencyStatus.SATISFIED in statuses:
            return DependencyStatus.SATISFIED
        return DependencyStatus.WAITING if DependencyStatus.WAITING in statuses else DependencyStatus.NEVER
    if DependencyStatus.NEVER in statuses:
        return DependencyStatus.NEVER
    return DependencyStatus.WAITING if DependencyStatus.WAITING in statuses else DependencyStatus.SATISFIED


def delay_ends(dependencies: JobDependencies, now: float) -> float | None:
    """The earliest moment after ``now`` that an ``after`` delay ends (a cycle then may start the job, though
    nothing else changed), or None."""
    ends = [ready for item in dependencies.items for ready in item.ready_at if ready is not None and ready > now]
    return min(ends) if ends else None


def _item_status(item: DependencyItem, namesake_running: bool, now: float) -> DependencyStatus:
    if item.kind == DependencyKind.SINGLETON:
        return DependencyStatus.WAITING if namesake_running else DependencyStatus.SATISFIED
    status = DependencyStatus.SATISFIED
    for index, states in enumerate(item.refs):
        if not states:
            if item.kind in (DependencyKind.AFTEROK, DependencyKind.AFTERNOTOK):
                return DependencyStatus.NEVER
            continue
        for state in states:
            holds = _holds(item.kind, state)
            if holds is None:
                return DependencyStatus.NEVER
            if not holds:
                status = DependencyStatus.WAITING
        if item.ready_at:
            ready = item.ready_at[index]
            if ready is None or ready > now:
                status = DependencyStatus.WAITING  # its delay runs still
    return status


def _holds(kind: DependencyKind, state: JobState) -> bool | None:
    """Whether a job in ``state`` satisfies ``kind`` now (True), may later (False), or never will (None)."""
    if kind == DependencyKind.AFTER:
        return state != JobState.PENDING
    if not state.is_terminal:
        return False
    if kind == DependencyKind.AFTERANY:
        return True
    if kind == DependencyKind.AFTEROK:
        return True if state == JobState.COMPLETED else None
    return True if state != JobState.COMPLETED else None  # afternotok
