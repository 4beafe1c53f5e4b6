#!/usr/bin/env python3
"""How long one scheduling cycle takes on big clusters. A script, not a test: prints `key: value`.

    python tests/benchmarks/sched_cycle.py [--nodes 100,300,1000] [--pending N] [--busy 0.9] [--cycles 9] [--seed 1]

For each cluster size: N nodes x 8 GPUs (DGX A100 inventories) under 8 leaf switches of up to 16 nodes per
block, registered in a real ClusterState (in-memory SQLite store), 90% of the GPUs busy with jobs drawn from
the job-size mix of tests/data/cluster06.csv (gangs up to 64 GPUs) whose time limits end at staggered
times (``--busy``: another fraction; 1 fills every GPU it can), and 10 pending jobs per node from the same
mix (``--pending``: that many in all, e.g. 50,000 on 4 nodes, issue 23's deep queue), spread over 8 accounts and 40 users. Each measured
cycle follows 1% of the running jobs ending and 1% new jobs arriving, and times what the daemon's
scheduler loop does: the snapshot from memory (Policy.snapshot), ``schedule`` with the daemon's default
configuration (the ``garrison`` policy: fair share, backfill with reservations, topology), and applying
the plan (ClusterState.apply_plan: the ledger's re-check, the store write, memory), which the policy then
remembers (its pricing context is the next snapshot's, as in the daemon). The virtual clock then moves on
``--step-s`` (30 s: every cycle recomputes priorities, the daemon's priority interval being 30 s; 1 s:
cycles in between, which price only the jobs that changed).

Prints median_ms_nodes_<N> for each size (the whole cycle; cpu_ms its CPU time, which a machine loaded by
others stretches less; plan_ms without applying the plan; snapshot_ms;
starts and reservations per cycle),
then growth_1000_vs_100 = median at the largest size / median at the smallest.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from pathlib import Path

from garrison.config import AccountConfig, ControllerConfig, SwitchConfig
from garrison.controller.policy import Policy
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle import schedule
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, request_for
from garrison.controller.state import ClusterState
from garrison.controller.store import open_store
from garrison.model.domain import Gpu, Job, JobSpec, NodeInventory, NodeResult, RankOutcome

TRACE = Path(__file__).resolve().parent.parent / "data" / "cluster06.csv"
GPUS_PER_NODE = 8
ACCOUNTS = [f"team{i}" for i in range(8)]
USERS = 40
BUSY_FRACTION = 0.9


def trace_jobs() -> list[tuple[int, int]]:
    """(GPUs, duration in seconds) of every trace job."""
    with open(TRACE) as fh:
        return [(int(row["num_gpu"]), int(float(row["duration"]))) for row in csv.DictReader(fh)]


def a100(name: str) -> NodeInventory:
    gpus = tuple(
        Gpu(i, f"GPU-{name}-{i}", "NVIDIA A100-SXM4-40GB", 40960, f"0000:{i:02x}:00.0", i // 4,
            "0-63" if i < 4 else "64-127")
        for i in range(GPUS_PER_NODE)
    )
    nvlink = tuple(tuple(0 if i == j else 12 for j in range(GPUS_PER_NODE)) for i in range(GPUS_PER_NODE))
    topo = tuple(tuple("X" if i == j else "NV12" for j in range(GPUS_PER_NODE)) for i in range(GPUS_PER_NODE))
    return NodeInventory(name, gpus, nvlink, topo, cpus=128, memory_mb=1_000_000, model="dgx-a100")


class Workload:
    def __init__(self, rng: random.Random, mix: list[tuple[int, int]], cpus_per_gpu: int = 0, mem_mb: int = 0) -> None:
        self.rng = rng
        self.mix = mix
        self.next_id = 1
        self.cpus_per_gpu = cpus_per_gpu
        self.mem_mb = mem_mb

    def job(self, submit: float) -> Job:
        gpus, duration = self.rng.choice(self.mix)
        limit = min(7 * 86400, max(600, int(duration * 1.5)))
        job_id = self.next_id
        self.next_id += 1
        user = self.rng.randrange(USERS)
        return Job(
            job_id=job_id,
            spec=JobSpec(name="bench", command=("sleep", str(duration)), gpus=gpus, time_limit_s=limit,
                         cpus_per_gpu=self.cpus_per_gpu, mem_mb=self.mem_mb),
            user=f"user{user}",
            uid=10_000 + user,
            gid=10_000,
            account=ACCOUNTS[user % len(ACCOUNTS)],
            partition="main",
            time_limit_s=limit,
            submit_time=submit,
        )


def build_cluster(
    nodes: int, seed: int, cpus_per_gpu: int = 0, mem_mb: int = 0, pending: int | None = None,
    busy_fraction: float = BUSY_FRACTION,
) -> tuple[ClusterState, Policy, Workload, float]:
    rng = random.Random(seed)
    now = 1_800_000_000.0
    names = [f"n{i:04d}" for i in range(nodes)]
    switches = [SwitchConfig(f"leaf{i}", nodes=tuple(names[i * 16:(i + 1) * 16])) for i in range((nodes + 15) // 16)]
    switches += [SwitchConfig(f"block{b}", switches=tuple(s.name for s in switches[b * 8:(b + 1) * 8]))
                 for b in range((len(switches) + 7) // 8)]
    config = ControllerConfig(
        database="sqlite://",
        accounts=("default", *ACCOUNTS),
        account_settings=(AccountConfig("default"), *(AccountConfig(a) for a in ACCOUNTS)),
        switches=tuple(switches),
    )
    state = ClusterState(open_store("sqlite://"), heartbeat_timeout_s=1e9)
    state.load(now, 1e9)
    policy = Policy(config, state, now)
    for name in names:
        state.register_node(name, a100(name), policy.node_partitions(name), [], [], now)
    workload = Workload(rng, trace_jobs(), cpus_per_gpu, mem_mb)

    # Fill 90% of the GPUs with running jobs placed by the real placer, started at staggered times.
    capacity = Capacity(policy.snapshot().nodes)
    placer = Placer(build_pipeline())
    busy, target = 0, busy_fraction * nodes * GPUS_PER_NODE
    misses = 0
    while busy < target and misses < 50:
        job = workload.job(now - 86400)
        request = request_for(job.job_id, job.spec, "main", job.time_limit_s)
        allocation = placer.place(request, lambda r: capacity.stream(r, 0.0))
        if allocation is None or busy + allocation.gpu_count() > target + GPUS_PER_NODE:
            misses += 1
            continue
        capacity.take(allocation)
        busy += allocation.gpu_count()
        state.add_jobs([job])
        started = now - rng.uniform(0, job.time_limit_s * 0.9)
        state.start_attempts([(job.job_id, allocation)], started)
    count = 10 * nodes if pending is None else pending
    state.add_jobs([workload.job(now - rng.uniform(0, 7200)) for _ in range(count)])
    return state, policy, workload, now


def end_some(state: ClusterState, rng: random.Random, fraction: float, now: float) -> None:
    live = sorted(state.live.values(), key=lambda a: (a.job_id, a.attempt))
    for attempt in rng.sample(live, max(1, int(len(live) * fraction))):
        for node in list(attempt.pending_nodes):
            ranks = tuple(RankOutcome(r, 0) for r in range(len(attempt.allocation.gpus_on(node))))
            state.node_finished(node, NodeResult(attempt.job_id, attempt.attempt, ranks), now)


def measure(
    nodes: int, cycles: int, seed: int, cpus_per_gpu: int = 0, mem_mb: int = 0, pending_jobs: int | None = None,
    busy_fraction: float = BUSY_FRACTION, step_s: float = 30.0,
) -> dict[str, float]:
    state, policy, workload, now = build_cluster(nodes, seed, cpus_per_gpu, mem_mb, pending_jobs, busy_fraction)
    rng = random.Random(seed + 1)
    config = policy.scheduler
    totals: list[float] = []
    cpus: list[float] = []
    snapshots: list[float] = []
    plans: list[float] = []
    starts: list[int] = []
    reservations: list[int] = []
    pending = sum(1 for j in state.jobs.values() if j.state.value == "PENDING")
    running = len(state.live)
    for cycle in range(cycles + 1):
        now += step_s
        end_some(state, rng, 0.01, now)
        state.add_jobs([workload.job(now) for _ in range(max(1, pending // 100))])
        policy.charge_usage(now)
        began, began_cpu = time.perf_counter(), time.thread_time()
        snapshot = policy.snapshot()
        built = time.perf_counter()
        plan = schedule(snapshot, now, config)
        planned = time.perf_counter()
        state.apply_plan(plan, now)  # the ledger's re-check, the store write, memory (as the daemon applies it)
        policy.remember(snapshot, plan, now)
        done, done_cpu = time.perf_counter(), time.thread_time()
        if cycle == 0:
            continue  # the first cycle fills the views' caches, as the daemon's first cycle does
        totals.append((done - began) * 1000)
        cpus.append((done_cpu - began_cpu) * 1000)
        plans.append((planned - began) * 1000)
        snapshots.append((built - began) * 1000)
        starts.append(len(plan.starts))
        reservations.append(len(plan.reservations))
    state.store.close()
    return {
        "median_ms": statistics.median(totals),
        "cpu_ms": statistics.median(cpus),
        "plan_ms": statistics.median(plans),
        "snapshot_ms": statistics.median(snapshots),
        "max_ms": max(totals),
        "starts": statistics.mean(starts),
        "reservations": statistics.mean(reservations),
        "pending": pending,
        "running": running,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,300,1000", help="cluster sizes, comma separated")
    parser.add_argument("--cycles", type=int, default=9, help="measured cycles per size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpus-per-gpu", type=int, default=0,
                        help="every job asks for this many CPUs per GPU (the nodes have 128 CPUs: 16 each)")
    parser.add_argument("--mem", type=int, default=0, metavar="MB",
                        help="every job asks for this much host memory per node (the nodes have 1,000,000 MB)")
    parser.add_argument("--pending", type=int, default=None,
                        help="pending jobs in all at each size (default: 10 per node)")
    parser.add_argument("--busy", type=float, default=BUSY_FRACTION,
                        help="fraction of the GPUs busy with running jobs at the start (default 0.9)")
    parser.add_argument("--step-s", type=float, default=30.0,
                        help="virtual seconds between cycles (default 30: each cycle recomputes priorities)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    results = {}
    for nodes in sizes:
        r = measure(nodes, args.cycles, args.seed, args.cpus_per_gpu, args.mem, args.pending, args.busy, args.step_s)
        results[nodes] = r
        print(f"median_ms_nodes_{nodes}: {r['median_ms']:.1f}")
        print(f"cpu_ms_nodes_{nodes}: {r['cpu_ms']:.1f}")
        print(f"plan_ms_nodes_{nodes}: {r['plan_ms']:.1f}")
        print(f"snapshot_ms_nodes_{nodes}: {r['snapshot_ms']:.1f}")
        print(f"max_ms_nodes_{nodes}: {r['max_ms']:.1f}")
        print(f"pending_jobs_nodes_{nodes}: {r['pending']}")
        print(f"running_jobs_nodes_{nodes}: {r['running']}")
        print(f"starts_per_cycle_nodes_{nodes}: {r['starts']:.1f}")
        print(f"reservations_per_cycle_nodes_{nodes}: {r['reservations']:.1f}")
    smallest, largest = min(sizes), max(sizes)
    print(f"growth_{largest}_vs_{smallest}: {results[largest]['median_ms'] / results[smallest]['median_ms']:.2f}")


if __name__ == "__main__":
    main()
