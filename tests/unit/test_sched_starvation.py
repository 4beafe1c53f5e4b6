"""No job starves behind a look-alike (issue 21): a job that fits what is free, with nothing reserved ahead
of it, starts in that cycle, whatever jobs that cannot fit (-x every node, a drained -w node, a -C no node
has) sit ahead of it in the queue.

The cycle caches "this request shape did not fit" between capacity changes; a key that leaves out a field
placement reads (once: -x) makes every job that differs only in that field wait behind the first. The key is
now derived from the Request dataclass (framework.placement_key), and the property below checks the whole
class of bug on random clusters and queues: for every job in queue order with no reservation, no
preemption and (without backfill) no blocked job of its partition ahead of it, if a placement on what the
earlier starts left free exists, the plan starts it.
"""

from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import NOW, node, pending, running

from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.framework import (
    NOT_IN_PLACEMENT_KEY,
    PLACEMENT_KEY_FIELDS,
    Request,
    placement_key,
)
from garrison.controller.sched.placement import place, request_for
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import NodeView, PendingJob, RunningJob, Snapshot
from garrison.model.accounts import Accounting, PartitionDef
from garrison.model.domain import Allocation, JobSpec

ACCOUNTING = Accounting(partitions=(PartitionDef("main", default=True), PartitionDef("small", nodes=("n0", "n1"))))
FEATURES = [frozenset({"a100", "nvlink"}), frozenset({"v100"}), frozenset({"a100"})]


