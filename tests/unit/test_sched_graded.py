"""Graded candidate sources (placement.Graded): the backfill sweep's BestFit and Capacity.stream let the
one-node search start at the first candidate with as many usable GPUs as it wants on a node, and passing()
at the job's smallest share, so the candidates before are never made. The plans must be the very ones of
making every candidate in a plain list, in the same order: compared here along random walks, against the
sweep's candidates built as before (every one, sorted by usable count) and against the stream read into a
list (which the placer cannot grade)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sched_helpers import NOW, node, running

from garrison.controller.sched.backfill import Timeline
from garrison.controller.sched.capacity import Capacity
from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import BestFit, Graded, Placer, candidates_of, request_for
from garrison.controller.sched.snapshot import NodeView, RunningJob
from garrison.model.domain import JobSpec


class PlainTimeline(Timeline):
    """The sweep's candidates as before they were graded: every ready node of the partition with enough
    GPUs counted, made in index order, in a list sorted (stably) by usable count."""

    def _best_fit_at(self, request: Request, when: float, counts: list[int]) -> list[Candidate]:  # type: ignore[override]
        capacity = self.capacity
        made = []
        for index in self._members(request.partition)[0]:
            if counts[index] < request.shape.min_gpus_per_node:
                continue
            view = capacity.views[index]
            match = capacity.matching(index, request.gpu_type, request.gpu_mem_mib)
            busy = self.free_at[index]
            usable = [g for g in range(capacity.gpu_counts[index]) if busy.get(g, self.now) <= when and g in match]
            wants_cpus = request.cpus_per_gpu or request.cpus_per_node
            wants_memory = request.mem_mb or request.mem_per_gpu_mb or request.mem_whole_node
            made.append(Candidate(
                index=index, view=view, usable=usable, capable=len(match),
                free_cpus=self.cpus_at(index, when) if wants_cpus else self._every_cpu(index),
                free_memory_mb=self.memory_at(index, when) if wants_memory else view.memory_mb,
            ))
        return sorted(made, key=lambda c: len(c.usable))


def _spec(rng: random.Random) -> JobSpec:
    shape = rng.random()
    if shape < 0.6:  # a total, on one node if it can be (most of a trace)
        return JobSpec(name="j", command=("x",), gpus=rng.choice((1, 1, 2, 3, 4, 6, 8, 12, 16, 24)))
    if shape < 0.8:  # a gang of so many GPUs on each of so many nodes
        return JobSpec(name="j", command=("x",), nodes=rng.choice((1, 2, 3)), gpus_per_node=rng.choice((1, 2, 4, 8)))
    # CPUs per GPU (hostable counts fewer GPUs), or GPUs of one type only
    if rng.random() < 0.5:
        return JobSpec(name="j", command=("x",), gpus=rng.choice((1, 2, 4, 8)), cpus_per_gpu=rng.choice((2, 4)))
    return JobSpec(name="j", command=("x",), gpus=rng.choice((1, 2, 4)), gpu_type="h100")


def _views(rng: random.Random) -> dict[str, NodeView]:
    views = {}
    for i in range(8):
        gpu_name = "NVIDIA H100" if i % 4 == 3 else "NVIDIA A100"
        views[f"n{i}"] = node(f"n{i}", gpu_name=gpu_name, switches=("s0" if i < 4 else "s1",),
                              cpus=rng.choice((0, 16, 32)))
    return views


@pytest.mark.parametrize("seed", range(3))
def test_the_sweep_reserves_as_with_every_candidate_made(seed: int) -> None:
    rng = random.Random(seed)
    views = _views(rng)
    names = sorted(views)
    jobs: dict[int, RunningJob] = {}
    placer = Placer(build_pipeline())
    now = NOW
    for step in range(120):
        now += rng.choice((0.0, 60.0, 900.0))
        if rng.random() < 0.6 or not jobs:
            name = rng.choice(names)
            free = sorted(views[name].free_gpus)
            if free:
                gpus = tuple(rng.sample(free, rng.randint(1, len(free))))
                jobs[1000 + step] = running(1000 + step, {name: gpus}, start=now - rng.choice((0, 600, 4000)),
                                            limit=rng.choice((600, 3600, 7200)))
                views[name] = replace(views[name], free_gpus=views[name].free_gpus - set(gpus), idle=False)
        else:
            job = jobs.pop(rng.choice(sorted(jobs)))
            for node_alloc in job.allocation.nodes:
                freed = views[node_alloc.node].free_gpus | set(node_alloc.gpus)
                views[node_alloc.node] = replace(views[node_alloc.node], free_gpus=freed,
                                                 idle=len(freed) == views[node_alloc.node].gpu_count)
        nodes = tuple(views[n] for n in names)
        timelines = (Timeline(Capacity(nodes), tuple(jobs.values()), now),
                     PlainTimeline(Capacity(nodes), tuple(jobs.values()), now))
        requests = [request_for(k, _spec(rng), "main", float(rng.choice((600, 3600, 86400)))) for k in range(8)]
        answers = []
        for timeline in timelines:
            found = []
            for request in requests:  # eight reservations, each held before the next is looked for
                start = timeline.earliest_start(request, placer, 60.0, 2 * 86400)
                found.append(start)
                if start is not None:
                    timeline.hold(start[1], start[0] + request.duration_s)
            answers.append(found)
        assert answers[0] == answers[1]


@pytest.mark.parametrize("seed", range(3))
def test_placing_now_from_the_graded_stream_places_as_from_a_list(seed: int) -> None:
    rng = random.Random(seed)
    placer = Placer(build_pipeline())
    for _ in range(80):
        views = _views(rng)
        for name in views:
            views[name] = replace(views[name], free_gpus=frozenset(rng.sample(range(8), rng.randrange(9))))
        capacity = Capacity(tuple(views[n] for n in sorted(views)))
        for job_id in range(rng.randrange(3)):  # reservations: reserved GPUs usable only by jobs ending first
            request = request_for(900 + job_id, JobSpec(name="r", command=("x",), gpus=rng.choice((2, 4, 8))),
                                  "main", 3600.0)
            reserved = placer.place(request, lambda r, c=capacity: list(c.stream(r, float("-inf"))))
            if reserved is not None:
                capacity.reserve(reserved, NOW + rng.choice((600, 7200)), 900 + job_id)
        request = request_for(1, _spec(rng), "main", 3600.0)
        end = NOW + rng.choice((300, 3600, 36000))
        stream = capacity.stream(request, end)
        assert isinstance(stream, Graded)
        graded = placer.place(request, lambda r, c=capacity, e=end: c.stream(r, e))
        assert graded == placer.place(request, lambda r, c=capacity, e=end: list(c.stream(r, e)))


def test_best_fit_makes_each_candidate_once_and_only_when_reached() -> None:
    nodes = [node(f"n{i}", free=set(range(free))) for i, free in enumerate((3, 0, 8, 1, 3, 5))]
    request = request_for(1, JobSpec(name="j", command=("x",), gpus=4), "main", 600.0)
    plain = [c for c in candidates_of(nodes, request) if c.usable]
    made: list[int] = []

    def make(index: int, usable: list[int], capable: int) -> Candidate:
        made.append(index)
        return Candidate(index=index, view=nodes[index], usable=usable, capable=capable,
                         free_cpus=frozenset(), free_memory_mb=0)

    graded = BestFit(sorted((len(c.usable), c.index, c.usable, c.capable) for c in plain), make)
    assert [c.index for c in graded.from_usable(4)] == [5, 2]
    assert made == [5, 2]
    assert [(c.index, c.usable) for c in graded] == [(c.index, c.usable) for c in plain]
    assert made == [5, 2, 3, 0, 4]  # the two already made are the same objects again
    assert [c.index for c in graded.from_usable(9)] == []
    assert Placer(build_pipeline()).place(request, lambda r: graded) == Placer(build_pipeline()).place(
        request, lambda r: plain)

