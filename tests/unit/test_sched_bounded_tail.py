"""The jobs behind a cycle's bounded work (issue 23): once max_job_test placements have failed, the rest of
the queue is not placed, and each of its jobs still gets the reason the gates give it (held, begin time,
partition and QoS time limits, quotas, array limits, else Priority), though the gates run only once per
shape of job. A deep queue must not turn every reason into Priority, nor give look-alikes each other's."""

from __future__ import annotations

from dataclasses import replace

from sched_helpers import NOW, busy, node, pending, running

from garrison.controller.sched import queue
from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.dependencies import DependencyItem, DependencyKind, JobDependencies
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos
from garrison.model.domain import JobState

BOUNDED = replace(preset("garrison"), max_job_test=1, reservations=0)
FULL = [busy(node("a"), running(99, {"a": tuple(range(8))}))]


def accounting(**changes: object) -> Accounting:
    base = Accounting(
        accounts=(Account("default"), Account("capped")),
        qos=(Qos("normal", 10), Qos("short", 5, max_time_s=1800)),
        partitions=(PartitionDef("main", default=True, max_time_s=7200),),
        default_qos="normal",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def plan_for(jobs: list, acct: Accounting | None = None):  # type: ignore[no-untyped-def,type-arg]
    snapshot = Snapshot(nodes=tuple(FULL), pending=tuple(jobs), running=(running(99, {"a": tuple(range(8))}),),
                        accounting=acct or accounting(), usage={})
    return schedule(snapshot, NOW, BOUNDED)


def test_the_tail_keeps_each_jobs_own_reason() -> None:
    jobs = [
        pending(1, gpus=1, priority=10**6),  # first in the queue: fails placement, which ends the bounded work
        pending(2, gpus=1, held=True),
        pending(3, gpus=1, begin_time=NOW + 600),
        pending(4, gpus=1, begin_time=NOW + 300),
        pending(5, gpus=1, limit=9000),  # over the partition's maximum
        pending(6, gpus=1, limit=3000, qos="short"),  # over the QoS's maximum
        pending(7, gpus=1, limit=1000, qos="short"),  # the same shape but for a limit within both maximums
        pending(8, gpus=1, limit=3500, qos="short"),  # a look-alike of 6 with another limit, over it too
        pending(9, gpus=1, array_job_id=9, array_max_running=0),
        pending(10, gpus=1),
    ]
    plan = plan_for(jobs)
    assert plan.starts == ()
    assert plan.waiting[2] == Reason.HELD
    assert plan.waiting[3] == plan.waiting[4] == Reason.BEGIN_TIME
    assert plan.wake_at == NOW + 300  # the earliest begin time, tail or not: the clock alone changes the plan then
    assert plan.waiting[5] == Reason.PARTITION_TIME_LIMIT
    assert plan.waiting[6] == plan.waiting[8] == Reason.QOS_TIME_LIMIT
    assert plan.waiting[7] == Reason.PRIORITY
    assert plan.waiting[9] == Reason.ARRAY_LIMIT
    assert plan.waiting[10] == Reason.PRIORITY
    assert set(plan.waiting) == {job.job_id for job in jobs}


def test_the_tail_tells_users_apart_where_quotas_are_set() -> None:
    acct = accounting(account_limits=(("capped", Limits(max_gpus=8)),))
    jobs = [
        pending(1, gpus=1, priority=10**6),
        pending(2, gpus=1, account="capped", user="ann"),
        pending(3, gpus=1, account="default", user="bob"),
        pending(4, gpus=1, account="capped", user="ann"),
    ]
    running_capped = running(99, {"a": tuple(range(8))}, account="capped", user="ann")
    snapshot = Snapshot(nodes=tuple(FULL), pending=tuple(jobs), running=(running_capped,), accounting=acct, usage={})
    plan = schedule(snapshot, NOW, BOUNDED)
    assert plan.waiting[2] == plan.waiting[4] != Reason.PRIORITY  # the account's GPU quota is used up
    assert plan.waiting[3] == Reason.PRIORITY


def test_an_arrays_dependent_and_limited_tasks_share_a_shape_and_keep_their_reasons() -> None:
    # Behind the bounded work, the tasks of an array that wait on one dependency, or on their array's limit,
    # are one shape each way (one gate check per cycle, not one per task), and get the same reasons as the
    # gates give each of them; an equal-looking dependency that holds is another shape.
    waiting = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.RUNNING,),)),))
    satisfied = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.COMPLETED,),)),))
    jobs = [pending(1, gpus=1, priority=10**6)]
    jobs += [replace(pending(job_id, gpus=1, array_job_id=10), dependencies=waiting) for job_id in range(10, 20)]
    jobs += [pending(job_id, gpus=1, array_job_id=20, array_max_running=0) for job_id in range(20, 30)]
    jobs += [replace(pending(job_id, gpus=1), dependencies=satisfied) for job_id in range(30, 35)]
    queue._QUEUES.clear()
    plan = plan_for(jobs)
    assert {plan.waiting[job_id] for job_id in range(10, 20)} == {Reason.DEPENDENCY}
    assert {plan.waiting[job_id] for job_id in range(20, 30)} == {Reason.ARRAY_LIMIT}
    assert {plan.waiting[job_id] for job_id in range(30, 35)} == {Reason.PRIORITY}
    assert len(queue._QUEUES[-1].members) == 4  # the first job's, and one for each group of ten or five
