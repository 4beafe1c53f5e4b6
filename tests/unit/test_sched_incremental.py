"""The capacity index and the backfill timeline kept across cycles (capacity._NodeIndex,
backfill._RunningHolds) answer exactly as the ones built from scratch, along a random walk of snapshots
in which jobs start, end, overrun their limit and are being stopped, as the simulator's and the daemon's
successive snapshots do (unchanged node and job views are the same objects from one to the next)."""

from __future__ import annotations

import random
from dataclasses import replace

from sched_helpers import NOW, node, running

from garrison.controller.sched import capacity as capacity_module
from garrison.controller.sched import cycle as cycle_module
from garrison.controller.sched.backfill import Timeline
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.framework import Candidate, Request, placement_key
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, request_for
from garrison.controller.sched.scorers.gpu_topology import GpuTopology, node_affinity
from garrison.controller.sched.snapshot import NodeView, RunningJob
from garrison.controller.sched.topology import best_affinity, gpu_affinity
from garrison.model.domain import JobSpec


class FullTimeline(Timeline):
    """The timeline built from every running job, as before it was kept across cycles."""

    def _from_holds(self, running: object) -> bool:
        return False


def _clamped(free_at: list[dict[int, float]], now: float) -> list[dict[int, float]]:
    # Every question is asked at ``now`` or later: an end before now (a stopping job, an overrun) is now.
    return [{gpu: max(until, now) for gpu, until in busy.items()} for busy in free_at]


def _releases(timeline: Timeline, now: float) -> list[tuple[float, int, int]]:
    # One event per (end, node) or one per job and node: the same GPUs come free at the same times.
    return sorted((max(when, now), index, gpu) for when, index, gpus in timeline.events for gpu in gpus)


def _request(job_id: int, gpus: int, limit: int) -> Request:
    return request_for(job_id, JobSpec(name="j", command=("true",), gpus=gpus), "main", float(limit))


def _answers(timeline: Timeline, requests: list[Request]) -> list[object]:
    placer = Placer(build_pipeline())
    found = []
    for request in requests:
        start = timeline.earliest_start(request, placer, 60.0, 2 * 86400)
        found.append(start)
        if start is not None:
            timeline.hold(start[1], start[0] + request.duration_s)
    return found


def test_kept_capacity_and_timeline_answer_as_rebuilt_ones() -> None:
    rng = random.Random(7)
    names = [f"n{i}" for i in range(6)]
    views: dict[str, NodeView] = {n: node(n, switches=("s0" if i < 3 else "s1",)) for i, n in enumerate(names)}
    # One GPU busy for a reason no running job explains: it never comes free.
    views["n5"] = replace(views["n5"], free_gpus=views["n5"].free_gpus - {7})
    jobs: dict[int, RunningJob] = {}
    now = NOW
    next_id = 1
    for _ in range(300):
        now += rng.choice([0.0, 30.0, 600.0])
        action = rng.random()
        if action < 0.5:
            name = rng.choice(names)
            free = sorted(views[name].free_gpus)
            if free:
                gpus = tuple(rng.sample(free, rng.randint(1, len(free))))
                job = running(next_id, {name: gpus}, start=now - rng.choice([0, 500, 5000]),
                              limit=rng.choice([600, 3600, 7200]))
                jobs[next_id] = job
                next_id += 1
                # What else a start changes on the node (the kept index follows these too).
                views[name] = replace(views[name], free_gpus=views[name].free_gpus - set(gpus), idle=False,
                                      free_memory_mb=views[name].free_memory_mb - 1)
        elif action < 0.8 and jobs:
            job = jobs.pop(rng.choice(sorted(jobs)))
            for node_alloc in job.allocation.nodes:
                name = node_alloc.node
                free = views[name].free_gpus | set(node_alloc.gpus)
                views[name] = replace(views[name], free_gpus=free, idle=len(free) == views[name].gpu_count,
                                      free_memory_mb=views[name].free_memory_mb + 1)
        elif jobs:
            job_id = rng.choice(sorted(jobs))
            jobs[job_id] = replace(jobs[job_id], stopping=True)
        nodes = tuple(views[n] for n in rng.sample(names, len(names))) if action > 0.97 else tuple(
            views[n] for n in names)
        runs = tuple(jobs.values())

        kept = Capacity(nodes)
        capacity_module._NODES = None
        fresh = Capacity(nodes)
        assert kept.views == fresh.views
        assert kept.buckets == fresh.buckets
        assert kept.free == fresh.free
        assert (kept.free_cpus, kept.free_memory, kept.idle, kept.exclusive) == (
            fresh.free_cpus, fresh.free_memory, fresh.idle, fresh.exclusive)

        timeline = Timeline(kept, runs, now)
        reference = FullTimeline(fresh, runs, now)
        assert _clamped(timeline.free_at, now) == _clamped(reference.free_at, now)
        assert timeline.usable_now == reference.usable_now
        assert _releases(timeline, now) == _releases(reference, now)
        requests = [_request(1000 + k, gpus, 3600) for k, gpus in enumerate((1, 4, 8, 12, 16))]
        assert _answers(timeline, requests) == _answers(reference, requests)


