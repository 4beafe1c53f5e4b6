"""Job dependencies, `gsub -d afterok:12:13,afterany:14` (sbatch --dependency): the syntax, and the core's
typed input for it (the scheduling core decides: controller/sched/dependencies.py).

Pure: no I/O, the jobs are passed in. A dependency list is a list of TYPE:JOB[:JOB...] items separated by
',' (every item must hold) or by '?' (one must), as in Slurm, which does not mix the two either. Within an
item every job must satisfy the type. JOB is a job id, an array's id (every task of it) or one array task
(12_3). The types, as in Slurm:

- ``after``: each job has started (or was cancelled before it could); ``after:12+5``, and 5 minutes have
  passed since (since the last of the jobs the reference stands for started). As in Slurm, a ``+MINUTES`` on a
  reference of another type is taken and means nothing;
- ``afterany``: each job has ended, however;
- ``afterok``: each job has completed with exit code 0;
- ``afternotok``: each job has ended otherwise (failed, timed out, cancelled, node failure);
- ``aftercorr``: for a task of an array, the task of each named array with the same index has completed with
  exit code 0 (a pipeline of arrays, task by task); where a named job has no such task, or the dependent job
  is no array task, every job it stands for (afterok);
- ``singleton`` (no jobs): no other job of the same user and name is running; of several pending ones, one
  starts at a time.

A job whose dependency can no longer hold (``afterok`` on a job that failed) stays pending with the reason
``DependencyNeverSatisfied``, as in Slurm, until its owner cancels it. A job that is no longer known (its
record was dropped after ``finished_job_retention_s``) has ended: that satisfies ``after`` and
``afterany``, and since how it ended is not known any more, never ``afterok`` or ``afternotok``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from garrison.controller.sched.dependencies import (
    DependencyItem,
    DependencyKind,
    DependencyStatus,
    JobDependencies,
    dependency_status,
)
from garrison.controller.sched.plan import Reason
from garrison.model.domain import Job

AFTERCORR = "aftercorr"
KINDS = ("after", "afterany", "afterok", "afternotok", AFTERCORR, "singleton")
MAX_DEPENDENCY_JOBS = 100
_JOB_REF = re.compile(r"[0-9]{1,18}(_[0-9]{1,9})?")
_DELAY = re.compile(r"[0-9]{1,7}")  # minutes: up to 19 years
SECONDS_PER_MINUTE = 60

# What a pending job waits for (gqueue's reason), or SATISFIED.
SATISFIED = ""
WAITING = Reason.DEPENDENCY
NEVER = Reason.DEPENDENCY_NEVER_SATISFIED


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: str  # one of KINDS
    jobs: tuple[str, ...]  # job references: "12" or "12_3"
    delays_min: tuple[int, ...] = ()  # per reference, its +MINUTES (0: none); () where none has one


@dataclass(frozen=True, slots=True)
class DependencyList:
    items: tuple[Dependency, ...]
    any_of: bool = False  # '?': one item must hold; ',': every item must

    def job_refs(self) -> list[str]:
        return [ref for item in self.items for ref in item.jobs]

    @property
    def singleton(self) -> bool:
        return any(item.kind == "singleton" for item in self.items)


def parse_dependency(text: str) -> DependencyList:
    """``"afterok:12:13,afterany:14_2"`` or ``"afterok:12?afternotok:13"`` -> its items. ValueError with one
    line if it is neither."""
    any_of = "?" in text
    if any_of and "," in text:
        raise ValueError("--dependency: use ',' (all of) or '?' (any of), not both")
    items: list[Dependency] = []
    count = 0
    for item in text.split("?" if any_of else ","):
        kind, _, refs = item.strip().partition(":")
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise ValueError(f"--dependency: unknown type {kind!r} in {item.strip()!r}: use {', '.join(KINDS)}")
        if kind == "singleton":
            if refs:
                raise ValueError("--dependency: singleton names no job")
            items.append(Dependency(kind, ()))
            continue
        words = tuple(ref.strip() for ref in refs.split(":")) if refs else ()
        if not words:
            raise ValueError(f"--dependency: {kind} names no job")
        jobs, delays = [], []
        for word in words:
            ref, plus, delay = word.partition("+")
            if not _JOB_REF.fullmatch(ref):
                raise ValueError(f"--dependency: {ref!r} is not a job id (12, or 12_3 for an array task)")
            if plus and not _DELAY.fullmatch(delay):
                raise ValueError(f"--dependency: {word!r}: the delay after '+' is a whole number of minutes")
            jobs.append(ref)
            delays.append(int(delay) if plus else 0)
        count += len(jobs)
        items.append(Dependency(kind, tuple(jobs), tuple(delays) if any(delays) else ()))
    if count > MAX_DEPENDENCY_JOBS:
        raise ValueError(f"--dependency: at most {MAX_DEPENDENCY_JOBS} jobs, got {count}")
    return DependencyList(tuple(items), any_of)


def format_dependency(dependencies: DependencyList) -> str:
    return ("?" if dependencies.any_of else ",").join(
        f"{item.kind}:{':'.join(_with_delays(item))}" if item.jobs else item.kind for item in dependencies.items
    )


def _with_delays(item: Dependency) -> tuple[str, ...]:
    if not item.delays_min:
        return item.jobs
    return tuple(f"{ref}+{delay}" if delay else ref for ref, delay in zip(item.jobs, item.delays_min, strict=True))


def typed_dependencies(
    dependencies: DependencyList, jobs_for: Callable[[str], Sequence[Job]], singleton_key: tuple[str, str] | None = None,
    array_task: int | None = None,
) -> JobDependencies:
    """The scheduling core's input for a dependency list (sched/dependencies.py decides on it): each item's
    kind and, per job reference, the states of the jobs it stands for now. ``array_task``: the dependent
    job's array index (for aftercorr, which the core sees as afterok on the corresponding task)."""
    items = []
    for item in dependencies.items:
        if item.kind == AFTERCORR:
            refs = tuple(tuple(j.state for j in _corresponding(jobs_for, ref, array_task)) for ref in item.jobs)
            items.append(DependencyItem(DependencyKind.AFTEROK, refs))
        elif item.kind == "after" and item.delays_min:
            found = [jobs_for(ref) for ref in item.jobs]
            items.append(DependencyItem(DependencyKind.AFTER, tuple(tuple(j.state for j in jobs) for jobs in found),
                                        tuple(_ready_at(jobs, delay) for jobs, delay in
                                              zip(found, item.delays_min, strict=True))))
        else:
            items.append(DependencyItem(DependencyKind(item.kind),
                                        tuple(tuple(j.state for j in jobs_for(ref)) for ref in item.jobs)))
    return JobDependencies(tuple(items), dependencies.any_of, singleton_key if dependencies.singleton else None)


