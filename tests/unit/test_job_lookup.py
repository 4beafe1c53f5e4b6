"""JobLookup answers an array's or a job's reference by looking up ids (no pass over the whole queue) exactly
as the full index of array tasks would, including once the array's first task is forgotten from memory."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from garrison.controller.engine import with_array_summary
from garrison.model.domain import Job, JobSpec
from garrison.model.jobrefs import JobLookup


def job(job_id: int, array: int | None = None, task: int | None = None, count: int = 0) -> Job:
    return Job(job_id=job_id, spec=JobSpec(name="x", command=(), array_task_count=count), user="u", uid=1, gid=1,
               account="a", partition="p", time_limit_s=1, submit_time=0.0, array_job_id=array, array_task_id=task)


def by_full_index(jobs: dict[int, Job], job_id: int, task: int | None) -> list[int]:
    members: dict[int, list[Job]] = {}
    for one in jobs.values():
        if one.array_job_id is not None:
            members.setdefault(one.array_job_id, []).append(one)
    array = members.get(job_id, [])
    if task is not None:
        return [one.job_id for one in array if one.array_task_id == task]
    if array:
        return [one.job_id for one in array]
    return [job_id] if job_id in jobs else []


QUEUE = {1: job(1), 2: job(2, 2, 0, 3), 3: job(3, 2, 1, 3), 4: job(4, 2, 5, 3), 5: job(5), 6: job(6, 6, 9, 1)}


@pytest.mark.parametrize("forgotten", [(), (2,), (3,), (2, 3, 4)])
def test_lookups_by_id_agree_with_the_full_index(forgotten: tuple[int, ...]) -> None:
    jobs = {job_id: one for job_id, one in QUEUE.items() if job_id not in forgotten}
    for job_id in range(0, 9):
        for task in (None, 0, 1, 5, 9):
            found = [one.job_id for one in JobLookup(jobs).find(job_id, task)]
            assert found == by_full_index(jobs, job_id, task), (job_id, task)


@settings(max_examples=300, deadline=None, database=None)
@given(
    indices=st.one_of(
        st.builds(lambda lo, step, n: [lo + step * i for i in range(n)], st.integers(0, 20), st.integers(1, 4),
                  st.integers(1, 12)),
        st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True),
    ),
    forgotten=st.sets(st.integers(0, 11), max_size=4),
    asked=st.lists(st.tuples(st.integers(95, 115), st.none() | st.integers(-2, 50)), min_size=1, max_size=10),
)
def test_a_task_found_by_arithmetic_is_the_task_the_full_index_finds(
    indices: list[int], forgotten: set[int], asked: list[tuple[int, int | None]]
) -> None:
    """An array's tasks take ids 100, 101, ... in the order their indices were given (the controller's
    way); a task of a whole arithmetic range is found by its id without the full index, anything else by
    the index, and both agree on every reference, with tasks forgotten from memory too."""
    spec = with_array_summary(JobSpec(name="x", command=()), indices)
    jobs = {100 + i: replace(job(100 + i, 100, index), spec=spec) for i, index in enumerate(indices) if i not in forgotten}
    jobs[99] = job(99)
    for job_id, task in asked:
        found = [one.job_id for one in JobLookup(jobs).find(job_id, task)]
        assert found == by_full_index(jobs, job_id, task), (job_id, task)
