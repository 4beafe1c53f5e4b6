"""gsim replays on small hand-made traces whose results are known exactly, through the production scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from garrison.controller.sim.cluster import parse_cluster
from garrison.controller.sim.metrics import (
    ReplayResult,
    jain_index,
    max_min_shares,
    percentile,
    summarize,
)
from garrison.controller.sim.policies import Policy, SnapshotBuilder, load_policy
from garrison.controller.sim.replay import ReplayOptions, replay
from garrison.controller.sim.report import step_average
from garrison.controller.sim.study import prepare
from garrison.controller.sim.trace import TraceError, TraceJob
from garrison.model.domain import Allocation, NodeAllocation

U = 600.0  # time unit of the hand-made traces: ten minutes, far above any scheduler time resolution


def job(n: int, submit: float, gpus: int, duration: float, limit: float | None = None, account: str = "a") -> TraceJob:
    """A trace job; times in units of U, the time limit equal to the duration unless given."""
    limit_s = round((limit if limit is not None else duration) * U)
    return TraceJob(str(n), n + 1, submit * U, duration * U, gpus, f"{account}-user", account, None, limit_s)


def policy(name: str) -> Policy:
    return load_policy(name)


def run(spec: str, jobs: Sequence[TraceJob], name: str = "fifo", **options: object) -> ReplayResult:
    return replay(parse_cluster(spec), jobs, policy(name), ReplayOptions(**options))  # type: ignore[arg-type]


def times(result: ReplayResult) -> list[tuple[float | None, float | None]]:
    """(start, end) per job in units of U."""
    return [
        (None if j.first_start is None else j.first_start / U, None if j.end is None else j.end / U)
        for j in result.jobs
    ]


# A, B, C, D, E on one 8-GPU node. A fills the node; B and C share it when A ends; D needs the whole node
# and must wait for B; E is one GPU for a moment, stuck behind D in a strict queue.
QUEUE = [job(0, 0, 8, 100), job(1, 10, 4, 50), job(2, 20, 4, 30), job(3, 30, 8, 10), job(4, 40, 1, 5)]


def test_fifo_queue_on_one_node() -> None:
    result = run("1x8", QUEUE, "fifo")
    assert times(result) == [(0, 100), (100, 150), (100, 130), (150, 160), (160, 165)]
    assert result.start_order == [1, 2, 3, 4, 5]
    summary = summarize(result)
    assert summary["avg_jct_s"] == pytest.approx((100 + 140 + 110 + 130 + 125) / 5 * U)
    assert summary["avg_wait_s"] == pytest.approx((0 + 90 + 80 + 120 + 120) / 5 * U)
    assert summary["max_wait_s"] == pytest.approx(120 * U)
    assert summary["p50_wait_s"] == pytest.approx(90 * U)
    assert summary["makespan_s"] == pytest.approx(165 * U)
    busy = 8 * 100 + 4 * 50 + 4 * 30 + 8 * 10 + 1 * 5
    assert summary["utilization"] == pytest.approx(busy / (8 * 165))
    assert (summary["completed"], summary["unfinished"], summary["timeouts"], summary["preemptions"]) == (5, 0, 0, 0)
    assert summary["rejected_starts"] == 0
    # Idle while jobs waited: C's 4 GPUs from 130 to 150, when E (1 GPU) would have fitted but queued behind D.
    assert summary["idle_gpu_hours_waiting"] == pytest.approx(4 * 20 * U / 3600)
    assert summary["idle_gpu_hours_fitting"] == pytest.approx(4 * 20 * U / 3600)
    # A cycle runs where something could start: t=0 (A), 100 (B, C), 130 (C's GPUs free, nothing fits),
    # 150 (D), 160 (E), and at each arrival (10-40: the node full), as the daemon's cycle on a submission
    # gives the job its first estimated start; at 165 nothing was pending.
    assert result.cycles == 9


def test_the_estimated_start_accuracy_is_reported_per_policy() -> None:
    """The estimate from the cycle at each submission, and the last one an hour or more before the start,
    against the real first start: B, C, D and E waited; garrison's reservations gave each an estimate."""
    result = run("1x8", QUEUE, "garrison")
    by_id = {j.job_id: j for j in result.jobs}
    assert [(by_id[i].estimate_at_submit, by_id[i].first_start) for i in (2, 3, 4, 5)] == [
        (100 * U, 115 * U), (100 * U, 115 * U), (100 * U, 105 * U), (100 * U, 100 * U)]
    summary = summarize(result)
    assert summary["estimate_submit_coverage"] == 1.0
    assert summary["estimate_submit_p50_error_s"] == pytest.approx(10 * U)  # errors 0, 5, 15, 15 units
    assert summary["estimate_submit_p90_error_s"] == pytest.approx(15 * U)
    assert summary["estimate_hour_coverage"] == 1.0 and summary["estimate_hour_p90_error_s"] == 0.0
    # Strict FIFO plans no reservation: no job that waited had an estimate.
    assert summarize(run("1x8", QUEUE, "fifo"))["estimate_submit_coverage"] == 0.0


