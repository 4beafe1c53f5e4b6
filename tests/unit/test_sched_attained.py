"""Attained service (sched/attained.py, Tiresias' two-queue LAS): the high-queue factor's ordering, the
starvation guard, the preemption rule that takes only low-queue victims, the config keys, and a gsim replay
where it changes the order as expected."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, node, pending, running

from garrison.config import ConfigError
from garrison.config.loading import parse_config
from garrison.controller.sched.attained import attained_gpu_s, in_high_queue, starving
from garrison.controller.sched.cycle import Reason, SchedulerConfig, schedule
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityContext, PriorityWeights
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.sched_settings import scheduler_config
from garrison.controller.sim.cluster import parse_cluster
from garrison.controller.sim.policies import load_policy
from garrison.controller.sim.replay import ReplayOptions, replay
from garrison.controller.sim.trace import TraceJob
from garrison.controller.snapshots import attempt_service, pending_view
from garrison.model.accounts import Accounting, PartitionDef
from garrison.model.domain import Allocation, Attempt, Job, JobSpec, JobState, NodeAllocation

ACCOUNTING = Accounting(partitions=(PartitionDef("main", default=True, max_time_s=7 * 86400),))
HOUR = 3600.0
# The high queue: under 4 GPU-hours of service; promoted back after waiting twice its last run.
LAS = replace(NO_WEIGHTS, attained_service=10_000, attained_threshold_gpu_s=4 * HOUR, attained_starvation=2.0)


def test_attained_service_counts_gpu_time_and_starts_again_at_a_promotion() -> None:
    # Two attempts on 2 GPUs: an hour, then (after waiting 30 minutes, not twice the hour) half an hour.
    service = ((0.0, HOUR, 2), (1.5 * HOUR, 2 * HOUR, 2))
    assert attained_gpu_s(service, 2.0) == 2 * HOUR + HOUR
    # A running third attempt on 4 GPUs, started at 2.5 h (waited 0.5 h against a 0.5 h run): counts on top.
    assert attained_gpu_s(service, 2.0, 2.5 * HOUR, 4, 3 * HOUR) == 3 * HOUR + 2 * HOUR
    # Started at 4 h instead: it waited 2 h, over twice its last run (0.5 h), so it began as a promoted job.
    assert attained_gpu_s(service, 2.0, 4 * HOUR, 4, 4.5 * HOUR) == 2 * HOUR
    assert attained_gpu_s(service, 0.0, 4 * HOUR, 4, 4.5 * HOUR) == 5 * HOUR  # no guard: no promotion


def test_starvation_guard_sends_a_long_waiter_back_to_the_high_queue() -> None:
    service = ((0.0, 3 * HOUR, 2),)  # 6 GPU-hours: the low queue
    assert not in_high_queue(service, 4 * HOUR, 2.0, 3 * HOUR + 5 * HOUR)
    assert not starving(service, 2.0, 3 * HOUR + 6 * HOUR)  # exactly twice its last run: not yet
    assert in_high_queue(service, 4 * HOUR, 2.0, 3 * HOUR + 6 * HOUR + 1)
    assert not in_high_queue(service, 4 * HOUR, 0.0, 1e9)  # no guard
    assert in_high_queue((), 4 * HOUR, 2.0, 0.0)  # never ran
    assert in_high_queue(((0.0, HOUR, 2),), 4 * HOUR, 2.0, HOUR)  # 2 GPU-hours: below the threshold


def snapshot_of(*jobs: object) -> Snapshot:
    return Snapshot(nodes=(node("a", free=set()),), pending=tuple(jobs),  # type: ignore[arg-type]
                    running=(), accounting=ACCOUNTING)


def test_factor_puts_less_served_jobs_first_and_the_guard_moves_with_the_clock() -> None:
    # Job 1 (oldest) ran 6 GPU-hours before, ending an hour before NOW: the low queue. Job 2 ran 1 GPU-hour:
    # the high queue. Job 3 never ran: the high queue. Arrival order without the factor.
    served = replace(pending(1, submit=NOW - 10 * HOUR, gpus=2), service=((NOW - 4 * HOUR, NOW - HOUR, 2),))
    little = replace(pending(2, submit=NOW - 9 * HOUR, gpus=2), service=((NOW - 3 * HOUR, NOW - 2.5 * HOUR, 2),))
    fresh = pending(3, submit=NOW - 8 * HOUR, gpus=2)
    snapshot = snapshot_of(served, little, fresh)
    assert schedule(snapshot, NOW, SchedulerConfig(weights=NO_WEIGHTS)).order == (1, 2, 3)
    plan = schedule(snapshot, NOW, SchedulerConfig(weights=LAS))
    assert plan.order == (2, 3, 1)
    assert plan.priorities == {1: 0, 2: 10_000, 3: 10_000}
    # Six hours after its 3-hour run ended (twice the run), job 1 is promoted: arrival order again.
    later = NOW - HOUR + 6 * HOUR + 60
    assert schedule(snapshot, later, SchedulerConfig(weights=LAS)).order == (1, 2, 3)
    # The one-job and the whole-queue pricing agree, as of the context's moment.
    for now in (NOW, later):
        context = PriorityContext(snapshot, now, LAS)
        together = context.priorities(list(snapshot.pending))
        for job in snapshot.pending:
            assert together[job.job_id] == context.factors(job).total


def test_high_queue_job_preempts_only_low_queue_jobs() -> None:
    # One 8-GPU node, full: job 10 has run 3 h on 4 GPUs (12 GPU-hours: the low queue), job 11 for 10 minutes
    # on 4 GPUs (the high queue; it would lose far less work, so the cheapest victim if it were allowed).
    long_served = running(10, {"a": (0, 1, 2, 3)}, start=NOW - 3 * HOUR, limit=86400)
    young = running(11, {"a": (4, 5, 6, 7)}, start=NOW - 600, limit=86400)
    full = busy(node("a"), long_served, young)
    config = SchedulerConfig(weights=LAS, preemption=True, preempt_attained=True, backfill=True, reservations=1)

    def plan_for(*jobs: object) -> tuple[tuple[int, ...], dict[int, str]]:
        snapshot = Snapshot(nodes=(full,), pending=tuple(jobs), running=(long_served, young),  # type: ignore[arg-type]
                            accounting=ACCOUNTING)
        plan = schedule(snapshot, NOW, config)
        return tuple(p.job_id for p in plan.preempts), plan.waiting

    victims, waiting = plan_for(pending(1, submit=NOW - 60, gpus=4))
    assert victims == (10,)
    assert waiting[1] == Reason.PREEMPTING
    # The whole node would take the young job too: no preemption at all.
    assert plan_for(pending(2, submit=NOW - 60, gpus=8))[0] == ()
    # A job in the low queue itself (12 GPU-hours before) preempts no one.
    served = replace(pending(3, submit=NOW - 10 * HOUR, gpus=4), service=((NOW - 7 * HOUR, NOW - 4 * HOUR, 4),))
    assert plan_for(served)[0] == ()
    # A resumed job with 12 GPU-hours before but 10 minutes into this attempt has not had its quantum yet.
    resumed = replace(long_served, start_time=NOW - 600, service=((NOW - 8 * HOUR, NOW - 5 * HOUR, 4),))
    snapshot = Snapshot(nodes=(full,), pending=(pending(4, submit=NOW - 60, gpus=4),), running=(resumed, young),
                        accounting=ACCOUNTING)
    assert schedule(snapshot, NOW, config).preempts == ()
    # Without the rule, the same high-queue job waits.
    plain = replace(config, preempt_attained=False)
    snapshot = Snapshot(nodes=(full,), pending=(pending(1, submit=NOW - 60, gpus=4),),
                        running=(long_served, young), accounting=ACCOUNTING)
    assert schedule(snapshot, NOW, plain).preempts == ()


def test_settings_are_validated_in_one_line() -> None:
    with pytest.raises(ValueError, match="attained_threshold_gpu_s must be positive"):
        PriorityWeights(attained_service=1)
    with pytest.raises(ValueError, match="attained_starvation"):
        replace(LAS, attained_starvation=-1.0)
    with pytest.raises(ValueError, match="preempt_attained needs preemption"):
        SchedulerConfig(weights=LAS, preempt_attained=True)
    with pytest.raises(ValueError, match="preempt_attained needs preemption"):
        SchedulerConfig(weights=NO_WEIGHTS, preemption=True, preempt_attained=True)


def scheduler(**keys: object) -> dict[str, object]:
    return {"controller": {"scheduler": keys}}


def test_config_keys_reach_the_core_and_are_validated() -> None:
    settings = parse_config(scheduler(priority_weight_attained_service=50_000,
                                      priority_attained_threshold_gpu_hours=1.5, priority_attained_starvation=8,
                                      preemption=True, preempt_attained_service=True), "t.toml").controller.scheduler
    config = scheduler_config(settings)
    assert (config.weights.attained_service, config.weights.attained_threshold_gpu_s,
            config.weights.attained_starvation, config.preempt_attained) == (50_000, 1.5 * HOUR, 8.0, True)
    unset = scheduler_config(parse_config({"controller": {}}, "t.toml").controller.scheduler)
    assert (unset.weights.attained_service, unset.preempt_attained) == (0, False)  # off by default
    for keys, message in (
        ({"priority_weight_attained_service": 1}, "priority_attained_threshold_gpu_hours: must be positive"),
        ({"preempt_attained_service": True}, "preempt_attained_service: needs preemption"),
        ({"priority_attained_starvation": -1}, "priority_attained_starvation: must be at least"),
    ):
        with pytest.raises(ConfigError, match=message) as raised:
            parse_config(scheduler(**keys), "t.toml")
        assert "\n" not in str(raised.value)


U = 600.0


def trace_job(n: int, submit: float, gpus: int, duration: float) -> TraceJob:
    return TraceJob(str(n), n + 1, submit * U, duration * U, gpus, "a-user", "a", None, round(2 * duration * U))


def test_gsim_replay_lets_a_short_job_preempt_a_long_served_one() -> None:
    # Two GPUs. A (2 GPUs, 1000 units) starts at 0; B (2 GPUs, 10 units) arrives at 10 units. Without attained
    # service B waits for A to end. With a threshold of 2 GPU-hours, A has had 2 x 100 minutes by then (the low
    # queue), B none: B preempts A (60 s grace), runs, and A restarts from its last hourly checkpoint.
    jobs = [trace_job(0, 0, 2, 1000), trace_job(1, 10, 2, 10)]
    cluster = parse_cluster("1x2")
    options = ReplayOptions(checkpoint_interval_s=3600, restart_cost_s=300)
    base = load_policy("garrison", preemption=True)
    without = replay(cluster, jobs, base, options)
    assert without.start_order == [1, 2] and without.preemptions == 0
    assert without.jobs[1].first_start == 1000 * U
    weights = replace(base.config.weights, attained_service=50_000, attained_threshold_gpu_s=2 * HOUR,
                      attained_starvation=8.0)
    las = replace(base, config=replace(base.config, weights=weights, preempt_attained=True))
    result = replay(cluster, jobs, las, options)
    (a, b) = result.jobs
    stop = 10 * U + 60
    assert result.preemptions == 1 and a.preemptions == 1
    assert (b.first_start, b.end) == (stop, stop + 10 * U)
    # A restarts when B ends (its service put it in the low queue; B is no victim: under the threshold).
    assert a.end == pytest.approx(stop + 10 * U + (1000 * U - 3600 + 300))


def test_daemon_views_carry_the_service_of_ended_attempts() -> None:
    first = Attempt(7, 0, Allocation((NodeAllocation("a", (0, 1)),)), start_time=100.0, end_time=700.0,
                    state=JobState.REQUEUED)
    job = Job(7, JobSpec(name="j", command=("true",), gpus=2), "u", 1000, 1000, "default", "main", 3600, 50.0,
              attempts=(first,))
    assert pending_view(job).service == ((100.0, 700.0, 2),)
    assert attempt_service((first, replace(first, attempt=1, end_time=None))) == ((100.0, 700.0, 2),)
    assert pending_view(replace(job, attempts=())).service == ()
