"""The capacity index and the backfill timeline kept across cycles (capacity._NodeIndex,
backfill._RunningHolds) answer exactly as the ones built from scratch, along a random walk of snapshots
in which jobs start, end, overrun their limit and are being stopped, as the simulator's and the daemon's
successive snapshots do (unchanged node and job views are the same objects from one to the next)."""

from __future__ import annotations

import random
from dataclasses import replace

from sched_helpers import NOW, node, pending, running

from garrison.controller.sched import capacity as capacity_module
from garrison.controller.sched import cycle as cycle_module
from garrison.controller.sched import feasibility as feasibility_module
from garrison.controller.sched.backfill import Timeline
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.cycle import SchedulerConfig, schedule
from garrison.controller.sched.dependencies import DependencyItem, DependencyKind, JobDependencies
from garrison.controller.sched.feasibility import Feasibility, IdleCluster
from garrison.controller.sched.framework import Candidate, Request, placement_key
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, request_for
from garrison.controller.sched.plan import Reason
from garrison.controller.sched.scorers.gpu_topology import GpuTopology, node_affinity
from garrison.controller.sched.snapshot import NodeView, RunningJob, Snapshot
from garrison.controller.sched.topology import best_affinity, gpu_affinity
from garrison.model.accounts import Accounting, PartitionDef
from garrison.model.domain import JobSpec, JobState


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


def test_interned_placement_keys_are_one_object_per_key_and_answer_as_the_plain_tuples() -> None:
    # The cycle interns each job's placement key (one object per distinct key, hashed by identity in C);
    # equal to the plain tuple, and a dict of them finds the look-alikes' one object.
    first = _request(1, 2, 600)
    second = _request(2, 2, 7200)
    other = _request(3, 4, 600)
    raw = placement_key(first)
    key = cycle_module._interned(raw)
    assert key == raw and type(key).__hash__ is object.__hash__
    assert cycle_module._interned(placement_key(second)) is key  # look-alikes share one key
    assert cycle_module._interned(placement_key(other)) != key
    assert {key: "verdict"}[cycle_module._interned(placement_key(second))] == "verdict"
    # feasibility's shared verdicts hold plain keys (a submission check) beside interned ones (the cycle):
    # asked either way, in either order, a request gets the same verdict.
    nodes = [node(f"n{i}", gpus=4) for i in range(3)]
    placer = Placer(build_pipeline())
    for request in (first, other, _request(4, 16, 600)):
        plain = IdleCluster(nodes, placer).verdict(request)
        interned = IdleCluster(nodes, placer).verdict(request, cycle_module._interned(placement_key(request)))
        assert interned == plain == IdleCluster(nodes, placer).verdict(request)


def test_look_alikes_share_one_key_object_when_the_interned_keys_overflow() -> None:
    # The look-alike memo finds keys by identity: when the interned keys pass their bound, they are
    # forgotten between cycles (with the requests that hold them), never in the middle of one, where a job
    # interned after the clearing would no longer share its look-alike's key.
    cycle_module._KEYS.clear()
    cycle_module._KEYS.update({("filler", i): cycle_module._Key(("filler", i)) for i in range(4094)})
    jobs = tuple(pending(job_id, gpus=gpus, limit=600) for job_id, gpus in ((1, 1), (2, 2), (3, 4), (4, 2), (5, 4)))
    full = node("a", free=set())  # nothing fits: every job is walked, and interned
    snapshot = Snapshot(nodes=(full,), pending=jobs, running=(), accounting=Accounting())
    config = SchedulerConfig(backfill=True, reservations=1)
    schedule(snapshot, NOW, config)
    keys = {job_id: cycle_module._REQUESTS[job_id][5] for job_id in (2, 3, 4, 5)}
    assert keys[2] is keys[4] and keys[3] is keys[5]  # interned past 4,096 in this cycle: still one each
    schedule(snapshot, NOW + 1, config)  # the next cycle starts afresh
    assert len(cycle_module._KEYS) == 3
    assert cycle_module._REQUESTS[2][5] is cycle_module._REQUESTS[4][5] is not keys[2]


def test_idle_verdicts_follow_a_node_whose_class_changes_behind_a_view_list_kept_in_part() -> None:
    # The node classes of the verdicts' signature are kept for the last view list and remade only for the
    # views that are new objects: a view with other free GPUs keeps the very signature (the verdicts are
    # shared), one drained or with other GPUs gets another, and its verdicts are judged again.
    nodes = tuple(node(f"n{i}", gpus=4) for i in range(3))
    placer = Placer(build_pipeline())
    four = _request(1, 4, 600)
    classes = feasibility_module._node_classes_of(nodes)
    assert classes == tuple((v.name, feasibility_module._class_key(v)) for v in nodes)
    assert feasibility_module._node_classes_of(tuple(nodes)) is classes
    busier = (nodes[0], replace(nodes[1], free_gpus=frozenset({0})), nodes[2])
    assert feasibility_module._node_classes_of(busier) is classes
    assert IdleCluster(busier, placer).verdict(four).feasibility == Feasibility.RUNS
    drained = tuple(replace(v, drained=True) for v in busier)
    assert feasibility_module._node_classes_of(drained) != classes
    assert IdleCluster(drained, placer).verdict(four).feasibility == Feasibility.NEEDS_DRAINED
    smaller = (busier[0], node("n1", gpus=2), busier[2])
    assert feasibility_module._node_classes_of(smaller)[1] != classes[1]
    assert IdleCluster(smaller, placer).verdict(four).feasibility == Feasibility.RUNS
    two_only = tuple(node(f"n{i}", gpus=2) for i in range(3))
    assert IdleCluster(two_only, placer).verdict(four).feasibility == Feasibility.RUNS  # 2 + 2 + 2 GPUs
    assert IdleCluster(two_only, placer).verdict(_request(2, 8, 600)).feasibility == Feasibility.NEVER


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


def test_held_and_dependent_jobs_wait_without_a_placement_request_kept_for_them() -> None:
    # A hold and an unsatisfied dependency are the gates' first answers, whatever else the job is (here: over
    # the partition's limit, which the gates would otherwise answer): the cycle gives them without making the
    # job's placement request, which it keeps from cycle to cycle (50,000 held jobs kept 50,000; issue 23).
    waiting = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.RUNNING,),)),))
    satisfied = JobDependencies((DependencyItem(DependencyKind.AFTEROK, ((JobState.COMPLETED,),)),))
    jobs = (pending(1, gpus=1, held=True, limit=9000), replace(pending(2, gpus=1, limit=9000), dependencies=waiting),
            replace(pending(3, gpus=1), dependencies=satisfied), pending(4, gpus=1))
    accounting = Accounting(partitions=(PartitionDef("main", default=True, max_time_s=7200),))
    cycle_module._REQUESTS.clear()
    plan = schedule(Snapshot(nodes=(node("a", gpus=1),), pending=jobs, running=(), accounting=accounting), NOW,
                    SchedulerConfig(backfill=True, reservations=1))
    assert (plan.waiting[1], plan.waiting[2]) == (Reason.HELD, Reason.DEPENDENCY)
    assert [s.job_id for s in plan.starts] == [3] and plan.waiting[4] == Reason.RESOURCES
    assert set(cycle_module._REQUESTS) == {3, 4}
