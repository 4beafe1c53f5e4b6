""""Could this job ever run here?" answered once (sched/feasibility.py), from the filters' UNRESOLVABLE on the
idle cluster, for submission, the cycle, --test-only and gsim.

- the verdict agrees with a real placement on the same nodes made idle (property, hypothesis);
- a job that can never run is refused at submission with the reason, and one that can is accepted
  (property), e.g. ``gsub -x`` naming every node;
- the cycle gives such a job NodesUnavailable / NodesDrained from the same verdict.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_helpers import NOW, node, pending

from garrison.config import ControllerConfig
from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.feasibility import Feasibility, IdleCluster
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import Placer, place, request_for
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import NodeView, Snapshot
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.domain import Gpu, JobSpec, Node, NodeInventory, NodeState, Principal
from garrison.model.resources import resolve

GPU_NAMES = ["NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB"]
FEATURES = [("a100",), ("v100",), ("a100", "nvlink")]
ANN = Principal("ann", 1000, 1000)


def inventory(name: str, gpus: int, gpu_name: str, cpus: int, memory_mb: int, features: tuple[str, ...]) -> NodeInventory:
    return NodeInventory(
        name, tuple(Gpu(i, f"GPU-{name}-{i}", gpu_name, 40960 if "A100" in gpu_name else 16384, f"0000:{i:02x}:00.0", 0,
                        f"0-{max(cpus - 1, 0)}") for i in range(gpus)),
        tuple(tuple(0 if i == j else 12 for j in range(gpus)) for i in range(gpus)),
        tuple(tuple("X" if i == j else "NV12" for j in range(gpus)) for i in range(gpus)),
        cpus=cpus, memory_mb=memory_mb, features=features,
    )


def idle_view(n: Node) -> NodeView:
    inv = n.inventory
    return NodeView(name=n.name, schedulable=True, gpu_names=tuple(g.name for g in inv.gpus),
                    free_gpus=frozenset(range(len(inv.gpus))), partitions=frozenset({"main"}),
                    gpu_memory_mib=tuple(g.memory_mib for g in inv.gpus), cpus=inv.cpus,
                    free_cpus=frozenset(range(inv.cpus)), memory_mb=inv.memory_mb, free_memory_mb=inv.memory_mb,
                    features=frozenset(inv.features))


@st.composite
def clusters_and_specs(draw: st.DrawFn) -> tuple[dict[str, Node], JobSpec]:
    nodes = {}
    for i in range(draw(st.integers(1, 4))):
        name = f"node{i + 1}"
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        inv = inventory(name, gpus, draw(st.sampled_from(GPU_NAMES)), draw(st.sampled_from([8, 32])),
                        draw(st.sampled_from([16_000, 64_000])), draw(st.sampled_from(FEATURES)))
        nodes[name] = Node(name, inv, state=draw(st.sampled_from([NodeState.UP, NodeState.UP, NodeState.DRAIN,
                                                                   NodeState.DOWN])))
    names = sorted(nodes)
    fields: dict[str, object] = draw(st.one_of(
        st.builds(lambda g: {"gpus": g}, st.integers(1, 20)),
        st.builds(lambda n, g: {"nodes": n, "gpus_per_node": g}, st.integers(1, 4), st.integers(1, 8)),
        st.builds(lambda n, g: {"nodes": n, "gpus": n * g}, st.integers(1, 3), st.integers(1, 4)),
    ))
    if draw(st.booleans()):
        fields["exclude"] = tuple(sorted(draw(st.sets(st.sampled_from(names), min_size=1))))
    if draw(st.integers(0, 3)) == 0:
        fields["constraint"] = draw(st.sampled_from(["a100", "v100", "a100|v100"]))
    if draw(st.integers(0, 3)) == 0:
        fields["gpu_type"] = draw(st.sampled_from(["a100", "v100"]))
    if draw(st.integers(0, 3)) == 0:
        fields["cpus_per_gpu"] = draw(st.sampled_from([2, 8]))
    if draw(st.integers(0, 3)) == 0:
        fields["mem_mb"] = draw(st.sampled_from([8_000, 32_000]))
    return nodes, JobSpec(name="j", command=("true",), **fields)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(case=clusters_and_specs())
def test_a_job_that_can_never_run_is_refused_at_submission_with_the_reason(case: tuple[dict[str, Node], JobSpec]) -> None:
    nodes, spec = case
    try:
        resolved = validate_submission(spec, ANN, ControllerConfig(), nodes, [])
    except ValidationError as exc:
        # Every refusal this generator can cause is "it could never run": check that no idle, up state of the
        # registered nodes runs it, and that the one line says so.
        message = str(exc)
        assert message and "\n" not in message
        if "invalid feature specification" in message:
            return  # a feature name no node has at all is an input error, as sbatch has it, whatever -C says
        views = [idle_view(n) for n in nodes.values()]
        assert place(resolve(spec), views, "main") is None, f"refused ({message}) yet it fits the idle nodes"
        return
    views = [idle_view(n) for n in nodes.values()]
    assert place(resolved.spec, views, "main") is not None, "accepted, yet no idle state of the nodes runs it"


@settings(max_examples=300, deadline=None)
@given(case=clusters_and_specs())
def test_the_verdict_agrees_with_a_placement_on_the_idle_nodes(case: tuple[dict[str, Node], JobSpec]) -> None:
    nodes, spec = case
    views = sorted((idle_view(n) for n in nodes.values()), key=lambda v: v.name)
    request = request_for(1, spec, "main", 60.0)
    verdict = IdleCluster(views, Placer(build_pipeline())).verdict(request)
    assert verdict.runs == (place(spec, views, "main") is not None)
    assert verdict.tally.evaluated == len(views)


def test_gsub_x_naming_every_node_is_refused_with_the_reason() -> None:
    nodes = {n: Node(n, inventory(n, 2, GPU_NAMES[0], 8, 16_000, ("a100",))) for n in ("node1", "node2")}
    spec = JobSpec(name="j", command=("true",), gpus=1, exclude=("node1", "node2"))
    with pytest.raises(ValidationError) as caught:
        validate_submission(spec, ANN, ControllerConfig(), nodes, [])
    assert str(caught.value) == (
        "no node of partition 'main' can ever run 1 GPUs: of 2 node(s), 2 excluded by -x/--exclude (largest: 2 GPUs)")
    validate_submission(replace(spec, exclude=("node1",)), ANN, ControllerConfig(), nodes, [])


def test_a_drained_or_down_node_still_counts_at_submission() -> None:
    """Submission asks about any state of the registered nodes: a job only a drained node could run is
    accepted (it waits with NodesDrained), as sbatch accepts it."""
    nodes = {"node1": Node("node1", inventory("node1", 8, GPU_NAMES[0], 8, 16_000, ())),
             "node2": Node("node2", inventory("node2", 2, GPU_NAMES[0], 8, 16_000, ()), state=NodeState.DRAIN)}
    validate_submission(JobSpec(name="j", command=("true",), gpus=2, exclude=("node1",)), ANN, ControllerConfig(),
                        nodes, [])


def test_the_cycle_uses_the_same_verdict_by_levels() -> None:
    nodes = (node("up", gpus=2), node("drained", gpus=8, drained=True), node("down", gpus=4, schedulable=False))
    queue = (pending(1, gpus=8), pending(2, gpus=4, exclude=("drained",)), pending(3, gpus=16), pending(4, gpus=2))
    plan = schedule(Snapshot(nodes=nodes, pending=queue), NOW, preset("garrison"))
    assert plan.waiting[1] == Reason.NODES_DRAINED
    assert plan.waiting[2] == Reason.NODES_UNAVAILABLE
    assert plan.waiting[3] == Reason.NODES_UNAVAILABLE
    assert [s.job_id for s in plan.starts] == [4]
    idle = IdleCluster(sorted(nodes, key=lambda v: v.name), Placer(build_pipeline()))
    assert idle.verdict(request_for(2, queue[1].spec, "main", 60)).feasibility == Feasibility.NEEDS_DOWN
    assert idle.verdict(request_for(3, queue[2].spec, "main", 60)).feasibility == Feasibility.NEVER


def test_submission_answers_follow_the_inventories_not_the_heartbeats() -> None:
    """The submission check caches its idle cluster per partition, keyed by the nodes' inventories: a
    heartbeat (a new Node, the same inventory) keeps it, a node registering with more GPUs changes it."""
    small = inventory("node1", 2, GPU_NAMES[0], 8, 16_000, ())
    nodes = {"node1": Node("node1", small)}
    spec = JobSpec(name="j", command=("true",), gpus=4)
    with pytest.raises(ValidationError):
        validate_submission(spec, ANN, ControllerConfig(), nodes, [])
    nodes["node1"] = replace(nodes["node1"], last_heartbeat=99.0)
    with pytest.raises(ValidationError):
        validate_submission(spec, ANN, ControllerConfig(), nodes, [])
    nodes["node1"] = Node("node1", inventory("node1", 4, GPU_NAMES[0], 8, 16_000, ()))
    validate_submission(spec, ANN, ControllerConfig(), nodes, [])
    nodes["node2"] = Node("node2", small)
    validate_submission(replace(spec, gpus=6), ANN, ControllerConfig(), nodes, [])


def test_requests_without_exclude_or_nodelist_share_one_empty_set() -> None:
    """The core keeps every pending job's request between cycles: two new empty sets each were 432 bytes a
    job at 50,000 pending. A job that names nodes still gets its own."""
    plain = [request_for(job_id, JobSpec(name="t", command=("true",), gpus=1), "main", 60.0) for job_id in (1, 2)]
    assert plain[0].exclude is plain[1].exclude is plain[0].nodelist == frozenset()
    named = request_for(3, JobSpec(name="t", command=("true",), gpus=1, exclude=("a",), nodelist=("b",)), "main", 60.0)
    assert (named.exclude, named.nodelist) == (frozenset({"a"}), frozenset({"b"}))
