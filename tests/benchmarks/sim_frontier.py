#!/usr/bin/env python3
"""How much average JCT can a garrison configuration buy without losing utilisation? A script, not a test:
prints `key: value` lines.

    python tests/benchmarks/sim_frontier.py [--variants 150] [--seeds 0,1,2] [--rng 1] [--jobs 2]
                                            [--trace tests/data/cluster06.csv] [--cluster 12x8:dgx-a100/4]

Draws ``--variants`` random scheduler configurations from the knobs an admin has in garrison.toml
(`[controller.scheduler]`: the time-limit, age, job-size and fair-share weights, the age horizon, the
time limit that scores 0, the number of reservations) and replays the trace under each, and under
fifo-easy, once per seed (the seed draws the time limits and accounts, docs/gsim.md). For each variant it
prints its worst case over the seeds: the smallest average-JCT speed-up over fifo-easy, the largest
excess of maximum wait and the largest utilisation deficit (points). Then, for each speed-up threshold,
the best worst-case utilisation a variant reaching it got, and whether any variant met all of issue 5's
goals (at least 1.5x, maximum wait no worse, utilisation no lower) on every seed.

Each replay takes 2-7 s on the project's 2-core machines: 150 variants on 3 seeds take 8-20 minutes
with --jobs 2.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path

from garrison.controller.sim.metrics import summarize
from garrison.controller.sim.policies import Policy
from garrison.controller.sim.replay import replay
from garrison.controller.sim.study import Study, prepare
from garrison.controller.sim.trace import CompletionModel

DATA = Path(__file__).resolve().parents[1] / "data"
DAY = 86400.0
THRESHOLDS = (1.2, 1.3, 1.4, 1.5, 1.75, 2.0)


@dataclass(frozen=True)
class Variant:
    time_limit: int
    age_days: int
    job_size: int
    fair_share: int
    long_limit_h: int
    reservations: int

    def describe(self) -> str:
        return (f"time_limit={self.time_limit} age={1000 * self.age_days}/{self.age_days}d "
                f"job_size={self.job_size} fair_share={self.fair_share} long_limit={self.long_limit_h}h "
                f"reservations={self.reservations}")

    def apply(self, policy: Policy) -> Policy:
        weights = replace(policy.config.weights, time_limit=self.time_limit, age=1000 * self.age_days,
                          max_age_s=self.age_days * DAY, job_size=self.job_size, fair_share=self.fair_share,
                          long_limit_s=self.long_limit_h * 3600.0)
        return replace(policy, config=replace(policy.config, weights=weights, reservations=self.reservations))


def draw(rng: random.Random) -> Variant:
    return Variant(
        time_limit=rng.choice([10_000, 20_000, 30_000, 45_000, 60_000]),
        age_days=rng.choice([7, 14, 30, 60]),
        job_size=rng.choice([0, 0, 5_000, 20_000, 50_000]),
        fair_share=rng.choice([0, 5_000, 10_000]),
        long_limit_h=rng.choice([24, 72, 168, 336]),
        reservations=rng.choice([1, 2, 4, 8]),
    )


_STUDIES: dict[int, Study] = {}
_ARGS: argparse.Namespace | None = None


def _study(seed: int) -> Study:
    assert _ARGS is not None
    if seed not in _STUDIES:
        _STUDIES[seed] = prepare(_ARGS.trace, _ARGS.cluster, ["fifo-easy", "garrison"],
                                 model=CompletionModel(seed=seed))
    return _STUDIES[seed]


def _init(args: argparse.Namespace) -> None:
    global _ARGS
    _ARGS = args


def _replay(task: tuple[int, Variant | None, int]) -> tuple[int, int, dict[str, float]]:
    """(variant index, or -1 for fifo-easy; seed; figures)."""
    index, variant, seed = task
    study = _study(seed)
    easy, garrison = study.policies
    policy = easy if variant is None else variant.apply(garrison)
    summary = summarize(replay(study.cluster, study.jobs, policy, study.options))
    return index, seed, {k: float(summary[k]) for k in ("avg_jct_s", "max_wait_s", "utilization")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DATA / "cluster06.csv")
    parser.add_argument("--cluster", default="12x8:dgx-a100/4")
    parser.add_argument("--variants", type=int, default=150)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rng", type=int, default=1, help="seed of the draw of configurations")
    parser.add_argument("--jobs", type=int, default=2, help="replays run at once")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rng = random.Random(args.rng)
    variants = [draw(rng) for _ in range(args.variants)]
    tasks: list[tuple[int, Variant | None, int]] = [(-1, None, s) for s in seeds]
    tasks += [(i, v, s) for i, v in enumerate(variants) for s in seeds]
    with Pool(args.jobs, initializer=_init, initargs=(args,)) as pool:
        results = pool.map(_replay, tasks, chunksize=1)
    easy = {seed: figures for index, seed, figures in results if index < 0}
    by_variant: dict[int, dict[int, dict[str, float]]] = {}
    for index, seed, figures in results:
        if index >= 0:
            by_variant.setdefault(index, {})[seed] = figures

    print(f"trace: {args.trace.name}")
    print(f"cluster: {args.cluster}")
    print(f"seeds: {','.join(map(str, seeds))}")
    print(f"variants: {len(variants)}")
    for seed in seeds:
        e = easy[seed]
        print(f"fifo_easy_seed_{seed}: avg_jct {e['avg_jct_s'] / 3600:.2f} h, max_wait {e['max_wait_s'] / DAY:.2f} d, "
              f"utilization {100 * e['utilization']:.2f}%")
    worst: list[tuple[float, float, float, Variant]] = []  # speed-up, wait excess (d), utilisation gap (points)
    for index, variant in enumerate(variants):
        per_seed = by_variant[index]
        speedup = min(easy[s]["avg_jct_s"] / per_seed[s]["avg_jct_s"] for s in seeds)
        wait_excess = max((per_seed[s]["max_wait_s"] - easy[s]["max_wait_s"]) / DAY for s in seeds)
        util_gap = min(100 * (per_seed[s]["utilization"] - easy[s]["utilization"]) for s in seeds)
        worst.append((speedup, wait_excess, util_gap, variant))
        print(f"variant_{index}: speedup {speedup:.2f}x, max_wait_excess {wait_excess:+.2f} d, "
              f"utilization_gap {util_gap:+.2f} points ({variant.describe()})")
    for threshold in THRESHOLDS:
        reaching = [w for w in worst if w[0] >= threshold]
        if not reaching:
            print(f"best_utilization_gap_at_{threshold}x: none reach it")
            continue
        best = max(reaching, key=lambda w: w[2])
        print(f"best_utilization_gap_at_{threshold}x: {best[2]:+.2f} points ({best[3].describe()})")
    met = [w for w in worst if w[0] >= 1.5 and w[1] <= 0 and w[2] >= 0]
    print(f"variants_meeting_every_goal_on_every_seed: {len(met)}")
    for speedup, _, gap, variant in met:
        print(f"meets_goals: {speedup:.2f}x, {gap:+.2f} points ({variant.describe()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
