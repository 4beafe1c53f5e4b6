#!/usr/bin/env python3
"""Scheduling quality on every shared trace, through gsim. A script, not a test: prints `key: value` lines.

    python tests/benchmarks/sim_quality.py [--traces ../shared/traces] [--only cluster06,cluster02]
                                           [--seeds 0,1,2] [--gang-slowdown 0.2] [--jobs 2] [--frontier]

Replays each trace of ../shared/traces at the size its README gives (cluster02 and cluster06 on 12 x 8
GPUs, cluster07 on 40 x 8, cluster08 on 10 x 8; DGX A100 nodes, 4 per leaf switch) under fifo-easy and
garrison (the daemon's shipped configuration), once per seed (the seed draws time limits and accounts,
docs/gsim.md), with a gang slowdown of 0.2 (a gang spread over more nodes or switches than it needs runs
20% longer for each). For every trace and seed it prints both policies' figures and each goal of issue 22
with whether it holds, garrison against fifo-easy:

- avg_jct: average JCT at least 1.5x better;
- p99_wait, max_wait: no worse;
- idle_fitting: GPU-hours left idle while a waiting job would have fitted, no more;
- jain: Jain's fairness across accounts under contention at least 0.9.

With --frontier it also replays the variants below (the knobs that trade average JCT against the longest
waits) and prints, per variant, its worst case over every trace and seed and which goals hold everywhere;
when no variant meets them all, the one kept is the one whose maximum wait is no worse everywhere with
the best worst-case JCT speed-up (maximum wait wins over average JCT).

The traces are not part of the project: the script stops with a one-line error if they are absent.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path

from garrison.controller.sim.metrics import summarize
from garrison.controller.sim.policies import Policy
from garrison.controller.sim.replay import ReplayOptions, replay
from garrison.controller.sim.study import Study, prepare
from garrison.controller.sim.trace import CompletionModel

# Trace -> the cluster its README sizes it for.
TRACES = {
    "cluster02": "12x8:dgx-a100/4",
    "cluster06": "12x8:dgx-a100/4",
    "cluster07": "40x8:dgx-a100/4",
    "cluster08": "10x8:dgx-a100/4",
}
KEYS = ("avg_jct_s", "p99_wait_s", "max_wait_s", "idle_gpu_hours_fitting", "jain_fairness", "utilization",
        "preemptions", "wall_s")
DAY = 86400.0


def shared_traces() -> Path:
    """../shared/traces beside the repository (or beside a folder above it, for a git worktree)."""
    repo = Path(__file__).resolve().parents[2]
    for folder in repo.parents:
        if (folder / "shared" / "traces").is_dir():
            return folder / "shared" / "traces"
    return repo.parent / "shared" / "traces"


@dataclass(frozen=True)
class Variant:
    """garrison with some weights changed (empty: the shipped preset)."""

    name: str
    weights: tuple[tuple[str, float], ...] = ()
    settings: tuple[tuple[str, float], ...] = ()  # SchedulerConfig fields (reservations, window_s)

    def apply(self, policy: Policy) -> Policy:
        config = policy.config
        if self.weights:
            config = replace(config, weights=replace(config.weights, **dict(self.weights)))
        if self.settings:
            config = replace(config, **dict(self.settings))
        return replace(policy, config=config)


SHIPPED = Variant("garrison")
# Along the trade-off: a shorter bound (waits nearer FIFO's), a longer one (more JCT, longer waits), none
# (the previous preset: shortest limits first, age worth 30 days), and the shipped bound with 1 reservation.
FRONTIER = (
    Variant("overdue-2d", (("overdue_after_s", 2 * DAY),)),
    Variant("overdue-8d", (("overdue_after_s", 8 * DAY),)),
    Variant("no-overdue", (("overdue", 0), ("overdue_after_s", 0.0))),
    Variant("overdue-4d-1-reservation", (), (("reservations", 1),)),
)
# Candidates tried for issue 22 beyond the frontier (--variants NAME,...): the reservations go to the
# longest waiters (a job is overdue once it has waited a share of the longest wait in the queue now, at
# least an hour), the rest of the queue by priority (shorter limits first), with few reservations so that
# backfill leaves no GPU idle that fifo-easy would have used.
OLDEST = (("overdue_after_s", 3600.0),)
LAS_WEIGHTS = (("attained_service", 50_000), ("attained_starvation", 8.0))
LAS_PREEMPTION = (("preemption", True), ("preempt_attained", True))
EASY_OVERDUE = (("reservations", 1), ("reserve_every_overdue", True))
OVERDUE_ONLY = (("reservations", 0), ("reserve_every_overdue", True))
CANDIDATES = {v.name: v for v in (
    Variant("oldest90-1r", (*OLDEST, ("overdue_share", 0.9)), (("reservations", 1),)),
    Variant("oldest90-2r", (*OLDEST, ("overdue_share", 0.9)), (("reservations", 2),)),
    Variant("oldest75-1r", (*OLDEST, ("overdue_share", 0.75)), (("reservations", 1),)),
    Variant("oldest90-1r-fair30", (*OLDEST, ("overdue_share", 0.9), ("fair_share", 30_000)),
            (("reservations", 1),)),
    # Fair share worth half a QoS tier (the shipped weight is 5 days of age): the lever on Jain's index.
    Variant("fair50", (("fair_share", 50_000),)),
    Variant("fair20", (("fair_share", 20_000),)),
    # Smooth aging instead of the overdue cliff: a shorter limit is worth only a day or two of waiting, so a
    # job is overtaken only by jobs submitted less than that after it.
    Variant("limit-1d", (("time_limit", 1_000), ("overdue", 0), ("overdue_after_s", 0.0))),
    Variant("limit-2d", (("time_limit", 2_000), ("overdue", 0), ("overdue_after_s", 0.0))),
    Variant("limit-4d", (("time_limit", 4_000), ("overdue", 0), ("overdue_after_s", 0.0))),
    # Wider jobs first (Slurm's job-size factor): a job as wide as the cluster is worth 2 or 8 days of age.
    Variant("size-2d", (("job_size", 2_000),)),
    Variant("size-8d", (("job_size", 8_000),)),
    # Fewer GPUs first (the small_job factor), at a third of, or the same weight as, the time-limit factor.
    Variant("small-10d", (("small_job", 10_000),)),
    Variant("small-30d", (("small_job", 30_000),)),
    Variant("small-30d-fair50", (("small_job", 30_000), ("fair_share", 50_000))),
    # Attained service (Tiresias' two-queue LAS, sched/attained.py): a job with less than 1, 16 or 64 GPU-hours
    # of service is in the high queue (worth 50 days of age, below the overdue bound's 100,000), and may preempt
    # running jobs that have had more; a job that waited 8 times its last run is promoted back. gsim charges
    # each preemption its restart cost (300 s) and the work since the last hourly checkpoint. The smaller the
    # threshold, the more preemptions and the slower the replay (docs/gsim.md: las-1h too slow to run).
    # One reservation as in EASY for the queue's order plus one for every overdue job (reserve_every_overdue):
    # fewer GPUs held idle for jobs that have not waited long, the bound on the longest waits kept.
    Variant("easy-overdue", (), EASY_OVERDUE),
    Variant("easy-overdue-small-30d", (("small_job", 30_000),), EASY_OVERDUE),
    # The same with no reservation for jobs that are not overdue (greedy backfill until the bound), and with
    # the bound following the load (half the longest wait now, at least a day).
    Variant("overdue-only", (), OVERDUE_ONLY),
    Variant("overdue-only-small-30d", (("small_job", 30_000),), OVERDUE_ONLY),
    Variant("easy-overdue-small-30d-half1d", (("small_job", 30_000), ("overdue_after_s", DAY), ("overdue_share", 0.5)),
            EASY_OVERDUE),
    Variant("las-1h", LAS_WEIGHTS + (("attained_threshold_gpu_s", 3600.0),), LAS_PREEMPTION),
    Variant("las-16h", LAS_WEIGHTS + (("attained_threshold_gpu_s", 16 * 3600.0),), LAS_PREEMPTION),
    Variant("las-64h", LAS_WEIGHTS + (("attained_threshold_gpu_s", 64 * 3600.0),), LAS_PREEMPTION),
)}


def goals(easy: dict[str, float], garrison: dict[str, float]) -> dict[str, tuple[float, bool]]:
    """Each goal's figure (garrison against fifo-easy) and whether it holds."""
    speedup = easy["avg_jct_s"] / garrison["avg_jct_s"] if garrison["avg_jct_s"] else 0.0

    def ratio(key: str) -> float:
        return garrison[key] / easy[key] if easy[key] else (1.0 if not garrison[key] else float("inf"))

    return {
        "avg_jct_speedup": (speedup, speedup >= 1.5),
        "p99_wait_ratio": (ratio("p99_wait_s"), garrison["p99_wait_s"] <= easy["p99_wait_s"]),
        "max_wait_ratio": (ratio("max_wait_s"), garrison["max_wait_s"] <= easy["max_wait_s"]),
        "idle_fitting_ratio": (ratio("idle_gpu_hours_fitting"),
                               garrison["idle_gpu_hours_fitting"] <= easy["idle_gpu_hours_fitting"] + 1e-9),
        "jain": (garrison["jain_fairness"], garrison["jain_fairness"] >= 0.9),
    }