def test_interned_placement_keys_act_as_the_plain_tuples() -> None:
    # The cycle interns each job's placement key (one object per distinct key, hashed once); dicts keyed by
    # plain keys elsewhere (feasibility's shared verdicts) must find it, and it theirs.
    first = _request(1, 2, 600)
    second = _request(2, 2, 7200)
    other = _request(3, 4, 600)
    raw = placement_key(first)
    key = cycle_module._interned(raw)
    assert key == raw and hash(key) == hash(raw)
    assert cycle_module._interned(placement_key(second)) is key  # look-alikes share one key
    assert cycle_module._interned(placement_key(other)) != key
    assert {raw: "verdict"}[key] == "verdict" and {key: "verdict"}[raw] == "verdict"


def test_node_affinity_follows_the_node_matrices() -> None:
    # Found by the identity of a view's matrices, so a node whose NVLink matrix changes gets its own answer.
    plain = node("n0", gpus=4)
    assert node_affinity(plain)[0] == gpu_affinity(plain.nvlink, plain.topo)
    paired = replace(plain, nvlink=((0, 2, 0, 0), (2, 0, 0, 0), (0, 0, 0, 2), (0, 0, 2, 0)))
    affinity, bests = node_affinity(paired)
    assert affinity == gpu_affinity(paired.nvlink, paired.topo) != node_affinity(plain)[0]
    scorer = GpuTopology()
    pair_on_link = Candidate(index=0, view=paired, usable=[0, 1, 2, 3], capable=4, free_cpus=frozenset(),
                             free_memory_mb=0)
    assert scorer.score(_request(1, 2, 600), pair_on_link, (0, 1)) == 100
    assert scorer.score(_request(1, 2, 600), pair_on_link, (0, 2)) == 0
    assert bests == {2: best_affinity(affinity, 2)}


def test_kept_busy_gpus_follow_jobs_that_change_behind_the_same_free_gpus() -> None:
    # A node's busy GPUs derived from the running holds are kept while its free GPUs are the same object;
    # a job that ends while another starts on the same GPUs, or that is being stopped, leaves the free GPUs
    # as they were but not the holds. GPU 7 is busy for a reason no job explains (the kept dict is then not
    # the holds' own but a copy with INFINITY for it).
    views = (replace(node("n0"), free_gpus=frozenset(range(6))), node("n1"))
    first = running(1, {"n0": (6,)}, start=NOW - 100, limit=600)
    second = running(2, {"n0": (6,)}, start=NOW, limit=7200)
    capacity = Capacity(views)
    for runs in ((first,), (second,), (replace(second, stopping=True),), (second,)):
        timeline = Timeline(capacity, runs, NOW)
        reference = FullTimeline(Capacity(views), runs, NOW)
        assert _clamped(timeline.free_at, NOW) == _clamped(reference.free_at, NOW)
        assert timeline.usable_now == reference.usable_now
        request = _request(9, 8, 600)
        assert _answers(timeline, [request]) == _answers(reference, [request])
