#!/usr/bin/env python3
"""gsim at scale: a 100,000-job trace on 54 x 8 GPUs, replayed under each policy. A script, not a test:
prints `key: value` lines.

    python tests/benchmarks/sim_scale.py [--jobs 100000] [--cluster 54x8] [--policy fifo-easy ...]
                                         [--traces ../shared/traces] [--gang-slowdown 0.2]
                                         [--priority-interval 30]

The trace is cluster07 (12,699 jobs over 59 days, ~257 busy GPUs) and cluster08 (13,047 jobs over 42
days, ~66 busy GPUs) from the ElasticFlow ITP traces, merged by arrival time (two teams sharing one
cluster of 432 GPUs: ~75% load on average, queues of thousands at the peaks), and the merged 59 days
repeated back to back until there are --jobs jobs (100,000: four times, 238 days). Time limits and
accounts are drawn by gsim from seed 0. Goal (issue 22): each policy's replay in at most 60 s.

The traces are read from ../shared/traces (beside the repository), which is not part of the project: the
script stops with a one-line error if they are absent. `wall_s` is the replay's wall-clock time, `cpu_s`
its process CPU time (what the goal means on a machine shared with other work); `*_digest` a hash of every
job's start, end, preemptions, timeout and estimates, and of the start order: a speed-up that changes no
plan keeps it (run this script with another checkout's interpreter to compare). --priority-interval S
replays with the daemon's priority recompute interval (ReplayOptions.priority_interval_s): faster, and not
the same plans as gsim's default of pricing every cycle, which is what the goal is judged on.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import tempfile
import time
from pathlib import Path

from garrison.controller.sim.metrics import ReplayResult, summarize
from garrison.controller.sim.policies import POLICY_NAMES
from garrison.controller.sim.replay import ReplayOptions, replay
from garrison.controller.sim.study import prepare
from garrison.controller.sim.trace import CompletionModel


def shared_traces() -> Path:
    """../shared/traces beside the repository (or beside a folder above it, for a git worktree)."""
    repo = Path(__file__).resolve().parents[2]
    for folder in repo.parents:
        if (folder / "shared" / "traces").is_dir():
            return folder / "shared" / "traces"
    return repo.parent / "shared" / "traces"


TRACES = shared_traces()
GOAL_S = 60.0


def build_trace(traces: Path, jobs: int, out: Path) -> float:
    """cluster07 and cluster08 merged by arrival, repeated back to back until ``jobs`` rows; the span of
    one repetition in days."""
    rows: list[tuple[float, str, str]] = []
    for name in ("cluster07.csv", "cluster08.csv"):
        path = traces / name
        if not path.is_file():
            raise SystemExit(f"sim_scale: error: {path} not found (the shared traces are needed: --traces DIR)")
        with path.open(newline="") as handle:
            rows.extend((float(r["submission_time"]), r["duration"], r["num_gpu"]) for r in csv.DictReader(handle))
    rows.sort(key=lambda r: r[0])
    span = rows[-1][0]
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "submission_time", "duration", "num_gpu"])
        for i in range(jobs):
            submit, duration, gpus = rows[i % len(rows)]
            writer.writerow([i + 1, int(submit + (i // len(rows)) * span), duration, gpus])
    return span / 86400


def plan_digest(result: ReplayResult) -> str:
    """A digest of every job's start, end, preemptions, timeout and estimates (at submission and an hour
    ahead): equal digests mean the same plans, which is how a speed-up is checked to change no result."""
    digest = hashlib.sha256()
    for job in result.jobs:
        digest.update(repr((job.job_id, job.first_start, job.end, job.preemptions, job.timed_out,
                            job.estimate_at_submit, job.estimate_hour_before)).encode())
    digest.update(repr(result.start_order).encode())
    return digest.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--cluster", default="54x8")
    parser.add_argument("--policy", action="append", choices=POLICY_NAMES, help="default: every policy")
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--gang-slowdown", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--priority-interval", type=float, default=None,
                        help="seconds (the daemon's 30); default: each policy's own, 0 in gsim")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "cluster07+08.csv"
        span_days = build_trace(args.traces, args.jobs, trace)
        study = prepare(trace, args.cluster, args.policy or ["all"], model=CompletionModel(seed=args.seed),
                        options=ReplayOptions(gang_slowdown=args.gang_slowdown,
                                              priority_interval_s=args.priority_interval))
    print(f"jobs: {len(study.jobs)}")
    print(f"cluster: {args.cluster} ({study.cluster.describe()})")
    print(f"repetition_days: {span_days:.1f}")
    print(f"gang_slowdown: {args.gang_slowdown}")
    if args.priority_interval is not None:
        print(f"priority_interval_s: {args.priority_interval}")
    worst = 0.0
    for policy in study.policies:
        wall, cpu = time.perf_counter(), time.process_time()
        result = replay(study.cluster, study.jobs, policy, study.options)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        summary = summarize(result)
        prefix = policy.name.replace("-", "_")
        print(f"{prefix}_wall_s: {wall:.2f}")
        print(f"{prefix}_cpu_s: {cpu:.2f}")
        print(f"{prefix}_cycles: {result.cycles}")
        print(f"{prefix}_peak_pending: {max(result.queue_length, default=0)}")
        print(f"{prefix}_unfinished: {summary['unfinished']}")
        print(f"{prefix}_avg_jct_s: {float(summary['avg_jct_s']):.1f}")
        print(f"{prefix}_digest: {plan_digest(result)}")
        sys.stdout.flush()
        worst = max(worst, cpu)
    print(f"max_replay_cpu_s: {worst:.2f}")
    print(f"goal_replay_under_{GOAL_S:.0f}s: {'yes' if worst <= GOAL_S else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
