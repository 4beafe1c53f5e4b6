"""Job dependencies (gsub -d): the syntax, and when a dependency holds, may hold later, or never will."""

from __future__ import annotations

from dataclasses import replace

import pytest

from garrison.controller.dependency import (
    NEVER,
    SATISFIED,
    WAITING,
    Dependency,
    DependencyList,
    dependency_reason,
    format_dependency,
    parse_dependency,
)
from garrison.model.domain import Job, JobSpec, JobState


def test_lists_of_types_and_jobs() -> None:
    items = parse_dependency("afterok:12:13, AfterAny:14_2")
    assert items == DependencyList((Dependency("afterok", ("12", "13")), Dependency("afterany", ("14_2",))))
    assert format_dependency(items) == "afterok:12:13,afterany:14_2"
    either = parse_dependency("afterok:12?afternotok:13")
    assert either == DependencyList((Dependency("afterok", ("12",)), Dependency("afternotok", ("13",))), any_of=True)
    assert format_dependency(either) == "afterok:12?afternotok:13"


@pytest.mark.parametrize(("text", "message"), [
    ("afterok", "--dependency: afterok names no job"),
    ("before:12", "--dependency: unknown type 'before' in 'before:12': use after, afterany, afterok, afternotok, "
                  "aftercorr, singleton"),
    ("afterok:12:x", "--dependency: 'x' is not a job id (12, or 12_3 for an array task)"),
    ("afterok:12?afterany:13,after:14", "--dependency: use ',' (all of) or '?' (any of), not both"),
    ("afterok:" + ":".join(str(i) for i in range(101)), "--dependency: at most 100 jobs, got 101"),
    ("12", "--dependency: unknown type '12' in '12': use after, afterany, afterok, afternotok, aftercorr, "
           "singleton"),
    ("after:12+", "--dependency: '12+': the delay after '+' is a whole number of minutes"),
    ("after:12+1.5", "--dependency: '12+1.5': the delay after '+' is a whole number of minutes"),
    ("after:12+-3", "--dependency: '12+-3': the delay after '+' is a whole number of minutes"),
    ("after:+3", "--dependency: '' is not a job id (12, or 12_3 for an array task)"),
])
def test_bad_dependencies_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_dependency(text)
    assert str(caught.value) == message


def job(job_id: int, state: JobState, array_job_id: int | None = None) -> Job:
    return Job(job_id=job_id, spec=JobSpec(name="j", command=("true",)), user="u", uid=1, gid=1,
               account="default", partition="main", time_limit_s=60, submit_time=0.0, state=state,
               array_job_id=array_job_id, array_task_id=job_id if array_job_id is not None else None)


