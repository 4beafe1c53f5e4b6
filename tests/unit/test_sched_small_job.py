"""The small-job priority factor (sched/priority.py): fewer GPUs first, on a log scale, from what the job
asks for; the same value in the one-job and the whole-queue pricing, and a config key that reaches the
core's weights."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from sched_helpers import NOW, node, pending

from garrison.config import ConfigError
from garrison.config.loading import parse_config
from garrison.controller.sched.cycle import SchedulerConfig, schedule
from garrison.controller.sched.presets import preset
from garrison.controller.sched.priority import NO_WEIGHTS, PriorityContext, PriorityWeights, small_job_factor
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.sched_settings import scheduler_config
from garrison.model.accounts import Accounting, PartitionDef

ACCOUNTING = Accounting(partitions=(PartitionDef("main", default=True, max_time_s=7 * 86400),))


def test_factor_is_one_for_one_gpu_zero_for_the_cluster_and_log_linear_between() -> None:
    assert small_job_factor(1, 96) == 1.0
    assert small_job_factor(0, 96) == 1.0  # a CPU-only job asks for less than one GPU
    assert small_job_factor(96, 96) == 0.0
    assert small_job_factor(200, 96) == 0.0
    assert small_job_factor(8, 96) == pytest.approx(math.log(12) / math.log(96))  # 0.54
    factors = [small_job_factor(g, 96) for g in (1, 2, 4, 8, 16, 32, 64, 96)]
    assert factors == sorted(factors, reverse=True) and len(set(factors)) == len(factors)
    assert small_job_factor(1, 1) == 1.0 and small_job_factor(2, 1) == 0.0  # a one-GPU cluster


def test_negative_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="small_job"):
        PriorityWeights(small_job=-1)


def snapshot_of(*jobs: object) -> Snapshot:
    return Snapshot(nodes=(node("a", free=set()), node("b", free=set())), pending=tuple(jobs),  # type: ignore[arg-type]
                    running=(), accounting=ACCOUNTING)


def test_fewer_gpus_rank_first_at_the_same_limit_and_age() -> None:
    # Submitted together with the same limit: without the factor the order is by id (the 16-GPU job first);
    # with it the one-GPU job goes first, then the 8-GPU one.
    wide, narrow, middle = pending(1, submit=NOW - 60, gpus=16), pending(2, submit=NOW - 60, gpus=1), \
        pending(3, submit=NOW - 60, gpus=8)
    snapshot = snapshot_of(wide, narrow, middle)
    plain = schedule(snapshot, NOW, SchedulerConfig(weights=NO_WEIGHTS))
    assert plain.order == (1, 2, 3)
    weights = replace(NO_WEIGHTS, small_job=10_000)
    plan = schedule(snapshot, NOW, SchedulerConfig(weights=weights))
    assert plan.order == (2, 3, 1)
    # 16 GPUs: 2 nodes of 8, so log(16/16) = 0; 8 of 16 GPUs: log 2 / log 16 = 0.25; one GPU: 1.
    assert plan.priorities == {1: 0, 2: 10_000, 3: 2_500}


def test_queue_pricing_and_one_job_pricing_agree() -> None:
    weights = replace(preset("garrison").weights, small_job=30_000)
    jobs = [pending(i, submit=NOW - 3600 * i, gpus=g, limit=lim)
            for i, (g, lim) in enumerate(((1, 3600), (4, 7200), (8, 86400), (16, 600), (2, 7 * 86400)), start=1)]
    context = PriorityContext(snapshot_of(*jobs), NOW, weights)
    together = context.priorities(jobs)
    for job in jobs:
        factors = context.factors(job)
        assert together[job.job_id] == factors.total
        assert factors.small_job == small_job_factor(job.spec.total_gpus(), 16)


def test_config_key_reaches_the_weights_and_is_validated() -> None:
    def controller(value: object) -> dict[str, object]:
        return {"controller": {"scheduler": {"priority_weight_small_job": value}}}

    settings = parse_config(controller(12_000), "t.toml").controller.scheduler
    assert scheduler_config(settings).weights.small_job == 12_000
    unset = parse_config({"controller": {}}, "t.toml").controller.scheduler
    assert scheduler_config(unset).weights.small_job == preset("garrison").weights.small_job
    with pytest.raises(ConfigError):
        parse_config(controller(-5), "t.toml")