_STUDIES: dict[tuple[str, int, float], Study] = {}


def _run(task: tuple[str, str, int, float, str, Variant | None]) -> tuple[str, int, str, dict[str, float]]:
    trace_path, cluster, seed, gang, policy_name, variant = task
    key = (trace_path, seed, gang)
    study = _STUDIES.get(key)
    if study is None:
        study = _STUDIES[key] = prepare(trace_path, cluster, ["fifo-easy", "garrison"],
                                        model=CompletionModel(seed=seed), options=ReplayOptions(gang_slowdown=gang))
    policy = next(p for p in study.policies if p.name == policy_name)
    if variant is not None:
        policy = variant.apply(policy)
    summary = summarize(replay(study.cluster, study.jobs, policy, study.options))
    label = variant.name if variant is not None else policy_name
    return Path(trace_path).stem, seed, label, {k: float(summary[k]) for k in KEYS}


def _cache_key(trace: str, seed: int, gang: float) -> str:
    return f"{trace}/{seed}/{gang}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, default=shared_traces())
    parser.add_argument("--only", default=",".join(TRACES), help="comma-separated trace names")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--gang-slowdown", type=float, default=0.2)
    parser.add_argument("--jobs", type=int, default=2, help="replays run in parallel")
    parser.add_argument("--frontier", action="store_true", help="also replay the trade-off variants")
    parser.add_argument("--variants", default="", help=f"also replay these candidates: {', '.join(CANDIDATES)}")
    parser.add_argument("--candidates-only", action="store_true",
                        help="replay only fifo-easy and the --variants, not the shipped preset")
    parser.add_argument("--baseline-cache", type=Path, default=None,
                        help="JSON file of fifo-easy's figures: read if present, written after the run "
                             "(fifo-easy does not change with garrison's policy)")
    args = parser.parse_args()

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    for name in names:
        if name not in TRACES:
            raise SystemExit(f"sim_quality: error: unknown trace {name!r} (known: {', '.join(TRACES)})")
        if not (args.traces / f"{name}.csv").is_file():
            raise SystemExit(f"sim_quality: error: {args.traces / f'{name}.csv'} not found (--traces DIR)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    extra = [CANDIDATES[n.strip()] for n in args.variants.split(",") if n.strip()]
    shipped = [] if args.candidates_only and extra else [SHIPPED]
    variants: Sequence[Variant | None] = [None, *shipped, *(FRONTIER if args.frontier else ()), *extra]
    results: dict[tuple[str, int, str], dict[str, float]] = {}
    cached: dict[str, dict[str, float]] = {}
    if args.baseline_cache is not None and args.baseline_cache.is_file():
        cached = json.loads(args.baseline_cache.read_text())
    tasks = [(str(args.traces / f"{name}.csv"), TRACES[name], seed, args.gang_slowdown,
              "fifo-easy" if v is None else "garrison", v)
             for name in names for seed in seeds for v in variants
             if v is not None or _cache_key(name, seed, args.gang_slowdown) not in cached]
    for name in names:
        for seed in seeds:
            figures = cached.get(_cache_key(name, seed, args.gang_slowdown))
            if figures is not None:
                results[(name, seed, "fifo-easy")] = figures
    print(f"gang_slowdown: {args.gang_slowdown}")
    print(f"seeds: {','.join(map(str, seeds))}")
    with Pool(args.jobs) as pool:
        for trace, seed, label, figures in pool.imap_unordered(_run, tasks):
            results[(trace, seed, label)] = figures
            prefix = f"{trace}_s{seed}_{label.replace('-', '_')}"
            for k in KEYS:
                print(f"{prefix}_{k}: {figures[k]:.4f}")
            sys.stdout.flush()
    if args.baseline_cache is not None:
        for (name, seed, label), figures in results.items():
            if label == "fifo-easy":
                cached[_cache_key(name, seed, args.gang_slowdown)] = figures
        args.baseline_cache.write_text(json.dumps(cached, indent=1, sort_keys=True))

    print()
    labels = [v.name for v in variants if v is not None]
    worst: dict[str, dict[str, tuple[float, bool]]] = {}
    for label in labels:
        everywhere: dict[str, tuple[float, bool]] = {}
        for name in names:
            for seed in seeds:
                held = goals(results[(name, seed, "fifo-easy")], results[(name, seed, label)])
                if label == SHIPPED.name or args.candidates_only:
                    cluster = TRACES[name]
                    print(f"{name}_s{seed}_{label}: cluster {cluster}; " + "; ".join(
                        f"{goal} {value:.3f} {'yes' if ok else 'NO'}" for goal, (value, ok) in held.items()))
                for goal, (value, ok) in held.items():
                    # worst case: the smallest speed-up and Jain, the largest ratios
                    before = everywhere.get(goal)
                    pick_min = goal in ("avg_jct_speedup", "jain")
                    if before is None:
                        everywhere[goal] = (value, ok)
                    else:
                        value = min(before[0], value) if pick_min else max(before[0], value)
                        everywhere[goal] = (value, before[1] and ok)
        worst[label] = everywhere
    print()
    for label, everywhere in worst.items():
        prefix = label.replace("-", "_")
        for goal, (value, ok) in everywhere.items():
            print(f"{prefix}_worst_{goal}: {value:.3f}")
            print(f"{prefix}_goal_{goal}_everywhere: {'yes' if ok else 'no'}")
        print(f"{prefix}_all_goals_everywhere: {'yes' if all(ok for _, ok in everywhere.values()) else 'no'}")
    if args.frontier or extra:
        meeting = [label for label, e in worst.items() if all(ok for _, ok in e.values())]
        if meeting:
            chosen = max(meeting, key=lambda label: worst[label]["avg_jct_speedup"][0])
        else:
            # The goals cannot all hold at once: maximum wait no worse wins over average JCT.
            bounded = [label for label, e in worst.items() if e["max_wait_ratio"][1]]
            if bounded:
                chosen = max(bounded, key=lambda label: worst[label]["avg_jct_speedup"][0])
            else:
                chosen = min(worst, key=lambda label: worst[label]["max_wait_ratio"][0])
        print(f"frontier_all_goals_met_by: {','.join(meeting) or 'none'}")
        print(f"frontier_choice: {chosen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