def test_backfill_starts_a_short_job_that_ends_before_the_reservation() -> None:
    # At 130 C's four GPUs are free. D (8 GPUs) is reserved for 150, when B's time limit runs out; E asks
    # for 5 units and is done by 135, so EASY starts it at once, and D still starts at 150.
    result = run("1x8", QUEUE, "fifo-easy")
    assert times(result) == [(0, 100), (100, 150), (100, 130), (150, 160), (130, 135)]
    assert result.start_order == [1, 2, 3, 5, 4]
    summary = summarize(result)
    assert summary["avg_jct_s"] == pytest.approx((100 + 140 + 110 + 130 + 95) / 5 * U)
    # E takes one of the 4 free GPUs at 130; then only D (8 GPUs) waits, bigger than what is free.
    assert summary["idle_gpu_hours_waiting"] == pytest.approx((3 * 5 + 4 * 15) * U / 3600)
    assert summary["idle_gpu_hours_fitting"] == 0


def test_backfill_never_delays_the_reservation() -> None:
    # Same queue, but E asks for 30 units: it would still run at 150, when D is due; it must wait for D.
    jobs = [*QUEUE[:4], job(4, 40, 1, 5, limit=30)]
    result = run("1x8", jobs, "fifo-easy")
    assert times(result)[3] == (150, 160)
    assert times(result)[4] == (160, 165)


def test_fair_share_lets_a_light_account_overtake_a_heavy_one() -> None:
    # One GPU. Account a queues three jobs at 0; account b one job a second later. When a1 ends, a has used
    # 100 units of GPU time and b nothing: b1 goes next, ahead of a's older jobs. FIFO would run b1 last.
    jobs = [job(0, 0, 1, 100), job(1, 0, 1, 100), job(2, 0, 1, 100), job(3, 1 / U, 1, 100, account="b")]
    fifo = run("1x1", jobs, "fifo")
    assert fifo.start_order == [1, 2, 3, 4]
    shared = run("1x1", jobs, "garrison")
    assert shared.start_order == [1, 4, 2, 3]
    assert times(shared) == [(0, 100), (200, 300), (300, 400), (100, 200)]


def test_the_priority_interval_option_prices_the_queue_as_the_daemon_does() -> None:
    # The fair-share case above. By default (and with the daemon's 30 s: the events are 100 units apart)
    # every cycle prices the queue as of its moment, so b1 overtakes a's older jobs once a has used the GPU.
    # With an interval longer than the trace, every cycle keeps the first cycle's prices, when neither
    # account had used anything: arrival order.
    jobs = [job(0, 0, 1, 100), job(1, 0, 1, 100), job(2, 0, 1, 100), job(3, 1 / U, 1, 100, account="b")]
    assert run("1x1", jobs, "garrison").start_order == [1, 4, 2, 3]
    assert run("1x1", jobs, "garrison", priority_interval_s=30).start_order == [1, 4, 2, 3]
    frozen = run("1x1", jobs, "garrison", priority_interval_s=1000 * U)
    assert frozen.start_order == [1, 2, 3, 4]
    assert frozen.cycles == run("1x1", jobs, "garrison").cycles


def test_config_file_settings_reach_the_scheduler(tmp_path: Path) -> None:
    # The same fair-share case under a configuration without the fair-share factor: arrival order again.
    config = tmp_path / "garrison.toml"
    config.write_text("[controller]\n[controller.scheduler]\npriority_weight_fairshare = 0\n")
    jobs = [job(0, 0, 1, 100), job(1, 0, 1, 100), job(2, 0, 1, 100), job(3, 1 / U, 1, 100, account="b")]
    result = replay(parse_cluster("1x1"), jobs, load_policy("garrison", config))
    assert result.start_order == [1, 2, 3, 4]


def test_time_limits_are_held_to_a_configured_partition_maximum(tmp_path: Path) -> None:
    config = tmp_path / "garrison.toml"
    config.write_text('[controller]\n[[controller.partitions]]\nname = "gpu"\ndefault = true\nmax_time = "2:00:00"\n')
    trace = tmp_path / "trace.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\nlong,0,10800,1\nshort,0,600,1\n")
    study = prepare(trace, "1x8", ["garrison"], config_file=config)
    assert [j.time_limit_s for j in study.jobs] == [7200, 3600]  # drawn; the 3 h job gets the 2 h maximum
    (result,) = study.run()
    assert [(j.end, j.timed_out) for j in result.jobs] == [(7200, True), (600, False)]
    assert study.policies[0].config.weights.fair_share > 0  # the shipped garrison weights, from the file
    given = tmp_path / "given.csv"
    given.write_text("id,t,d,g,limit\na,0,60,1,3:00:00\n")
    with pytest.raises(TraceError, match=r"given.csv, line 2: time limit 10800s of job a exceeds the partition"):
        prepare(given, "1x8", ["fifo"], config_file=config, columns="job_id=id,arrival=t,duration=d,gpus=g,time_limit=limit")


