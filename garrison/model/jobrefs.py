"""Job references as users write them ("12", "12_3") and the jobs they stand for: one reading for gqueue -j,
gcancel, gcontrol, gacct and -d dependencies. Pure; the jobs are passed in."""

from __future__ import annotations

from collections.abc import Mapping

from garrison.model.domain import Job

MAX_ID = 2**63 - 1  # ids are stored as signed 64-bit integers (SQLite INTEGER, PostgreSQL BIGINT)


def parse_job_ref(text: str) -> tuple[int, int | None]:
    """"12" -> (12, None); "12_3" -> (12, 3). ValueError on anything else."""
    head, sep, tail = text.strip().partition("_")
    if not head.isascii() or not head.isdigit() or (sep and not (tail.isascii() and tail.isdigit())) or len(text) > 40:
        raise ValueError(f"invalid job id {text!r}")
    job_id, task = int(head), (int(tail) if sep else None)
    if job_id > MAX_ID or (task is not None and task > MAX_ID):
        raise ValueError(f"invalid job id {text!r}: too large")
    return job_id, task


class JobLookup:
    """The jobs a reference stands for: "12" is every task of array 12, or else job 12; "12_3" is task 3 of
    array 12. The index of array tasks is built on the first question, with one pass over the jobs.

    An array's tasks have consecutive job ids from the array's id (the controller allocates them so), so while
    job ``12`` is in ``jobs`` the reference is answered by looking up ids, without that pass: gcancel of one
    job or one array among 100,000 other tasks costs its own tasks, not the whole queue."""

    def __init__(self, jobs: Mapping[int, Job]) -> None:
        self._jobs = jobs
        self._members: dict[int, list[Job]] | None = None

    def _by_ids(self, job_id: int) -> list[Job] | None:
        """The array's tasks by their ids, or None when that shortcut does not apply."""
        first = self._jobs.get(job_id)
        if self._members is not None or first is None:
            return None
        if first.array_job_id != job_id:
            # Job 12 is in memory and heads no array: then no array is 12 (an array's id is its first task's).
            return []
        count = first.spec.array_task_count
        if not count:
            return None
        found = (self._jobs.get(i) for i in range(job_id, job_id + count))
        return [job for job in found if job is not None and job.array_job_id == job_id]

    def _task_by_id(self, job_id: int, task: int) -> list[Job] | None:
        """Task ``task`` of array ``job_id`` by its own id, when the array's indices are a whole arithmetic
        range (``-a 1-50000``, ``-a 0-30:3``): its tasks then have the ids ``job_id + (task - min) / step`` in
        index order (the controller allocates them so). None when that shortcut does not apply. gjob and
        scontrol of one task of a 50,000-task array looked at every task (~10 ms)."""
        first = self._jobs.get(job_id)
        if self._members is not None or first is None or first.array_job_id != job_id:
            return None
        spec = first.spec
        step = spec.array_task_step or 1
        if (not spec.array_task_count or first.array_task_id != spec.array_task_min
                or spec.array_task_count != (spec.array_task_max - spec.array_task_min) // step + 1):
            return None  # a list of indices (1,5,9-12), or given out of order: no arithmetic from index to id
        offset, rest = divmod(task - spec.array_task_min, step)
        if rest or not 0 <= offset < spec.array_task_count:
            return []
        job = self._jobs.get(job_id + offset)
        return [job] if job is not None and job.array_job_id == job_id and job.array_task_id == task else None

    def find(self, job_id: int, task: int | None) -> list[Job]:
        if task is not None:
            one = self._task_by_id(job_id, task)
            if one is not None:
                return one
        array = self._by_ids(job_id)
        if array is not None:
            if task is not None:
                return [job for job in array if job.array_task_id == task]
            if array:
                return array
            return [self._jobs[job_id]]
        if self._members is None:
            self._members = {}
            for job in self._jobs.values():
                if job.array_job_id is not None:
                    self._members.setdefault(job.array_job_id, []).append(job)
        array = self._members.get(job_id, [])
        if task is not None:
            return [job for job in array if job.array_task_id == task]
        if array:
            return list(array)
        direct = self._jobs.get(job_id)
        return [direct] if direct is not None else []
