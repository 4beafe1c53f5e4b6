#!/usr/bin/env python3
"""Scheduling quality on a real trace, through gsim. A script, not a test: prints `key: value` lines.

    python tests/benchmarks/sim_quality.py [--trace tests/data/cluster06.csv] [--cluster 12x8:dgx-a100/4]
                                           [--seed 0] [--gang-slowdown 0] [--out DIR] [--more-seeds 1,2]

Replays cluster06.csv (ElasticFlow ITP trace: 2,396 jobs over 60 days) on 12 nodes x 8 GPUs under each
policy gsim knows (strict FIFO, FIFO + EASY backfill, and garrison, the daemon's shipped configuration),
and prints each replay's figures and wall time, then the table. Goals (issue 5): each replay in <= 30 s on
the project's 2 cores; garrison's average JCT at least 1.5x better than FIFO+EASY's, with a maximum wait
no worse and a utilisation no lower. The `goal_*` lines say whether each holds; the figures are printed
whatever they are.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from garrison.controller.sim.metrics import summarize
from garrison.controller.sim.policies import POLICY_NAMES, PolicyError, load_policy
from garrison.controller.sim.replay import ReplayOptions, replay
from garrison.controller.sim.report import plain_table, write_plots
from garrison.controller.sim.study import prepare
from garrison.controller.sim.trace import CompletionModel

DATA = Path(__file__).resolve().parents[1] / "data"
KEYS = ("avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_wait_s", "p95_wait_s", "max_wait_s",
        "makespan_s", "utilization", "idle_gpu_hours_waiting", "idle_gpu_hours_fitting", "jain_fairness", "preemptions", "gpu_hours_lost", "cycles", "wall_s")
REPLAY_GOAL_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DATA / "cluster06.csv")
    parser.add_argument("--cluster", default="12x8:dgx-a100/4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gang-slowdown", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=None, help="also write the plots here")
    parser.add_argument("--more-seeds", default="", metavar="N,N,...",
                        help="also replay fifo-easy and garrison with these seeds (other drawn time limits and "
                             "accounts) and print their figures, to see whether a result holds beyond one draw")
    parser.add_argument("--exact-limits", action="store_true",
                        help="also replay fifo-easy and garrison with every time limit equal to the job's true run "
                             "time: what the policies would do if users knew exactly, the best case for any "
                             "policy that goes by limits")
    args = parser.parse_args()

    available, missing = [], {}
    for name in POLICY_NAMES:
        try:
            load_policy(name)
            available.append(name)
        except PolicyError as err:
            missing[name] = str(err)
    study = prepare(args.trace, args.cluster, available, model=CompletionModel(seed=args.seed),
                    options=ReplayOptions(gang_slowdown=args.gang_slowdown))
    print(f"trace: {args.trace.name}")
    print(f"jobs: {len(study.jobs)}")
    print(f"cluster: {args.cluster} ({study.cluster.describe()})")
    print(f"seed: {args.seed}")
    print(f"gang_slowdown: {args.gang_slowdown}")
    for name, reason in missing.items():
        print(f"policy_{name.replace('-', '_')}: unavailable ({reason})")

    results, summaries = [], {}
    for policy in study.policies:
        result = replay(study.cluster, study.jobs, policy, study.options)
        summary = summarize(result)
        results.append(result)
        summaries[policy.name] = summary
        prefix = policy.name.replace("-", "_")
        for key in KEYS:
            value = summary[key]
            print(f"{prefix}_{key}: {value:.4f}" if isinstance(value, float) else f"{prefix}_{key}: {value}")
        sys.stdout.flush()

    walls = [float(s["wall_s"]) for s in summaries.values()]
    print(f"max_replay_wall_s: {max(walls):.2f}")
    print(f"goal_replay_under_{REPLAY_GOAL_S:.0f}s: {'yes' if max(walls) <= REPLAY_GOAL_S else 'no'}")
    garrison, easy = summaries.get("garrison"), summaries.get("fifo-easy")
    if garrison is not None and easy is not None:
        speedup = float(easy["avg_jct_s"]) / float(garrison["avg_jct_s"])
        print(f"garrison_vs_fifo_easy_avg_jct_speedup: {speedup:.3f}")
        print(f"goal_avg_jct_speedup_1_5x: {'yes' if speedup >= 1.5 else 'no'}")
        print(f"goal_max_wait_no_worse: {'yes' if garrison['max_wait_s'] <= easy['max_wait_s'] else 'no'}")
        no_lower = float(garrison["utilization"]) >= float(easy["utilization"]) - 1e-9
        print(f"goal_utilization_no_lower: {'yes' if no_lower else 'no'}")
    else:
        print("garrison_vs_fifo_easy_avg_jct_speedup: n/a (a policy is unavailable)")
    print()
    print(plain_table(list(summaries.values())))
    if args.out is not None:
        for path in write_plots(results, args.out):
            print(f"plot: {path}")
    for seed in [int(s) for s in args.more_seeds.split(",") if s.strip()]:
        print()
        more_seeds(args, seed)
    if args.exact_limits:
        print()
        exact_limits(args)
    return 0


def more_seeds(args: argparse.Namespace, seed: int) -> None:
    """fifo-easy and garrison under another seed: the same `key: value` lines, prefixed seed_<n>_."""
    study = prepare(args.trace, args.cluster, ["fifo-easy", "garrison"], model=CompletionModel(seed=seed),
                    options=ReplayOptions(gang_slowdown=args.gang_slowdown))
    figures = {}
    for policy in study.policies:
        summary = summarize(replay(study.cluster, study.jobs, policy, study.options))
        figures[policy.name] = summary
        prefix = f"seed_{seed}_{policy.name.replace('-', '_')}"
        for key in ("avg_jct_s", "max_wait_s", "utilization", "jain_fairness"):
            print(f"{prefix}_{key}: {float(summary[key]):.4f}")
    easy, garrison = figures["fifo-easy"], figures["garrison"]
    print(f"seed_{seed}_garrison_vs_fifo_easy_avg_jct_speedup: "
          f"{float(easy['avg_jct_s']) / float(garrison['avg_jct_s']):.3f}")


def exact_limits(args: argparse.Namespace) -> None:
    """fifo-easy and garrison when every limit is the true run time (rounded up to the minute): the
    `key: value` lines prefixed exact_limits_. Separates what a policy's order costs from what users'
    overestimated limits cost."""
    study = prepare(args.trace, args.cluster, ["fifo-easy", "garrison"], model=CompletionModel(seed=args.seed),
                    options=ReplayOptions(gang_slowdown=args.gang_slowdown))
    jobs = [replace(job, time_limit_s=60 * math.ceil(job.duration_s / 60)) for job in study.jobs]
    for policy in study.policies:
        summary = summarize(replay(study.cluster, jobs, policy, study.options))
        prefix = f"exact_limits_{policy.name.replace('-', '_')}"
        for key in ("avg_jct_s", "max_wait_s", "makespan_s", "utilization"):
            print(f"{prefix}_{key}: {float(summary[key]):.4f}")


if __name__ == "__main__":
    sys.exit(main())