def test_jain_fairness_under_contention() -> None:
    # Two GPUs; a1, a2 and b1 all want both. FIFO runs a1, a2, b1. While jobs wait (0-200), a and b are each
    # entitled to one GPU; a holds two, b none: x = (2, 0) and Jain's index is 4 / (2 * 4) = 0.5.
    jobs = [job(0, 0, 2, 100), job(1, 0, 2, 100), job(2, 0, 2, 100, account="b")]
    result = run("1x2", jobs, "fifo")
    assert result.account_share_ratios == {"a": pytest.approx(2.0), "b": pytest.approx(0.0)}
    assert summarize(result)["jain_fairness"] == pytest.approx(0.5)


def test_gang_slowdown_for_a_gang_spread_wider_than_it_needs() -> None:
    # Two 4-GPU nodes each keep one GPU free under a 3-GPU job: the 2-GPU job Z must span both nodes.
    jobs = [job(0, 0, 3, 1000), job(1, 0, 3, 1000), job(2, 0, 2, 100, limit=1000)]
    assert times(run("2x4", jobs))[2] == (0, 100)
    assert times(run("2x4", jobs, gang_slowdown=0.5))[2] == (0, 150)  # one extra node, same switch
    assert times(run("2x4/1", jobs, gang_slowdown=0.5))[2] == (0, 225)  # and one extra switch
    # Stretched past its time limit, it is stopped at the limit like the controller would.
    late = run("2x4/1", [*jobs[:2], job(2, 0, 2, 100, limit=200)], gang_slowdown=0.5)
    assert times(late)[2] == (0, 200)
    assert summarize(late)["timeouts"] == 1


def test_preemption_with_grace_checkpoint_and_restart_cost() -> None:
    # Two GPUs. A low-QoS job L holds both; a high-QoS job H arrives at 10 units. In the shipped QoS table
    # high may preempt low, with low's grace period of 60 s. L is warned at 10U, stopped at 10U + 60 s; it
    # checkpointed every hour of progress, so it keeps 3600 s of its 6060 s and pays a 300 s restart.
    low = replace(job(0, 0, 2, 1000, limit=2000), qos="low")
    high = replace(job(1, 10, 2, 100, limit=200), qos="high")
    without = run("1x2", [low, high], "garrison")
    assert times(without) == [(0, 1000), (1000, 1100)] and without.preemptions == 0
    cluster = parse_cluster("1x2")
    result = replay(cluster, [low, high], load_policy("garrison", preemption=True),
                    ReplayOptions(checkpoint_interval_s=3600, restart_cost_s=300))
    stop = 10 * U + 60
    (l_job, h_job) = result.jobs
    assert (h_job.first_start, h_job.end) == (stop, stop + 100 * U)
    assert l_job.first_start == 0 and l_job.preemptions == 1
    assert l_job.end == pytest.approx(stop + 100 * U + (1000 * U - 3600 + 300))
    assert result.preemptions == 1
    assert result.gpu_hours_lost == pytest.approx(2 * (stop - 3600 + 300) / 3600)
    assert result.start_order == [1, 2]


def test_replays_are_deterministic() -> None:
    jobs = [job(i, i * 7 % 13, 1 + i % 8, 10 + i % 17, limit=40) for i in range(60)]
    first, second = run("3x8", jobs), run("3x8", jobs)
    assert first.start_order == second.start_order
    assert {k: v for k, v in summarize(first).items() if k != "wall_s"} == {
        k: v for k, v in summarize(second).items() if k != "wall_s"
    }


def test_the_scheduler_never_sees_true_durations() -> None:
    cluster = parse_cluster("1x8")
    builder = SnapshotBuilder(cluster, policy("garrison"), 0.0)
    secret = TraceJob("x", 2, 0.0, 12345.678, 2, "u", "a", None, 86400)
    builder.job_arrived(1, secret, 0.0)
    assert "12345" not in repr(builder.build())
    builder.job_started(1, 0, Allocation((NodeAllocation("node1", (0, 1)),)), 5.0)
    assert "12345" not in repr(builder.build())


def test_metric_helpers() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert max_min_shares({"a": 10, "b": 1, "c": 3}, 8) == {"b": 1, "c": 3, "a": 4}
    assert max_min_shares({"a": 2, "b": 1}, 8) == {"a": 2, "b": 1}
    assert jain_index([1.0, 1.0, 1.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == 0.25


def test_plotted_averages_keep_the_area_and_stay_within_the_values() -> None:
    times = [0.0, 0.3, 1.0, 2.7, 10.0]
    values = [4, 8, 0, 2, 0]
    centres, averages = step_average(times, values, 7)
    assert len(centres) == len(averages) == 7
    assert sum(a * 10 / 7 for a in averages) == pytest.approx(4 * 0.3 + 8 * 0.7 + 0 * 1.7 + 2 * 7.3)
    assert max(averages) <= 8 and min(averages) >= 0
    # Event times that fall on bin edges exactly (up to float rounding) do not spill into one bin.
    edges = [i / 3 for i in range(31)]
    _, flat = step_average(edges, [96] * 31, 10)
    assert flat == pytest.approx([96.0] * 10)
