"""The ranked queue kept from one cycle to the next (sched/queue.py, issue 23) plans exactly what a cycle
computed from scratch plans: the same order, priorities, starts and reasons, over random sequences of
submissions, starts, holds, releases, priority changes, usage and clock moves. And priorities recomputed
as of a context stand until its interval has passed, then follow the clock and usage again."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, node, pending, running

from garrison.controller.sched import queue
from garrison.controller.sched.cycle import Plan, SchedulerConfig, schedule
from garrison.controller.sched.presets import preset
from garrison.controller.sched.priority import PriorityContext, PriorityWeights
from garrison.controller.sched.snapshot import PendingJob, RunningJob, Snapshot, UsageView
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos

INTERVAL_S = 30.0
ACCOUNTS = ("default", "teamA", "teamB")


def accounting(quotas: bool) -> Accounting:
    base = Accounting(
        accounts=tuple(Account(a) for a in ACCOUNTS),
        qos=(Qos("normal", 10), Qos("high", 20), Qos("short", 5, max_time_s=1800)),
        partitions=(PartitionDef("main", default=True, max_time_s=7200),),
        default_qos="normal",
    )
    if quotas:
        base = base.with_limits("account", "teamA", Limits(max_gpus=4))
    return base


def random_job(rng: random.Random, job_id: int, now: float) -> PendingJob:
    kind = rng.random()
    extra: dict[str, object] = {}
    if kind < 0.05:
        extra["begin_time"] = now + rng.choice((60, 600))
    elif kind < 0.1:
        extra["array_max_running"] = 1
    return pending(
        job_id, submit=now - rng.uniform(0, 86400), gpus=rng.choice((1, 1, 2, 8)),
        account=rng.choice(ACCOUNTS), user=f"u{rng.randrange(6)}", qos=rng.choice(("", "high", "short")),
        limit=rng.choice((600, 1200, 3600, 9000)), priority=rng.choice((0, 0, 0, 50)),
        held=rng.random() < 0.05, array_job_id=rng.choice((None, None, 7)) if "array_max_running" not in extra else 7,
        **extra,
    )


def from_scratch(snapshot: Snapshot, now: float, config: SchedulerConfig) -> Plan:
    """The plan of a cycle that keeps nothing from earlier cycles."""
    kept = list(queue._QUEUES)
    queue._QUEUES.clear()
    try:
        return schedule(snapshot, now, config)
    finally:
        queue._QUEUES[:] = kept


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("quotas", [False, True])
def test_kept_queue_plans_what_a_fresh_one_does(seed: int, quotas: bool) -> None:
    rng = random.Random(seed)
    config = replace(preset("garrison"), max_job_test=rng.choice((2, 5, 50)), reservations=rng.choice((0, 2)),
                     priority_interval_s=INTERVAL_S)
    if seed % 2:  # the small-job factor, part of a job's static priority, kept across cycles like the rest
        config = replace(config, weights=replace(config.weights, small_job=30_000))
    acct = accounting(quotas)
    nodes = (busy(node("a"), running(900, {"a": tuple(range(6))})), node("b", free={0, 1}))
    runs: tuple[RunningJob, ...] = (running(900, {"a": tuple(range(6))}, account="teamA"),)
    jobs = {i: random_job(rng, i, NOW) for i in range(1, 400)}
    next_id = 400
    usage = {("teamA", "u1"): UsageView(5000.0, 100.0)}
    now, last = NOW, None
    queue._QUEUES.clear()
    for _ in range(25):
        for _ in range(rng.choice((0, 1, 3, 300))):  # submissions, a few or a burst
            jobs[next_id] = random_job(rng, next_id, now)
            next_id += 1
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), rng.choice((0, 2, 300)))):  # cancels
            del jobs[job_id]
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), 3)):  # holds, releases, priority changes
            job = jobs[job_id]
            jobs[job_id] = replace(job, held=not job.held) if rng.random() < 0.5 else replace(job, priority=rng.randrange(100))
        if rng.random() < 0.3:
            usage = {**usage, ("teamB", f"u{rng.randrange(6)}"): UsageView(rng.uniform(0, 9000), 0.0)}
        now += rng.choice((1.0, 5.0, 31.0))
        snapshot = Snapshot(nodes=nodes, pending=tuple(jobs.values()), running=runs, accounting=acct, usage=usage,
                            pricing=last.pricing if last is not None else None)
        plan = schedule(snapshot, now, config)
        assert plan == from_scratch(snapshot, now, config)
        assert set(plan.waiting) | {s.job_id for s in plan.starts} == set(jobs)
        for start in plan.starts:  # started jobs leave the queue
            del jobs[start.job_id]
        last = plan


def test_priorities_stand_until_the_interval_then_follow_the_clock() -> None:
    config = replace(preset("garrison"), priority_interval_s=INTERVAL_S)
    jobs = (pending(1, submit=NOW - 3600, gpus=1), pending(2, submit=NOW - 60, gpus=1))
    snapshot = Snapshot(nodes=(busy(node("a"), running(9, {"a": tuple(range(8))})),), pending=jobs,
                        running=(running(9, {"a": tuple(range(8))}),))
    first = schedule(snapshot, NOW, config)
    assert first.reprice_at == NOW + INTERVAL_S
    # Within the interval, the same priorities: priced as of the first plan's context.
    later = schedule(replace(snapshot, pricing=first.pricing), NOW + INTERVAL_S - 1, config)
    assert later.priorities == first.priorities and later.pricing is first.pricing
    # A job submitted meanwhile is priced as of that context too.
    newcomer = pending(3, submit=NOW + 10, gpus=1)
    with_new = schedule(replace(snapshot, pending=(*jobs, newcomer), pricing=first.pricing), NOW + 20, config)
    assert with_new.priorities[3] == schedule(replace(snapshot, pending=(*jobs, newcomer)), NOW, config).priorities[3]
    # Once the interval has passed, priced as of the clock again: the jobs have aged.
    aged = schedule(replace(snapshot, pricing=first.pricing), NOW + 86400, config)
    assert aged.pricing is not first.pricing and aged.priorities[1] > first.priorities[1]
    # Without an interval (gsim's policies), every cycle prices as of its own clock.
    plain = replace(config, priority_interval_s=0.0)
    assert schedule(replace(snapshot, pricing=first.pricing), NOW + 3600, plain).priorities[2] > first.priorities[2]


def test_a_changed_accounting_reprices_at_once() -> None:
    config = replace(preset("garrison"), priority_interval_s=INTERVAL_S)
    acct = accounting(False)
    jobs = (pending(1, gpus=1, qos="normal"), pending(2, gpus=1, qos="high"))
    snapshot = Snapshot(nodes=(node("a", free=set()),), pending=jobs, accounting=acct)
    first = schedule(snapshot, NOW, config)
    assert first.order == (2, 1)
    swapped = replace(acct, qos=(Qos("normal", 30), Qos("high", 20), Qos("short", 5, max_time_s=1800)))
    second = schedule(replace(snapshot, accounting=swapped, pricing=first.pricing), NOW + 1, config)
    assert second.order == (1, 2) and second.pricing is not first.pricing


# Weights that read neither the clock nor usage: a new context each cycle prices every job as the last did.
TIMELESS = PriorityWeights(age=0, fair_share=0, qos=2000, job_size=1000, partition=1000, time_limit=30_000,
                           small_job=3000)


@pytest.mark.parametrize("seed", range(4))
def test_timeless_weights_patch_the_kept_queue_and_plan_what_a_fresh_one_does(seed: int) -> None:
    # fifo-easy (every weight 0) and a queue ordered by the factors that depend on the job alone: priced
    # every cycle (no interval), yet the kept queue is patched with the changed jobs instead of repriced,
    # unless the accounting changes what a job is worth.
    rng = random.Random(seed)
    config = replace(preset("fifo-easy"), max_job_test=rng.choice((5, 50)))
    if seed % 2:
        config = replace(config, weights=TIMELESS)
    acct = accounting(False)
    nodes = (busy(node("a"), running(900, {"a": tuple(range(6))})), node("b", free={0, 1}))
    runs: tuple[RunningJob, ...] = (running(900, {"a": tuple(range(6))}, account="teamA"),)
    jobs = {i: random_job(rng, i, NOW) for i in range(1, 300)}
    next_id = 300
    now = NOW
    patched = 0
    queue._QUEUES.clear()
    for _ in range(25):
        for _ in range(rng.choice((0, 1, 3, 300))):
            jobs[next_id] = random_job(rng, next_id, now)
            next_id += 1
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), rng.choice((0, 2, 300)))):
            del jobs[job_id]
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), 3)):
            job = jobs[job_id]
            jobs[job_id] = replace(job, held=not job.held) if rng.random() < 0.5 else replace(job, priority=rng.randrange(100))
        if rng.random() < 0.2:  # QoS priorities swapped: what a job is worth changes, so the queue is repriced
            acct = replace(acct, qos=tuple(Qos(q.name, rng.randrange(40), max_time_s=q.max_time_s) for q in acct.qos))
        now += rng.choice((1.0, 5.0, 3600.0))
        snapshot = Snapshot(nodes=nodes, pending=tuple(jobs.values()), running=runs, accounting=acct)
        plan = schedule(snapshot, now, config)
        assert plan == from_scratch(snapshot, now, config)
        patched += queue._QUEUES[-1].priced_since > 0
        for start in plan.starts:
            del jobs[start.job_id]
    assert patched  # some cycles patched the kept queue rather than repricing it


def test_only_contexts_that_ignore_clock_and_usage_price_alike() -> None:
    acct = accounting(False)
    snapshot = Snapshot(nodes=(node("a"),), pending=(pending(1, submit=NOW - 60, gpus=1),), accounting=acct,
                        usage={("default", "u"): UsageView(5000.0, 100.0)})
    earlier = PriorityContext(snapshot, NOW, TIMELESS)
    assert PriorityContext(snapshot, NOW + 86400, TIMELESS).prices_like(earlier)
    assert not earlier.prices_like(None)
    garrison = preset("garrison").weights  # age, fair share, overdue: prices move with the clock and usage
    assert not PriorityContext(snapshot, NOW + 60, garrison).prices_like(PriorityContext(snapshot, NOW, garrison))
    assert not PriorityContext(snapshot, NOW, replace(TIMELESS, qos=1)).prices_like(earlier)
    swapped = replace(acct, qos=(Qos("normal", 30), Qos("high", 20), Qos("short", 5, max_time_s=1800)))
    assert not PriorityContext(replace(snapshot, accounting=swapped), NOW, TIMELESS).prices_like(earlier)
    bigger = replace(snapshot, nodes=(node("a"), node("b")))  # the size factor is over the cluster's GPUs
    assert not PriorityContext(bigger, NOW, TIMELESS).prices_like(earlier)


def test_look_alikes_behind_the_bounded_work_share_one_shape_object() -> None:
    # The kept queue remembers each job's shape from cycle to cycle; look-alikes keep one tuple between them,
    # not one each (50,000 pending jobs: ~4 MB), and a shape whose last job left is forgotten.
    queue._QUEUES.clear()
    full = busy(node("a"), running(99, {"a": tuple(range(8))}))
    jobs = [pending(job_id, gpus=1, limit=600) for job_id in range(1, 6)]
    config = replace(preset("garrison"), max_job_test=1, reservations=0)
    snapshot = Snapshot(nodes=(full,), pending=tuple(jobs), running=(running(99, {"a": tuple(range(8))}),),
                        accounting=accounting(False), usage={})
    schedule(snapshot, NOW, config)
    kept = queue._QUEUES[-1]
    shapes = {id(shape) for shape in kept.shape_of.values()}
    assert len(kept.shape_of) >= 4 and len(shapes) == 1
    schedule(replace(snapshot, pending=(pending(9, gpus=2, limit=600),)), NOW + 1, config)
    assert queue._QUEUES[-1] is kept
    assert set(kept.shape_objects) == set(kept.members) and len(kept.members) <= 1