def _ready_at(jobs: Sequence[Job], delay_min: int) -> float | None:
    """When ``after:REF+delay_min`` holds for the jobs REF stands for: ``delay_min`` minutes after the last of
    them started (or ended, for one cancelled before it started: Slurm's start time then); None while one has
    neither (pending); 0.0 without a delay. A reference no longer known holds at once, as without a delay."""
    if not delay_min:
        return 0.0
    moments = [job.start_time if job.start_time is not None else job.end_time for job in jobs]
    if any(moment is None for moment in moments):
        return None
    return max((m for m in moments if m is not None), default=0.0) + delay_min * SECONDS_PER_MINUTE


def _corresponding(jobs_for: Callable[[str], Sequence[Job]], ref: str, array_task: int | None) -> Sequence[Job]:
    """The task of array ``ref`` with the dependent task's index, looked up as ``REF_INDEX`` (by id where the
    array's indices allow, not by a scan of its tasks for each dependent task); else every job ``ref`` stands
    for."""
    if array_task is not None and "_" not in ref:
        same = jobs_for(f"{ref}_{array_task}")
        if same:
            return same
    return jobs_for(ref)


_REASONS = {DependencyStatus.SATISFIED: SATISFIED, DependencyStatus.WAITING: WAITING, DependencyStatus.NEVER: NEVER}


def dependency_reason(
    dependencies: DependencyList, jobs_for: Callable[[str], Sequence[Job]], *, namesake_running: bool = False,
    now: float = 0.0,
) -> str:
    """SATISFIED, WAITING or NEVER for a pending job's dependency list at ``now``, as the core decides it.
    ``jobs_for`` gives the jobs a reference stands for ([] when none is known any more); ``namesake_running``,
    whether another job of the same user and name is running (for singleton)."""
    return _REASONS[dependency_status(typed_dependencies(dependencies, jobs_for), namesake_running, now)]
