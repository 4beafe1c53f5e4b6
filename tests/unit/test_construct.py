"""garrison/model/construct.py: building frozen, slotted dataclasses without their __init__ gives the very
objects __init__ would, and refuses the classes whose __init__ does more."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import pytest

from garrison.controller.sched.snapshot import PendingJob
from garrison.model.construct import constructor_without_init, replacer
from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState


def test_a_job_built_without_init_equals_one_built_with_it_positionally_and_by_keyword() -> None:
    spec = JobSpec(name="train", command=("x",), gpus=1)
    attempt = Attempt(job_id=7, attempt=0, allocation=Allocation(()), start_time=5.0)
    values = (7, spec, "ann", 1000, 1000, "team", "main", 60, 1.5, JobState.RUNNING, "r", 3, 6, 1, 5.0, None, None,
              (attempt,), 0)
    assert len(values) == len(fields(Job))
    new_job = constructor_without_init(Job)
    made = new_job(*values)
    assert type(made) is Job and made == Job(*values)
    assert isinstance(made, Job) and repr(made) == repr(Job(*values))
    with pytest.raises(AttributeError):
        made.state = JobState.PENDING  # type: ignore[misc]  # still frozen
    # Defaults as __init__'s: a pending job given only what has none.
    short = new_job(job_id=8, spec=spec, user="ann", uid=1, gid=1, account="a", partition="p", time_limit_s=60,
                    submit_time=0.0)
    assert short == Job(job_id=8, spec=spec, user="ann", uid=1, gid=1, account="a", partition="p", time_limit_s=60,
                        submit_time=0.0)
    with pytest.raises(TypeError):
        new_job(8, spec)  # missing arguments, as __init__ would say


def test_a_pending_view_built_without_init_equals_one_built_with_it() -> None:
    spec = JobSpec(name="train", command=("x",), gpus=1)
    new_view = constructor_without_init(PendingJob)
    assert new_view(job_id=1, spec=spec, partition="main", submit_time=2.0, user="ann") == \
        PendingJob(job_id=1, spec=spec, partition="main", submit_time=2.0, user="ann")


@dataclass(frozen=True, slots=True)
class _Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("negative")


@dataclass(frozen=True, slots=True)
class _Factory:
    items: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _NoSlots:
    value: int


@dataclass(frozen=True, slots=True)
class _Base:
    value: int


@dataclass(frozen=True, slots=True)
class _Derived(_Base):
    more: int = 0


@pytest.mark.parametrize("cls", [_Checked, _Factory, _NoSlots, _Derived])
def test_classes_whose_init_does_more_are_refused(cls: type) -> None:
    with pytest.raises(TypeError):
        constructor_without_init(cls)


def test_a_replacer_copies_every_other_field_as_replace_does() -> None:
    spec = JobSpec(name="train", command=("x",), gpus=1)
    job = Job(job_id=8, spec=spec, user="ann", uid=1, gid=1, account="a", partition="p", time_limit_s=60,
              submit_time=0.5, priority=4, array_job_id=7, array_task_id=1)
    with_reason = replacer(Job, "reason")
    changed = with_reason(job, "Priority")
    assert changed == replace(job, reason="Priority") and changed is not job and job.reason == ""
    assert type(changed) is Job
    assert changed.spec is spec  # shared, not copied
    with pytest.raises(TypeError):
        replacer(Job, "no_such_field")
    with pytest.raises(TypeError):
        replacer(_Checked, "value")