STATES = [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED]
EXPECTED = {  # kind -> reason for a job in each of STATES
    "after": [WAITING, SATISFIED, SATISFIED, SATISFIED, SATISFIED],
    "afterany": [WAITING, WAITING, SATISFIED, SATISFIED, SATISFIED],
    "afterok": [WAITING, WAITING, SATISFIED, NEVER, NEVER],
    "afternotok": [WAITING, WAITING, NEVER, SATISFIED, SATISFIED],
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_type_against_each_state(kind: str) -> None:
    for state, expected in zip(STATES, EXPECTED[kind], strict=True):
        reason = dependency_reason(parse_dependency(f"{kind}:7"), lambda ref, s=state: [job(7, s)])
        assert reason == expected, (kind, state)


def test_every_item_and_every_array_task_must_hold() -> None:
    tasks = [job(10, JobState.COMPLETED, 10), job(11, JobState.RUNNING, 10)]
    known = {"10": tasks, "10_1": tasks[:1], "20": [job(20, JobState.COMPLETED)]}
    assert dependency_reason(parse_dependency("afterok:10"), known.__getitem__) == WAITING
    assert dependency_reason(parse_dependency("afterok:10_1,afterany:20"), known.__getitem__) == SATISFIED
    finished = {**known, "10": [tasks[0], replace(tasks[1], state=JobState.FAILED)]}
    assert dependency_reason(parse_dependency("afterany:20,afterok:10"), finished.__getitem__) == NEVER


def test_any_of_holds_when_one_item_does_and_never_when_none_can() -> None:
    known = {"1": [job(1, JobState.FAILED)], "2": [job(2, JobState.RUNNING)], "3": [job(3, JobState.COMPLETED)]}
    assert dependency_reason(parse_dependency("afterok:1?afterok:2"), known.__getitem__) == WAITING
    assert dependency_reason(parse_dependency("afterok:1?afterok:3"), known.__getitem__) == SATISFIED
    assert dependency_reason(parse_dependency("afterok:1?afternotok:3"), known.__getitem__) == NEVER


def test_singleton_waits_while_a_namesake_runs() -> None:
    dependencies = parse_dependency("singleton,afterany:4")
    assert dependencies.singleton and format_dependency(dependencies) == "singleton,afterany:4"
    ended = {"4": [job(4, JobState.COMPLETED)]}
    assert dependency_reason(dependencies, ended.__getitem__, namesake_running=True) == WAITING
    assert dependency_reason(dependencies, ended.__getitem__, namesake_running=False) == SATISFIED
    with pytest.raises(ValueError, match="singleton names no job"):
        parse_dependency("singleton:4")


def test_a_forgotten_job_has_ended_but_how_is_not_known() -> None:
    def forgotten(ref: str) -> list[Job]:
        return []

    assert dependency_reason(parse_dependency("after:5,afterany:6"), forgotten) == SATISFIED
    assert dependency_reason(parse_dependency("afterok:5"), forgotten) == NEVER
    assert dependency_reason(parse_dependency("afternotok:5"), forgotten) == NEVER


def test_aftercorr_waits_for_the_task_with_the_same_index() -> None:
    """sbatch -d aftercorr:A for an array B: task i of B waits for task i of A to complete with exit code 0;
    where A has no task i, or the dependent job is no array task, for all of A (afterok)."""
    from garrison.controller.dependency import typed_dependencies
    from garrison.controller.sched.dependencies import DependencyStatus, dependency_status

    tasks = [replace(job(n, state, 10), array_task_id=n - 10) for n, state in
             ((11, JobState.COMPLETED), (12, JobState.FAILED), (13, JobState.RUNNING))]
    looked_up: list[str] = []

    def known(ref: str) -> list[Job]:  # what the controller's JobLookup gives: a task by REF_INDEX, or them all
        looked_up.append(ref)
        head, _, index = ref.partition("_")
        return [t for t in tasks if not index or t.array_task_id == int(index)] if head == "10" else []

    dependencies = parse_dependency("aftercorr:10")
    assert format_dependency(dependencies) == "aftercorr:10"

    def status(array_task: int | None) -> DependencyStatus:
        return dependency_status(typed_dependencies(dependencies, known, array_task=array_task), False, 0.0)

    assert status(1) == DependencyStatus.SATISFIED  # A_1 completed
    assert looked_up == ["10_1"]  # the task itself, not the whole array scanned for it
    assert status(2) == DependencyStatus.NEVER  # A_2 failed
    assert status(3) == DependencyStatus.WAITING  # A_3 still runs
    assert status(7) == DependencyStatus.NEVER  # no A_7: all of A, and A_2 failed
    assert status(None) == DependencyStatus.NEVER
    plain = {"10": [job(10, JobState.COMPLETED)], "10_4": []}  # a job that is no array: afterok on it
    assert dependency_status(typed_dependencies(dependencies, plain.__getitem__, array_task=4), False, 0.0) == \
        DependencyStatus.SATISFIED


def test_after_with_a_delay_holds_minutes_after_the_jobs_started() -> None:
    dependencies = parse_dependency("after:12+5:13")
    assert dependencies.items == (Dependency("after", ("12", "13"), (5, 0)),)
    assert format_dependency(dependencies) == "after:12+5:13"
    assert format_dependency(parse_dependency("afterok:12+0")) == "afterok:12"  # +0 is no delay
    started = {"12": [replace(job(12, JobState.RUNNING), start_time=1000.0)], "13": [job(13, JobState.COMPLETED)]}
    assert dependency_reason(dependencies, started.__getitem__, now=1000.0 + 299) == WAITING
    assert dependency_reason(dependencies, started.__getitem__, now=1000.0 + 300) == SATISFIED
    # A job cancelled before it started counts from its end, as Slurm's start time is then.
    cancelled = {**started, "12": [replace(job(12, JobState.CANCELLED), end_time=2000.0)]}
    assert dependency_reason(dependencies, cancelled.__getitem__, now=2000.0 + 299) == WAITING
    assert dependency_reason(dependencies, cancelled.__getitem__, now=2000.0 + 300) == SATISFIED
    pending = {**started, "12": [job(12, JobState.PENDING)]}
    assert dependency_reason(dependencies, pending.__getitem__, now=10**9) == WAITING
    # An array's reference counts from the last of its tasks to start; a forgotten job holds at once.
    array = {"12": [replace(job(1, JobState.RUNNING, 12), start_time=1000.0),
                    replace(job(2, JobState.COMPLETED, 12), start_time=1100.0)], "13": []}
    assert dependency_reason(dependencies, array.__getitem__, now=1100.0 + 299) == WAITING
    assert dependency_reason(dependencies, array.__getitem__, now=1100.0 + 300) == SATISFIED
    assert dependency_reason(parse_dependency("after:12+5"), {"12": []}.__getitem__, now=0.0) == SATISFIED
    # As in Slurm, a delay on another type is taken and means nothing.
    ended = {"12": [replace(job(12, JobState.COMPLETED), start_time=1000.0)]}
    assert dependency_reason(parse_dependency("afterok:12+60"), ended.__getitem__, now=1001.0) == SATISFIED


def test_the_core_wakes_when_an_after_delay_ends() -> None:
    from garrison.controller.dependency import typed_dependencies
    from garrison.controller.sched.dependencies import delay_ends

    started = {"12": [replace(job(12, JobState.RUNNING), start_time=1000.0)],
               "13": [replace(job(13, JobState.RUNNING), start_time=1200.0)]}
    typed = typed_dependencies(parse_dependency("after:12+5:13+1"), started.__getitem__)
    assert delay_ends(typed, 0.0) == 1260.0
    assert delay_ends(typed, 1260.0) == 1300.0
    assert delay_ends(typed, 1300.0) is None
