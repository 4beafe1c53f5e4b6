"""Each user's jobs in memory, indexed: what ``gqueue --me`` lists and what ``max_submit_jobs`` counts.

Both used to be a pass over every job in memory; with one user's 100,000-task array queued, every other
user's ``gqueue --me`` paid for that user's tasks. Kept up to date as a ClusterState job observer, and built
from memory on first use (jobs loaded at start-up are not observed). Jobs forgotten from memory
(``purge_finished``, which observers do not hear of) are dropped from the index when it is next read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from garrison.model.domain import Job


class UserJobs:
    def __init__(self, jobs: Mapping[int, Job]) -> None:
        self._jobs = jobs
        self._ids: dict[str, set[int]] | None = None
        self._active: Counter[str] = Counter()  # jobs not yet ended, per user

    def _build(self) -> dict[str, set[int]]:
        ids: dict[str, set[int]] = {}
        self._active = Counter()
        for job in self._jobs.values():
            ids.setdefault(job.user, set()).add(job.job_id)
            if not job.state.is_terminal:
                self._active[job.user] += 1
        self._ids = ids
        return ids

    def job_changed(self, before: Job | None, after: Job) -> None:
        if self._ids is None:
            return  # not built yet: the first read finds the change in memory
        self._ids.setdefault(after.user, set()).add(after.job_id)
        if before is not None and not before.state.is_terminal:
            self._active[before.user] -= 1
        if not after.state.is_terminal:
            self._active[after.user] += 1

    def active(self, user: str) -> int:
        """The user's jobs pending or running (or being stopped)."""
        if self._ids is None:
            self._build()
        return self._active[user]

    def of(self, users: Iterable[str]) -> list[Job]:
        """The jobs in memory of each of ``users``."""
        ids = self._ids if self._ids is not None else self._build()
        found: list[Job] = []
        for user in users:
            mine = ids.get(user)
            if not mine:
                continue
            gone = []
            for job_id in mine:
                job = self._jobs.get(job_id)
                if job is None or job.user != user:
                    gone.append(job_id)
                else:
                    found.append(job)
            mine.difference_update(gone)
        return found
