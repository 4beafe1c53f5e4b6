"""The scheduling policy: multifactor priority, fair share, quotas, backfill, reasons, preemption, presets."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, node, pending, running

from garrison.config import PRESET_TIME_LIMIT_LONG_S, PRESET_TIME_LIMIT_SHORT_S, ConfigError
from garrison.config.loading import parse_config
from garrison.controller.sched.cycle import Reason, SchedulerConfig, schedule
from garrison.controller.sched.dependencies import DependencyItem, DependencyKind, JobDependencies
from garrison.controller.sched.fairshare import accrued, decay, fair_share_factors, normalised_shares
from garrison.controller.sched.presets import policy_presets, preset
from garrison.controller.sched.priority import PriorityContext, PriorityWeights, time_limit_factor
from garrison.controller.sched.snapshot import NodeView, RunningJob, Snapshot, UsageView
from garrison.controller.sched_settings import scheduler_config
from garrison.model.accounts import Account, Accounting, Limits, PartitionDef, Qos, User
from garrison.model.domain import Allocation, JobState, NodeAllocation

GARRISON = preset("garrison")


def accounting(**changes: object) -> Accounting:
    base = Accounting(
        accounts=(Account("default"), Account("org"), Account("teamA", "org"), Account("teamB", "org")),
        qos=(Qos("low", 0), Qos("normal", 10), Qos("high", 20, preempts=("low",), grace_s=30)),
        partitions=(PartitionDef("main", default=True, max_time_s=86400),),
        default_qos="normal",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def snap(nodes: list, jobs: list, running_jobs: list = (), acct: Accounting | None = None,  # type: ignore[assignment,type-arg]
         usage: dict | None = None) -> Snapshot:  # type: ignore[type-arg]
    return Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(running_jobs),
                    accounting=acct or accounting(), usage=usage or {})


# -- fair share and priority ---------------------------------------------------------------------------------


def test_fair_share_factor_is_half_at_exactly_the_share() -> None:
    acct = accounting()
    assocs = {("teamA", "u"), ("teamB", "v")}
    shares = normalised_shares(acct, assocs)
    assert shares[("teamA", "u")] == pytest.approx(shares[("teamB", "v")])
    factors = fair_share_factors(acct, assocs, {("teamA", "u"): 75.0, ("teamB", "v"): 25.0})
    assert factors[("teamB", "v")] > factors[("teamA", "u")]
    # Both accounts at their exact share of the usage within org (org has 1/2 of the cluster next to default):
    even = fair_share_factors(acct, assocs, {("teamA", "u"): 50.0, ("teamB", "v"): 50.0})
    assert even[("teamA", "u")] == pytest.approx(2 ** -(0.5 / shares[("teamA", "u")]))


def test_shares_divide_each_level_of_the_tree() -> None:
    acct = accounting(accounts=(Account("org", shares=3), Account("other"), Account("teamA", "org", shares=1),
                                Account("teamB", "org", shares=2)),
                      users=(User("u", "teamA", (("teamA", 1),)), User("w", "teamA", (("teamA", 3),))))
    shares = normalised_shares(acct, {("teamA", "u"), ("teamA", "w"), ("teamB", "v"), ("other", "x")})
    assert shares[("other", "x")] == pytest.approx(1 / 4)
    assert shares[("teamB", "v")] == pytest.approx(3 / 4 * 2 / 3)
    assert shares[("teamA", "u")] == pytest.approx(3 / 4 * 1 / 3 * 1 / 4)
    assert shares[("teamA", "w")] == pytest.approx(3 / 4 * 1 / 3 * 3 / 4)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_decay_halves_per_half_life_and_accrual_does_not_depend_on_the_step() -> None:
    assert decay(100.0, 60.0, 60.0) == pytest.approx(50.0)
    one_step = accrued(8, 600.0, 300.0)
    many = 0.0
    for _ in range(60):
        many = decay(many, 10.0, 300.0) + accrued(8, 10.0, 300.0)
    assert many == pytest.approx(one_step)


def test_the_account_under_its_share_goes_first() -> None:
    nodes = [node("a", gpus=1)]
    jobs = [pending(1, account="teamA", gpus=1), pending(2, account="teamB", gpus=1)]
    usage = {("teamA", "u"): UsageView(decayed_gpu_s=3600.0)}
    plan = schedule(snap(nodes, jobs, usage=usage), NOW, GARRISON)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.order == (2, 1)
    fifo = schedule(snap(nodes, jobs, usage=usage), NOW, preset("fifo"))
    assert [s.job_id for s in fifo.starts] == [1]


def test_qos_partition_size_and_age_raise_priority() -> None:
    acct = accounting(partitions=(PartitionDef("main", default=True), PartitionDef("fast", priority=10)))
    nodes = [node("a", gpus=1, partitions=frozenset({"main", "fast"}))]
    weights = PriorityWeights(age=1000, fair_share=0, qos=2000, job_size=1000, partition=1000, max_age_s=1000)
    config = replace(GARRISON, weights=weights)
    jobs = [
        pending(1, submit=NOW - 500, gpus=1),  # age 0.5 -> 500
        pending(2, submit=NOW, qos="high", gpus=1),  # qos 1.0 -> 2000
        pending(3, submit=NOW, partition="fast", gpus=1),  # partition 1.0 -> 1000, qos normal 0.5 -> 1000
        pending(4, submit=NOW, gpus=1, priority=5000),  # an admin's adjustment
    ]
    plan = schedule(snap(nodes, jobs, acct=acct), NOW, config)
    assert plan.priorities[1] == 500 + 1000 + 1000 // 1  # age + normal QoS + size (1 of 1 GPU)
    assert plan.order == (4, 2, 3, 1)


def test_nice_lowers_priority_and_a_negative_nice_raises_it() -> None:
    weights = PriorityWeights(age=1000, fair_share=0, qos=0, job_size=0, partition=0, max_age_s=1000)
    config = replace(GARRISON, weights=weights)
    jobs = [pending(1, submit=NOW - 500, gpus=1, nice=400), pending(2, submit=NOW - 200, gpus=1),
            pending(3, submit=NOW, gpus=1, nice=-250, priority=10)]
    snapshot = snap([node("a", gpus=1)], jobs)
    plan = schedule(snapshot, NOW, config)
    assert plan.priorities == {1: 500 - 400, 2: 200, 3: 250 + 10}
    assert plan.order == (3, 2, 1)
    pricing = PriorityContext(snapshot, NOW, weights)
    assert [(pricing.factors(j).nice, pricing.factors(j).total) for j in jobs] == [(400, 100), (0, 200), (-250, 260)]


def test_time_limit_factor_is_log_linear_between_the_bounds() -> None:
    short, long = 3600.0, 7 * 86400.0
    assert time_limit_factor(60, short, long) == 1.0 and time_limit_factor(short, short, long) == 1.0
    assert time_limit_factor(long, short, long) == 0.0 and time_limit_factor(30 * 86400, short, long) == 0.0
    assert time_limit_factor(4 * 3600, short, long) == pytest.approx(0.7295, abs=1e-4)
    assert time_limit_factor(24 * 3600, short, long) == pytest.approx(0.3798, abs=1e-4)
    # The geometric midpoint of the bounds scores one half.
    assert time_limit_factor((short * long) ** 0.5, short, long) == pytest.approx(0.5)


def test_a_shorter_time_limit_goes_first_until_the_longer_job_has_aged_past_its_head_start() -> None:
    weights = PriorityWeights(age=30_000, max_age_s=30 * 86400, fair_share=0, qos=0, job_size=0, partition=0,
                              time_limit=30_000)  # age: 1,000 a day; a 1 h limit: 30,000 over a 7-day one
    config = replace(GARRISON, weights=weights)
    nodes = [busy(node("a", gpus=1), running(9, {"a": (0,)}))]
    week, hour = 7 * 86400, 3600
    jobs = [pending(1, submit=NOW - 10 * 86400, limit=week, gpus=1), pending(2, submit=NOW, limit=hour, gpus=1),
            pending(3, submit=NOW - 86400, limit=24 * hour, gpus=1)]
    plan = schedule(snap(nodes, jobs, [running(9, {"a": (0,)})]), NOW, config)
    # job 1: 10 days of age, no bonus; job 2: the full bonus, no age; job 3: 1 day + 0.38 of the bonus.
    assert plan.priorities == {1: 10_000, 2: 30_000, 3: 1_000 + round(30_000 * time_limit_factor(86400, hour, week))}
    assert plan.order == (2, 3, 1)
    # A job is overtaken only by jobs submitted less than 30 days after it (the head start, in days of age).
    for hours_after, order in ((30 * 24 - 1, (2, 1)), (30 * 24, (1, 2))):
        later = [pending(1, submit=NOW - hours_after * hour, limit=week, gpus=1),
                 pending(2, submit=NOW, limit=hour, gpus=1)]
        assert schedule(snap(nodes, later, [running(9, {"a": (0,)})]), NOW, config).order == order


def test_an_overdue_job_cannot_be_outrun_by_newer_short_jobs() -> None:
    """Past overdue_after_s a job gains the overdue weight per further overdue_after_s, without a cap: it
    goes ahead of every job that is not overdue, and overdue jobs go mostly by how long they waited."""
    weights = PriorityWeights(age=30_000, max_age_s=30 * 86400, fair_share=0, qos=0, job_size=0, partition=0,
                              time_limit=30_000, overdue=100_000, overdue_after_s=2 * 86400)
    config = replace(GARRISON, weights=weights)
    nodes = [busy(node("a", gpus=1), running(9, {"a": (0,)}))]
    week, hour, day = 7 * 86400, 3600, 86400
    jobs = [pending(1, submit=NOW - 2 * day + 60, limit=week, gpus=1),  # not yet overdue
            pending(2, submit=NOW - 3 * day, limit=week, gpus=1),  # overdue by a day
            pending(3, submit=NOW - 4 * day, limit=week, gpus=1),  # overdue by two days
            pending(4, submit=NOW, limit=hour, gpus=1)]  # the full time-limit bonus
    plan = schedule(snap(nodes, jobs, [running(9, {"a": (0,)})]), NOW, config)
    assert plan.order == (3, 2, 4, 1)
    assert plan.priorities[2] == 3_000 + round(100_000 * 1.5)
    pricing = PriorityContext(snap(nodes, jobs), NOW, weights)
    assert pricing.priorities(jobs) == {j.job_id: pricing.factors(j).total for j in jobs}
    assert pricing.factors(jobs[0]).overdue == 0.0 and pricing.factors(jobs[2]).overdue == 2.0
    with pytest.raises(ValueError, match="overdue_after_s"):
        PriorityWeights(overdue=1)


def test_the_overdue_bound_follows_the_longest_wait_in_the_queue() -> None:
    """With overdue_share, a job is overdue only once it has waited that share of the longest wait now: on a
    saturated cluster only the longest waiters go first, not every job past the fixed bound."""
    day, week, hour = 86400, 7 * 86400, 3600
    weights = PriorityWeights(age=0, fair_share=0, qos=0, job_size=0, partition=0, time_limit=30_000,
                              overdue=100_000, overdue_after_s=1 * day, overdue_share=0.5)
    jobs = [pending(1, submit=NOW - 10 * day, limit=week, gpus=1),  # the longest wait: overdue
            pending(2, submit=NOW - 4 * day, limit=week, gpus=1),  # past 1 day, under half of 10: not overdue
            pending(3, submit=NOW - 6 * day, limit=week, gpus=1),  # past half of 10 days: overdue
            pending(4, submit=NOW, limit=hour, gpus=1)]
    pricing = PriorityContext(snap([node("a")], jobs), NOW, weights)
    assert [pricing.factors(j).overdue > 0 for j in jobs] == [True, False, True, False]
    assert pricing.priorities(jobs) == {j.job_id: pricing.factors(j).total for j in jobs}
    plan = schedule(snap([busy(node("a", gpus=1), running(9, {"a": (0,)}))], jobs, [running(9, {"a": (0,)})]), NOW,
                    replace(GARRISON, weights=weights))
    assert plan.order == (1, 3, 4, 2)


def test_priority_factors_match_the_fast_path_and_use_the_partition_default_limit() -> None:
    acct = accounting(partitions=(PartitionDef("main", default=True, default_time_s=4 * 3600),))
    jobs = [pending(1, limit=None, gpus=1), pending(2, limit=3600, gpus=2), pending(3, limit=10 * 86400, gpus=1)]
    snapshot = snap([node("a")], jobs, acct=acct)
    pricing = PriorityContext(snapshot, NOW, GARRISON.weights)
    assert pricing.factors(jobs[0]).time_limit == pytest.approx(time_limit_factor(4 * 3600, 3600, 7 * 86400))
    assert [pricing.factors(j).time_limit for j in jobs[1:]] == [1.0, 0.0]
    assert pricing.priorities(jobs) == {j.job_id: pricing.factors(j).total for j in jobs}


def test_config_reads_the_time_limit_bounds_as_the_presets_define_them() -> None:
    for config in policy_presets().values():
        assert (config.weights.short_limit_s, config.weights.long_limit_s) == (
            PRESET_TIME_LIMIT_SHORT_S, PRESET_TIME_LIMIT_LONG_S)
    with pytest.raises(ValueError, match="short < long"):
        PriorityWeights(short_limit_s=86400, long_limit_s=3600)


# -- quotas -----------------------------------------------------------------------------------------------------


def test_account_gpu_quota_counts_running_jobs_and_holds_under_a_parent() -> None:
    acct = accounting(account_limits=(("org", Limits(max_gpus=4)),))
    nodes = [busy(node("a"), running(9, {"a": (0, 1, 2)}, account="teamA"))]
    jobs = [pending(1, account="teamB", gpus=2), pending(2, account="teamB", gpus=1), pending(3, gpus=4)]
    plan = schedule(snap(nodes, jobs, [running(9, {"a": (0, 1, 2)}, account="teamA")], acct), NOW, GARRISON)
    assert plan.waiting[1] == "QuotaGPUs"  # 3 in use under org + 2 > 4
    assert {s.job_id for s in plan.starts} == {2, 3}  # the quota does not hold back others


def test_user_job_quota_and_qos_per_user_limits() -> None:
    acct = accounting(user_limits=(("u", Limits(max_jobs=1)),),
                      qos=(Qos("normal", 10, max_gpus_per_user=2), Qos("high", 20)), default_qos="normal")
    nodes = [node("a")]
    jobs = [pending(1, gpus=1), pending(2, gpus=1), pending(3, user="v", gpus=2), pending(4, user="v", gpus=1)]
    plan = schedule(snap(nodes, jobs, acct=acct), NOW, GARRISON)
    assert plan.waiting[2] == "QuotaJobs"
    assert plan.waiting[4] == "QOSMaxGPUsPerUser"
    assert {s.job_id for s in plan.starts} == {1, 3}


def test_gpu_hour_quota_counts_running_jobs_to_their_time_limits() -> None:
    acct = accounting(account_limits=(("teamA", Limits(max_gpu_hours=10)),))
    run = running(9, {"a": (0, 1)}, account="teamA", start=NOW - 3600, limit=4 * 3600)  # 6 GPU-h still to come
    usage = {("teamA", "u"): UsageView(period_gpu_s=2 * 3600)}  # 2 GPU-h used so far
    nodes = [busy(node("a"), run)]
    jobs = [pending(1, account="teamA", gpus=1, limit=3 * 3600), pending(2, account="teamA", gpus=1, limit=7200)]
    plan = schedule(snap(nodes, jobs, [run], acct, usage), NOW, GARRISON)
    assert plan.waiting[1] == "QuotaGPUHours"  # 2 + 6 + 3 > 10
    assert [s.job_id for s in plan.starts] == [2]  # 2 + 6 + 2 = 10


# -- backfill -------------------------------------------------------------------------------------------------


def backfill_case() -> tuple[list, list, list]:  # type: ignore[type-arg]
    """Node a: 6 of 8 GPUs run until NOW+1000. Job 1 wants all 8 (blocked); 2 is short, 3 is long."""
    run = running(9, {"a": tuple(range(6))}, start=NOW - 100, limit=1100)
    nodes = [busy(node("a"), run)]
    jobs = [pending(1, gpus=8, limit=3600), pending(2, gpus=1, limit=600), pending(3, gpus=1, limit=7200)]
    return nodes, jobs, [run]


def test_easy_backfill_starts_only_what_ends_before_the_reservation() -> None:
    nodes, jobs, run = backfill_case()
    for name in ("fifo-easy", "garrison"):
        config = replace(preset(name), resolution_s=60)
        plan = schedule(snap(nodes, jobs, run), NOW, config)
        assert [s.job_id for s in plan.starts] == [2], name
        (reservation, *_) = plan.reservations
        assert reservation.job_id == 1 and reservation.start == NOW + 1020  # rounded up to the minute
        assert plan.estimated_starts[1] == NOW + 1020
        assert plan.waiting[1] == Reason.RESOURCES
        if name == "fifo-easy":
            assert plan.waiting[3] == Reason.reserved_for(1)


def test_strict_fifo_starts_nothing_behind_a_blocked_job() -> None:
    nodes, jobs, run = backfill_case()
    plan = schedule(snap(nodes, jobs, run), NOW, preset("fifo"))
    assert plan.starts == () and plan.reservations == ()
    assert plan.waiting == {1: Reason.RESOURCES, 2: Reason.PRIORITY, 3: Reason.PRIORITY}


def test_backfill_may_use_gpus_the_reservation_does_not_need() -> None:
    run = running(9, {"a": tuple(range(6))}, start=NOW, limit=1000)
    nodes = [busy(node("a"), run), node("b", gpus=2)]
    jobs = [pending(1, gpus=8), pending(2, gpus=2, limit=50_000)]
    plan = schedule(snap(nodes, jobs, [run]), NOW, preset("fifo-easy"))
    assert [s.allocation.node_names for s in plan.starts] == [("b",)]
    assert plan.reservations[0].allocation.node_names == ("a",)


def test_garrison_reserves_for_several_blocked_jobs() -> None:
    runs = [running(9, {"a": tuple(range(8))}, limit=1000 + 100), running(8, {"b": tuple(range(8))}, limit=2100)]
    nodes = [busy(node("a"), runs[0]), busy(node("b"), runs[1])]
    jobs = [pending(1, gpus=8, limit=5000), pending(2, gpus=8, limit=5000), pending(3, gpus=16)]
    # Arrival order (no job-size factor, which would put the 16-GPU job first), eight reservations.
    config = replace(preset("fifo-easy"), reservations=8, resolution_s=1)
    plan = schedule(snap(nodes, jobs, runs), NOW, config)
    # 1 gets node a when its job ends; 2 node b when its job ends; 3 both, once 1 and 2 are done.
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 1000), (2, NOW + 2000),
                                                                 (3, NOW + 7000)]
    with_easy = schedule(snap(nodes, jobs, runs), NOW, replace(config, reservations=1))
    assert [r.job_id for r in with_easy.reservations] == [1]


def test_gpus_of_a_job_being_stopped_are_reserved_from_now() -> None:
    # The job on node a has been told to stop (time limit, cancel): its GPUs are still held, but the top
    # job gets them the moment they are free, and a long job may not slip in on node b meanwhile.
    stopping = running(9, {"a": tuple(range(8))}, start=NOW - 5000, limit=4000, stopping=True)
    nodes = [busy(node("a"), stopping), node("b")]
    jobs = [pending(1, nodes=2, gpus_per_node=8), pending(2, gpus=1, limit=600)]
    plan = schedule(snap(nodes, jobs, [stopping]), NOW, GARRISON)
    assert [(r.job_id, r.start) for r in plan.reservations][0] == (1, NOW)
    assert plan.starts == ()


# -- reservations hold CPUs and memory too ----------------------------------------------------------------


def holding(job_id: int, node_name: str, gpus: tuple[int, ...], *, cpus: tuple[int, ...] = (), mem_mb: int = 0,
            limit: int = 1000) -> RunningJob:
    """A job started at NOW on ``node_name`` holding these GPUs, CPUs and host memory for ``limit`` s."""
    allocation = Allocation((NodeAllocation(node_name, gpus, cpus, mem_mb),))
    return RunningJob(job_id=job_id, attempt=0, allocation=allocation, start_time=NOW, time_limit_s=limit)


def on_node(view: NodeView, *jobs: RunningJob) -> NodeView:
    """``view`` with the GPUs, CPUs and memory of ``jobs`` taken."""
    allocs = [n for job in jobs for n in job.allocation.nodes if n.node == view.name]
    return replace(view, free_gpus=view.free_gpus - {g for n in allocs for g in n.gpus},
                   free_cpus=view.free_cpus - {c for n in allocs for c in n.cpus},
                   free_memory_mb=view.free_memory_mb - sum(n.mem_mb for n in allocs))


def test_backfill_does_not_take_cpus_a_reservation_needs() -> None:
    # 32 CPUs. Job 9 holds GPUs 0-3 and CPUs 0-15 until NOW+1000. Job 1 needs 4 GPUs x 8 CPUs = all 32
    # CPUs: reserved at NOW+1020. Job 2 (8 CPUs, runs long) would leave it 24 at that time; job 3 (8 CPUs,
    # ends before the reservation) may run.
    run = holding(9, "a", (0, 1, 2, 3), cpus=tuple(range(16)))
    nodes = [on_node(node("a", cpus=32), run)]
    jobs = [pending(1, gpus=4, cpus_per_gpu=8), pending(2, gpus=1, cpus_per_gpu=8, limit=50_000),
            pending(3, gpus=1, cpus_per_gpu=8, limit=600)]
    plan = schedule(snap(nodes, jobs, [run]), NOW, replace(preset("fifo-easy"), resolution_s=60))
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 1020)]
    assert len(plan.reservations[0].allocation.nodes[0].cpus) == 32
    assert [s.job_id for s in plan.starts] == [3]
    assert plan.waiting[2] == Reason.reserved_for(1)


def test_a_job_never_starts_with_fewer_cpus_than_it_asked_for() -> None:
    # 4 GPUs x 8 CPUs on a node with 4 GPUs but 16 CPUs free: not now (it used to start with 16 CPUs).
    run = holding(9, "a", (0, 1, 2, 3), cpus=tuple(range(16)))
    nodes = [on_node(node("a", cpus=32), run)]
    plan = schedule(snap(nodes, [pending(1, gpus=4, cpus_per_gpu=8)], [run]), NOW, preset("fifo"))
    assert plan.starts == ()
    # Spread over nodes, each node gets only as many GPUs as its free CPUs can feed.
    nodes = [on_node(node("a", cpus=32), run), node("b", gpus=8, cpus=64)]
    plan = schedule(snap(nodes, [pending(1, gpus=10, cpus_per_gpu=8)], [run]), NOW, preset("fifo"))
    (start,) = plan.starts
    for node_alloc in start.allocation.nodes:
        assert len(node_alloc.cpus) == 8 * len(node_alloc.gpus)
    assert {n.node: len(n.gpus) for n in start.allocation.nodes} == {"a": 2, "b": 8}


def test_a_reservation_waits_for_the_cpus_as_well_as_the_gpus() -> None:
    # Job 8 holds one GPU and 28 of the 32 CPUs until NOW+5000; job 9 the other 7 GPUs until NOW+1000. Job 1
    # (4 GPUs x 2 CPUs) has its GPUs at NOW+1000 but its CPUs only at NOW+5000.
    cpu_heavy = holding(8, "a", (0,), cpus=tuple(range(28)), limit=5000)
    gpu_heavy = holding(9, "a", (1, 2, 3, 4, 5, 6, 7), cpus=(28, 29, 30, 31), limit=1000)
    nodes = [on_node(node("a", cpus=32), cpu_heavy, gpu_heavy)]
    plan = schedule(snap(nodes, [pending(1, gpus=4, cpus_per_gpu=2)], [cpu_heavy, gpu_heavy]), NOW,
                    replace(preset("fifo-easy"), resolution_s=60))
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 5040)]


def test_a_reservation_starts_when_a_cpu_only_job_ends() -> None:
    # No GPU comes free at NOW+3000, only CPUs: the sweep must still look there.
    cpu_only = holding(8, "a", (), cpus=tuple(range(30)), limit=3000)
    gpus_late = holding(9, "a", (0, 1, 2, 3), cpus=(30,), limit=9000)
    nodes = [on_node(node("a", cpus=32), cpu_only, gpus_late)]
    plan = schedule(snap(nodes, [pending(1, gpus=4, cpus_per_gpu=4)], [cpu_only, gpus_late]), NOW,
                    replace(preset("fifo-easy"), resolution_s=60))
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 3000)]


def test_backfill_may_use_memory_the_reservation_leaves_and_no_more() -> None:
    # 100 GB. Job 9 holds 70 GB until NOW+1000. Job 1 needs 80 GB: reserved then. Beside it, 20 GB are free
    # at that time: job 2 (15 GB, long) fits beside it; job 3 (10 GB, long) would not any more; job 4
    # (10 GB, ends before the reservation) may run now.
    run = holding(9, "a", (0, 1, 2, 3), mem_mb=70_000)
    nodes = [on_node(node("a", memory_mb=100_000), run)]
    jobs = [pending(1, gpus=4, mem_mb=80_000), pending(2, gpus=1, mem_mb=15_000, limit=50_000),
            pending(3, gpus=1, mem_mb=10_000, limit=50_000), pending(4, gpus=1, mem_mb=10_000, limit=600)]
    plan = schedule(snap(nodes, jobs, [run]), NOW, replace(preset("fifo-easy"), resolution_s=60))
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 1020)]
    assert [s.job_id for s in plan.starts] == [2, 4]
    assert plan.waiting[3] == Reason.reserved_for(1)


def test_a_reservation_waits_for_memory_held_by_a_longer_job() -> None:
    # Job 8 holds 60 GB until NOW+4000, job 9 the GPUs until NOW+1000: 80 GB are free only at NOW+4000.
    mem_heavy = holding(8, "a", (), mem_mb=60_000, limit=4000)
    gpu_heavy = holding(9, "a", tuple(range(8)), mem_mb=10_000, limit=1000)
    nodes = [on_node(node("a", memory_mb=100_000), mem_heavy, gpu_heavy)]
    plan = schedule(snap(nodes, [pending(1, gpus=8, mem_mb=80_000)], [mem_heavy, gpu_heavy]), NOW,
                    replace(preset("fifo-easy"), resolution_s=60))
    assert [(r.job_id, r.start) for r in plan.reservations] == [(1, NOW + 4020)]


def test_reservations_beyond_the_window_are_not_made() -> None:
    nodes, jobs, run = backfill_case()
    jobs = [replace(j, submit_time=NOW - 60) for j in jobs]  # not overdue: those are reserved for whatever the window
    plan = schedule(snap(nodes, jobs, run), NOW, replace(GARRISON, window_s=500))
    assert plan.reservations == () and 1 not in plan.estimated_starts


def test_an_overdue_job_gets_its_reservation_beyond_the_window() -> None:
    """The window bounds reserving for the many; a job past the overdue bound is reserved for however far
    away its start is, so backfill cannot push the longest waiters back for ever."""
    nodes, jobs, run = backfill_case()
    overdue_after = GARRISON.weights.overdue_after_s
    jobs[0] = replace(jobs[0], submit_time=NOW - overdue_after - 60)
    plan = schedule(snap(nodes, jobs, run), NOW, replace(GARRISON, window_s=500))
    assert [r.job_id for r in plan.reservations] == [1] and plan.estimated_starts[1] >= NOW + 1000


def test_reserve_every_overdue_gives_each_overdue_job_a_reservation_besides_easys_one() -> None:
    """With reserve_every_overdue, ``reservations`` counts only jobs that are not overdue: one reservation as
    in EASY for the queue's order, and one for every overdue job besides, even one ranked behind a blocked
    look-alike that was told it waits (job 3 behind jobs 4 and 6: high QoS, not overdue)."""
    day = 86400.0
    run = running(9, {"a": tuple(range(8))}, start=NOW - 100, limit=1100)
    nodes = [busy(node("a"), run)]
    overdue_after = GARRISON.weights.overdue_after_s
    jobs = [pending(1, gpus=8, limit=3600, submit=NOW - overdue_after - 3 * day),  # overdue, the longest wait
            pending(2, gpus=8, limit=3600, submit=NOW - overdue_after - 2 * day),  # overdue
            pending(3, gpus=8, limit=80_000, submit=NOW - overdue_after - 60, qos="low"),  # overdue, lowest tier
            pending(4, gpus=8, limit=3600, submit=NOW - 120, qos="high"),  # EASY's one reservation
            pending(6, gpus=8, limit=3600, submit=NOW - 60, qos="high"),  # blocked, no reservation left
            pending(5, gpus=8, limit=3600, submit=NOW - 60)]  # the same
    easy_like = replace(GARRISON, reservations=1, reserve_every_overdue=True)
    plan = schedule(snap(nodes, jobs, [run]), NOW, easy_like)
    assert plan.order == (1, 2, 4, 6, 3, 5)
    assert sorted(r.job_id for r in plan.reservations) == [1, 2, 3, 4]
    assert 6 not in plan.estimated_starts and 5 not in plan.estimated_starts
    # With no reservation for the rest, only the overdue jobs get one.
    only_overdue = schedule(snap(nodes, jobs, [run]), NOW, replace(easy_like, reservations=0))
    assert sorted(r.job_id for r in only_overdue.reservations) == [1, 2, 3]
    # Without it, the one reservation goes to the top job and the overdue jobs behind it get none.
    plain = schedule(snap(nodes, jobs, [run]), NOW, replace(easy_like, reserve_every_overdue=False))
    assert [r.job_id for r in plain.reservations] == [1]
    # Nothing is overdue without the overdue weight: the option then changes nothing.
    unbounded = replace(easy_like, weights=replace(GARRISON.weights, overdue=0, overdue_after_s=0.0))
    assert len(schedule(snap(nodes, jobs, [run]), NOW, unbounded).reservations) == 1


def test_the_reserve_every_overdue_key_reaches_the_core() -> None:
    def config_of(**keys: object) -> SchedulerConfig:
        return scheduler_config(parse_config({"controller": {"scheduler": keys}}, "t.toml").controller.scheduler)

    on = config_of(backfill_reservations=1, backfill_reserve_every_overdue=True)
    assert (on.reservations, on.reserve_every_overdue) == (1, True)
    assert config_of().reserve_every_overdue is False  # off in the preset
    with pytest.raises(ConfigError, match="backfill_reserve_every_overdue"):
        config_of(backfill_reserve_every_overdue="yes")


def test_bounded_work_leaves_the_rest_waiting_on_priority() -> None:
    nodes = [busy(node("a"), running(9, {"a": tuple(range(8))}))]
    jobs = [pending(i, gpus=1) for i in range(1, 50)]
    plan = schedule(snap(nodes, jobs, [running(9, {"a": tuple(range(8))})]), NOW, replace(GARRISON, max_job_test=5,
                                                                                        reservations=0))
    assert sum(1 for r in plan.waiting.values() if r == Reason.PRIORITY) >= 44


# -- reasons ---------------------------------------------------------------------------------------------------


def test_reasons_for_held_drained_down_limits_and_arrays() -> None:
    acct = accounting(partitions=(PartitionDef("main", default=True, max_time_s=3600),),
                      qos=(Qos("normal", 10), Qos("high", 20), Qos("short", 5, max_time_s=1800)))
    nodes = [node("a", gpus=2), node("big", gpus=8, drained=True), node("dead", gpus=16, schedulable=False)]
    jobs = [
        pending(1, gpus=1, held=True),
        pending(2, gpus=8),
        pending(3, gpus=16),
        pending(4, gpus=1, limit=7200, qos="high"),
        pending(5, gpus=1, limit=3000, qos="short"),
        pending(6, gpus=1, array_job_id=6, array_max_running=1, qos="high"),
        pending(7, gpus=1, array_job_id=6, array_max_running=1, qos="high"),
        pending(8, gpus=1, partition="gone"),
    ]
    plan = schedule(snap(nodes, jobs, acct=acct), NOW, GARRISON)
    assert plan.waiting[1] == Reason.HELD
    assert plan.waiting[2] == Reason.NODES_DRAINED
    assert plan.waiting[3] == Reason.NODES_UNAVAILABLE
    assert plan.waiting[4] == Reason.PARTITION_TIME_LIMIT
    assert plan.waiting[5] == Reason.QOS_TIME_LIMIT
    assert plan.waiting[7] == Reason.ARRAY_LIMIT
    assert plan.waiting[8] == Reason.PARTITION_INVALID
    assert [s.job_id for s in plan.starts] == [6]


def test_a_job_waiting_on_a_dependency_neither_starts_nor_holds_gpus() -> None:
    # The first two jobs come first in priority but wait on dependencies: the third starts on the one GPU,
    # and no reservation keeps it for them.
    jobs = [
        replace(pending(1, gpus=1, submit=0.0), dependencies=JobDependencies(
            (DependencyItem(DependencyKind.AFTEROK, ((JobState.RUNNING,),)),))),
        replace(pending(2, gpus=1, submit=1.0), dependencies=JobDependencies(
            (DependencyItem(DependencyKind.AFTEROK, ((JobState.FAILED,),)),))),
        pending(3, gpus=1, submit=2.0),
    ]
    plan = schedule(snap([node("a", gpus=1)], jobs), NOW, GARRISON)
    assert [s.job_id for s in plan.starts] == [3]
    assert (plan.waiting[1], plan.waiting[2]) == (Reason.DEPENDENCY, Reason.DEPENDENCY_NEVER_SATISFIED)


def test_jobs_sharing_one_dependencies_object_are_decided_alike_and_others_on_their_own() -> None:
    """The controller gives every task of an array one typed-dependencies object, and a cycle decides each
    object once: tasks sharing a waiting one wait, an equal-looking but separate satisfied one does not, and
    the next cycle decides again (the referenced job ended)."""
    waiting = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.RUNNING,),)),))
    satisfied = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.COMPLETED,),)),))
    jobs = [replace(pending(job_id, gpus=1, submit=float(job_id)), dependencies=waiting) for job_id in (1, 2, 3)]
    jobs.append(replace(pending(4, gpus=1, submit=4.0), dependencies=satisfied))
    plan = schedule(snap([node("a", gpus=8)], jobs), NOW, GARRISON)
    assert [s.job_id for s in plan.starts] == [4]
    assert [plan.waiting[job_id] for job_id in (1, 2, 3)] == [Reason.DEPENDENCY] * 3
    ended = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.COMPLETED,),)),))
    plan = schedule(snap([node("a", gpus=8)], [replace(job, dependencies=ended) for job in jobs[:3]]), NOW, GARRISON)
    assert sorted(s.job_id for s in plan.starts) == [1, 2, 3]


def test_excluded_nodes_are_never_used_not_even_for_a_reservation() -> None:
    # Node a is free, b is busy for an hour: the job that excludes a waits for b (and reserves b, not a);
    # a job that excludes every node can never run.
    busy_b = running(50, {"b": tuple(range(8))}, start=NOW - 100, limit=3700)
    nodes = [node("a"), busy(node("b"), busy_b)]
    jobs = [pending(1, gpus=8, exclude=("a",)), pending(2, gpus=1, exclude=("a", "b")), pending(3, gpus=8)]
    plan = schedule(snap(nodes, jobs, [busy_b]), NOW, GARRISON)
    assert [(s.job_id, s.allocation.node_names) for s in plan.starts] == [(3, ("a",))]
    assert plan.waiting[1] == Reason.RESOURCES
    assert plan.waiting[2] == Reason.NODES_UNAVAILABLE


def test_a_job_does_not_start_before_its_begin_time() -> None:
    jobs = [pending(1, gpus=1, begin_time=NOW + 60), pending(2, gpus=1, begin_time=NOW)]
    plan = schedule(snap([node("a", gpus=1)], jobs), NOW, GARRISON)
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.waiting[1] == Reason.BEGIN_TIME
    later = schedule(snap([node("a", gpus=1)], jobs[:1]), NOW + 60, GARRISON)
    assert [s.job_id for s in later.starts] == [1]


def test_one_singleton_of_a_name_starts_per_cycle() -> None:
    jobs = [
        replace(pending(1, gpus=1), dependencies=SINGLETON_U),
        replace(pending(2, gpus=1), dependencies=SINGLETON_U),
        replace(pending(3, gpus=1), dependencies=replace(SINGLETON_U, singleton_key=("v", "chain"))),  # another user's
        pending(4, gpus=1),
    ]
    plan = schedule(snap([node("a", gpus=4)], jobs), NOW, GARRISON)
    assert sorted(s.job_id for s in plan.starts) == [1, 3, 4]
    assert plan.waiting[2] == Reason.DEPENDENCY
    # A namesake that already runs holds back both of u's: the core decides from the snapshot's running names.
    running_namesake = replace(snap([node("a", gpus=4)], jobs), running_names=frozenset({("u", "chain")}))
    plan = schedule(running_namesake, NOW, GARRISON)
    assert sorted(s.job_id for s in plan.starts) == [3, 4]
    assert plan.waiting[1] == plan.waiting[2] == Reason.DEPENDENCY


SINGLETON_U = JobDependencies((DependencyItem(DependencyKind.SINGLETON),), singleton_key=("u", "chain"))


def test_every_pending_job_gets_a_reason_position_and_priority() -> None:
    nodes, jobs, run = backfill_case()
    plan = schedule(snap(nodes, jobs, run), NOW, GARRISON)
    started = {s.job_id for s in plan.starts}
    assert set(plan.waiting) | started == {1, 2, 3} and not set(plan.waiting) & started
    assert sorted(plan.order) == [1, 2, 3] and set(plan.priorities) == {1, 2, 3}


# -- preemption ------------------------------------------------------------------------------------------------


def preemption_case(enabled: bool = True) -> tuple[Snapshot, SchedulerConfig]:
    # Node a: three low-QoS jobs; the one with the newest checkpoint loses the least work.
    runs = [
        running(11, {"a": (0, 1, 2, 3)}, qos="low", start=NOW - 1000),
        running(12, {"a": (4, 5)}, qos="low", start=NOW - 1000, checkpoint=NOW - 10),
        running(13, {"a": (6, 7)}, qos="low", start=NOW - 1000, checkpoint=NOW - 500),
        running(14, {"b": tuple(range(8))}, qos="normal", start=NOW - 10),
    ]
    nodes = [busy(node("a"), *runs[:3]), busy(node("b"), runs[3])]
    jobs = [pending(1, qos="high", gpus=2), pending(2, qos="normal", gpus=2)]
    return snap(nodes, jobs, runs), replace(GARRISON, preemption=enabled)


def test_preemption_takes_the_smallest_cheapest_victim_set() -> None:
    snapshot, config = preemption_case()
    plan = schedule(snapshot, NOW, config)
    assert [(p.job_id, p.attempt, p.grace_s) for p in plan.preempts] == [(12, 0, 60)]
    assert plan.waiting[1] == Reason.PREEMPTING
    assert plan.waiting[2] != Reason.PREEMPTING  # normal may not preempt


def test_no_preemption_unless_enabled() -> None:
    snapshot, config = preemption_case(enabled=False)
    assert schedule(snapshot, NOW, config).preempts == ()


def test_a_preemption_in_flight_is_not_repeated() -> None:
    snapshot, config = preemption_case()
    stopping = tuple(replace(r, stopping=True) if r.job_id == 12 else r for r in snapshot.running)
    plan = schedule(replace(snapshot, running=stopping), NOW, config)
    assert plan.preempts == ()
    assert plan.waiting[1] == Reason.PREEMPTING


def test_preemption_frees_a_whole_gang_with_the_fewest_victims() -> None:
    runs = [running(20 + i, {f"n{i}": tuple(range(8))}, qos="low", start=NOW - 100 * (i + 1)) for i in range(4)]
    nodes = [busy(node(f"n{i}"), runs[i]) for i in range(4)]
    plan = schedule(snap(nodes, [pending(1, qos="high", nodes=2, gpus_per_node=8)], runs), NOW,
                    replace(GARRISON, preemption=True))
    assert sorted(p.job_id for p in plan.preempts) == [20, 21]  # the two that ran least


def test_a_gang_preempts_two_big_jobs_rather_than_sixteen_small_ones() -> None:
    # n0 and n1 each run one 8-GPU low job that has run long (much work to lose); n2 and n3 each run eight
    # 1-GPU low jobs that have just started (little to lose each). Adding victims cheapest first frees n2
    # and n3 with 16 victims, and none of them can be spared; freeing n0 and n1 takes 2.
    runs = [running(10 + i, {f"n{i}": tuple(range(8))}, qos="low", start=NOW - 50_000) for i in range(2)]
    runs += [running(100 + 8 * i + g, {f"n{i}": (g,)}, qos="low", start=NOW - 10) for i in (2, 3) for g in range(8)]
    nodes = [busy(node(f"n{i}"), *[r for r in runs if f"n{i}" in r.allocation.node_names]) for i in range(4)]
    plan = schedule(snap(nodes, [pending(1, qos="high", nodes=2, gpus_per_node=8)], runs), NOW,
                    replace(GARRISON, preemption=True))
    assert sorted(p.job_id for p in plan.preempts) == [10, 11]



def test_a_gang_preempts_the_fewest_jobs_when_both_searches_take_more() -> None:
    # Every job started at the same time, so the work lost is the GPUs taken. n0 and n1 hold a 2-node job
    # (4 GPUs on each) beside a 4-GPU job each; n2 and n3 hold two 4-GPU jobs each. Clearing two nodes costs
    # 16 GPUs either way, but n0 and n1 take 3 jobs and n2 and n3 take 4. Adding jobs cheapest first, and
    # clearing the nodes with the fewest and cheapest jobs first, both free n2 and n3.
    start = NOW - 1000
    runs = [
        running(10, {"n0": (0, 1, 2, 3), "n1": (0, 1, 2, 3)}, qos="low", start=start),
        running(11, {"n0": (4, 5, 6, 7)}, qos="low", start=start),
        running(12, {"n1": (4, 5, 6, 7)}, qos="low", start=start),
    ]
    runs += [running(20 + 2 * i + half, {f"n{i}": tuple(range(4 * half, 4 * half + 4))}, qos="low", start=start)
             for i in (2, 3) for half in (0, 1)]
    nodes = [busy(node(f"n{i}"), *[r for r in runs if f"n{i}" in r.allocation.node_names]) for i in range(4)]
    plan = schedule(snap(nodes, [pending(1, qos="high", nodes=2, gpus_per_node=8)], runs), NOW,
                    replace(GARRISON, preemption=True))
    assert sorted(p.job_id for p in plan.preempts) == [10, 11, 12]

# -- presets and configuration ----------------------------------------------------------------------------------


def test_presets_are_the_three_named_policies() -> None:
    presets = policy_presets()
    assert set(presets) == {"fifo", "fifo-easy", "garrison"}
    assert not presets["fifo"].backfill and presets["fifo-easy"].reservations == 1
    assert presets["garrison"].weights.fair_share > 0
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        preset("lottery")


@pytest.mark.parametrize("field,value", [("max_job_test", -1), ("score_limit", 0), ("window_s", 0),
                                         ("scorer_weights", (("Magic", 1),))])
def test_bad_settings_are_named(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field.removesuffix("_weights") if field != "scorer_weights" else "Magic"):
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]


def test_an_empty_snapshot_needs_no_accounting() -> None:
    plan = schedule(Snapshot(nodes=(node("a"),), pending=(pending(1, gpus=1, account="anything"),)), NOW, GARRISON)
    assert [s.job_id for s in plan.starts] == [1]


@pytest.mark.parametrize("asks", [{"cpus_per_gpu": 4}, {"mem_mb": 80_000}])
def test_preemption_frees_the_cpus_and_memory_the_job_needs(asks: dict[str, int]) -> None:
    # The low job holds every GPU, CPU and 50 GB: before, the victims' GPUs alone were counted, so a job
    # asking for CPUs or memory never found a victim set that helped.
    low = replace(holding(11, "a", tuple(range(8)), cpus=tuple(range(32)), mem_mb=50_000), qos="low")
    nodes = [on_node(node("a", cpus=32, memory_mb=100_000), low)]
    plan = schedule(snap(nodes, [pending(1, qos="high", gpus=8, **asks)], [low]), NOW,
                    replace(GARRISON, preemption=True))
    assert [p.job_id for p in plan.preempts] == [11]
    assert plan.waiting[1] == Reason.PREEMPTING


def test_memory_freed_for_a_preemptor_is_not_taken_meanwhile() -> None:
    # 100 GB. The low job holds GPUs 0-3 and 60 GB; the urgent job needs 4 GPUs and 80 GB, so the low job
    # goes. Beside the urgent job, 100 - 80 = 20 GB stay: job 2 (30 GB) must wait, job 3 (10 GB) may start.
    low = replace(holding(11, "a", (0, 1, 2, 3), mem_mb=60_000, limit=50_000), qos="low")
    nodes = [on_node(node("a", memory_mb=100_000), low)]
    jobs = [pending(1, qos="high", gpus=4, mem_mb=80_000), pending(2, gpus=1, mem_mb=30_000, limit=50_000),
            pending(3, gpus=1, mem_mb=10_000, limit=50_000)]
    plan = schedule(snap(nodes, jobs, [low]), NOW, replace(GARRISON, preemption=True))
    assert [p.job_id for p in plan.preempts] == [11]
    assert [s.job_id for s in plan.starts] == [3]
    assert 2 in plan.waiting



def test_remembered_static_parts_follow_changed_jobs_and_configurations() -> None:
    """priorities() remembers each job view's clock-free part across cycles: a changed view (a new object
    for the same id), a changed partition default or other weights are priced afresh, never from the memo."""
    acct = accounting(partitions=(PartitionDef("main", default=True, default_time_s=4 * 3600),))
    jobs = [pending(1, limit=None, gpus=1), pending(2, limit=3600, gpus=2)]
    first = PriorityContext(snap([node("a")], jobs, acct=acct), NOW, GARRISON.weights)
    assert first.priorities(jobs) == {j.job_id: first.factors(j).total for j in jobs}
    changed = [jobs[0], replace(jobs[1], priority=5_000)]  # an admin's adjustment: a new view of job 2
    later = PriorityContext(snap([node("a")], changed, acct=acct), NOW + 86400, GARRISON.weights)
    assert later.priorities(changed) == {j.job_id: later.factors(j).total for j in changed}
    longer = accounting(partitions=(PartitionDef("main", default=True, default_time_s=7 * 86400),))
    other = PriorityContext(snap([node("a")], changed, acct=longer), NOW, GARRISON.weights)
    assert other.priorities(changed) == {j.job_id: other.factors(j).total for j in changed}
    assert other.priorities(changed)[1] < first.priorities(jobs)[1]  # a 7-day default limit: no bonus