@st.composite
def clusters_and_queues(draw: st.DrawFn) -> tuple[Snapshot, str]:
    nodes: list[NodeView] = []
    runs: list[RunningJob] = []
    count = draw(st.integers(1, 5))
    names = [f"n{i}" for i in range(count)]
    for i, name in enumerate(names):
        gpus = draw(st.sampled_from([2, 4, 8]))
        busy = set(draw(st.permutations(range(gpus)))[: draw(st.sampled_from([0, 0, 1, gpus // 2, gpus]))])
        if busy:
            runs.append(running(900 + i, {name: tuple(sorted(busy))}, limit=draw(st.sampled_from([600, 3600]))))
        with_host = draw(st.booleans())
        view = node(name, gpus=gpus, free=set(range(gpus)) - busy, switches=draw(st.sampled_from([(), ("s1",), ("s2",)])),
                    partitions=frozenset({"main", "small"} if i < 2 else {"main"}),
                    drained=draw(st.integers(0, 5)) == 0, schedulable=draw(st.integers(0, 7)) != 0,
                    cpus=4 * gpus if with_host else 0, memory_mb=1000 * gpus if with_host else 0)
        nodes.append(replace(view, features=draw(st.sampled_from(FEATURES)), idle=not busy))
    jobs: list[PendingJob] = []
    for j in range(draw(st.integers(1, 10))):
        shape = draw(st.one_of(
            st.builds(lambda g: {"gpus": g}, st.integers(1, 12)),
            st.builds(lambda n, g: {"nodes": n, "gpus_per_node": g}, st.integers(1, 3), st.integers(1, 4)),
        ))
        extra: dict[str, object] = {}
        if draw(st.booleans()):
            extra["exclude"] = tuple(draw(st.sets(st.sampled_from(names), min_size=1)))
        if draw(st.integers(0, 3)) == 0:
            extra["constraint"] = draw(st.sampled_from(["a100", "v100", "nvlink", "a100|v100"]))
        if draw(st.integers(0, 4)) == 0:
            extra["nodelist"] = (draw(st.sampled_from(names)),)
            extra["nodes"] = 1
            extra.pop("exclude", None)
            shape = {"gpus_per_node": draw(st.integers(1, 4))}
        if draw(st.integers(0, 3)) == 0:
            extra["cpus_per_gpu"] = draw(st.sampled_from([1, 4]))
        if draw(st.integers(0, 3)) == 0:
            extra["mem_mb"] = draw(st.sampled_from([500, 1500]))
        if draw(st.integers(0, 6)) == 0:
            extra["exclusive"] = True
        jobs.append(pending(j + 1, submit=NOW - draw(st.integers(0, 5000)), limit=draw(st.sampled_from([60, 600, 3600])),
                            partition=draw(st.sampled_from(["main", "main", "small"])), **shape, **extra))
    snapshot = Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(runs), accounting=ACCOUNTING)
    return snapshot, draw(st.sampled_from(["fifo", "fifo-easy", "garrison"]))


def _after(views: dict[str, NodeView], allocation: Allocation, exclusive: bool) -> None:
    for n in allocation.nodes:
        view = views[n.node]
        views[n.node] = replace(view, free_gpus=view.free_gpus - set(n.gpus), free_cpus=view.free_cpus - set(n.cpus),
                                free_memory_mb=view.free_memory_mb - n.mem_mb, idle=False,
                                held_exclusively=view.held_exclusively or exclusive)


def check_no_look_alike_starvation(snapshot: Snapshot, policy: str) -> None:
    config = preset(policy)
    plan = schedule(snapshot, NOW, config)
    jobs = {j.job_id: j for j in snapshot.pending}
    started = {s.job_id: s.allocation for s in plan.starts}
    reserved = {r.job_id for r in plan.reservations}
    views = {v.name: v for v in snapshot.nodes}
    something_held_ahead = False
    blocked_partitions: set[str] = set()
    for job_id in plan.order:
        job = jobs[job_id]
        if job_id in started:
            _after(views, started[job_id], job.spec.exclusive)
            continue
        reason = plan.waiting[job_id]
        waits_for_ahead = something_held_ahead or (not config.backfill and job.partition in blocked_partitions)
        if not waits_for_ahead:
            fits = place(job.spec, list(views.values()), job.partition)
            assert fits is None, f"job {job_id} fits now ({fits}) with nothing held ahead, yet waits ({reason})"
        if job_id in reserved or reason == Reason.PREEMPTING:
            something_held_ahead = True
        if reason == Reason.RESOURCES:
            blocked_partitions.add(job.partition)


@settings(max_examples=400, deadline=None)
@given(scenario=clusters_and_queues())
def test_a_job_that_fits_with_nothing_held_ahead_starts(scenario: tuple[Snapshot, str]) -> None:
    check_no_look_alike_starvation(*scenario)


def test_the_issue_case_a_job_behind_one_excluding_every_node_starts() -> None:
    """gsub -G 1 -x node1,node2 on two idle nodes, then gsub -G 1: the second starts at once."""
    nodes = (node("node1", gpus=2), node("node2", gpus=2))
    queue = (pending(1, gpus=1, exclude=("node1", "node2")), pending(2, gpus=1), pending(3, gpus=1, exclude=("node1",)))
    for policy in ("fifo", "fifo-easy", "garrison"):
        plan = schedule(Snapshot(nodes=nodes, pending=queue), NOW, preset(policy))
        assert {s.job_id for s in plan.starts} == {2, 3}, policy
        assert plan.waiting[1] == Reason.NODES_UNAVAILABLE


def test_a_job_behind_one_on_a_drained_node_starts() -> None:
    """-x node1 with node2 drained cannot run; the look-alike without -x starts on node1."""
    nodes = (node("node1", gpus=2), node("node2", gpus=2, drained=True))
    queue = (pending(1, gpus=1, exclude=("node1",)), pending(2, gpus=1))
    plan = schedule(Snapshot(nodes=nodes, pending=queue), NOW, preset("garrison"))
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.waiting[1] == Reason.NODES_DRAINED


def test_every_request_field_is_in_the_placement_key_or_named_as_not_read() -> None:
    names = {f.name for f in fields(Request)}
    assert set(PLACEMENT_KEY_FIELDS) | NOT_IN_PLACEMENT_KEY == names
    assert not set(PLACEMENT_KEY_FIELDS) & NOT_IN_PLACEMENT_KEY
    base = request_for(1, JobSpec(name="j", command=("true",), gpus=1), "main", 60.0)
    assert placement_key(replace(base, exclude=frozenset({"n1"}))) != placement_key(base)
    assert placement_key(replace(base, job_id=2, duration_s=9.0)) == placement_key(base)


def test_placement_does_not_read_the_fields_left_out_of_the_key() -> None:
    nodes = [node("a", gpus=4, free={0, 1}), node("b", gpus=8, free={0, 1, 2}), node("c", gpus=2)]
    spec = JobSpec(name="j", command=("true",), gpus=2)
    from garrison.controller.sched.cycle import _pipeline
    from garrison.controller.sched.placement import Placer, candidates_of

    placer = Placer(_pipeline(preset("garrison").scorer_weights))
    answers = {
        placer.place(request_for(job_id, spec, "main", duration), lambda r: candidates_of(nodes, r))
        for job_id in (1, 7, 99) for duration in (1.0, 600.0, 86400.0)
    }
    assert len(answers) == 1
