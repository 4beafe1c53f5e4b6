"""Node selection, sbatch's -C/--constraint, -w/--nodelist and --exclusive: the feature expressions
(garrison.model.features), the scheduling core's filters and placement, and the controller's validation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_helpers import NOW, busy, machine, node, pending, running

from garrison.config import ConfigError, ControllerConfig, parse_config
from garrison.controller.sched.cycle import Reason, schedule
from garrison.controller.sched.placement import place
from garrison.controller.sched.presets import preset
from garrison.controller.sched.snapshot import Snapshot
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.domain import JobSpec, Node, Principal
from garrison.model.features import (
    ConstraintError,
    check_feature_names,
    is_matching_or,
    parse_constraint,
    satisfies,
)
from garrison.plainmsg import from_plain
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import inventory_from_pb, inventory_to_pb, spec_from_pb
from garrison.wire.convert_spec import spec_to_pb, spec_to_plain

GARRISON = preset("garrison")


# -- the expressions -----------------------------------------------------------------------------------------


def test_and_binds_tighter_than_or() -> None:
    assert parse_constraint("a100") == (frozenset({"a100"}),)
    assert parse_constraint("a100&ib") == (frozenset({"a100", "ib"}),)
    assert parse_constraint("a100|h100") == (frozenset({"a100"}), frozenset({"h100"}))
    assert parse_constraint("v100|a100 & ib") == (frozenset({"v100"}), frozenset({"a100", "ib"}))


@pytest.mark.parametrize(
    ("features", "expression", "expected"),
    [
        ({"a100", "ib"}, "a100&ib", True),
        ({"a100"}, "a100&ib", False),
        ({"h100"}, "a100|h100", True),
        ({"v100", "ib"}, "a100|h100", False),
        ({"v100"}, "v100|a100&ib", True),
        ({"ib"}, "v100|a100&ib", False),
        (set(), "a100", False),
        ({"A100"}, "a100", False),  # feature names match exactly, as Slurm's
    ],
)
def test_a_node_satisfies_an_expression_if_it_has_every_feature_of_one_alternative(
    features: set[str], expression: str, expected: bool
) -> None:
    assert satisfies(features, parse_constraint(expression)) is expected
    assert satisfies(tuple(features), parse_constraint(expression)) is expected


def test_no_expression_matches_every_node() -> None:
    assert satisfies(frozenset(), ())


def test_matching_or_in_brackets_reads_as_its_alternatives() -> None:
    # -C "[a5000|a6000|a100]", as real scripts write it: Slurm's matching OR (is_matching_or tells it apart).
    assert parse_constraint("[a5000|a6000|a100]") == (frozenset({"a5000"}), frozenset({"a6000"}),
                                                      frozenset({"a100"}))
    assert parse_constraint("[type_e]") == (frozenset({"type_e"}),)
    assert is_matching_or("[a|b]") and not is_matching_or("a|b")


@pytest.mark.parametrize("bad", ["", "a100&", "|h100", "a100||h100", "a100*2", "a,b", "a b", "é", "[]", "[a|b",
                                 "ib&[a100|h100]", "[a|b]&ib", "[[a|b]]", "[a*2|b]"])
def test_malformed_expressions_are_one_line_errors(bad: str) -> None:
    with pytest.raises(ConstraintError) as caught:
        parse_constraint(bad)
    assert "\n" not in str(caught.value) and "--constraint" in str(caught.value)


def test_a_long_bad_name_is_quoted_briefly() -> None:
    with pytest.raises(ConstraintError) as caught:
        parse_constraint("ok&" + "x" * 5000 + "!")
    assert len(str(caught.value)) < 300


def test_configured_feature_names_are_checked_and_deduplicated() -> None:
    assert check_feature_names(["a100", "ib", "a100"], "agent.features") == ("a100", "ib")
    with pytest.raises(ConstraintError, match=r"agent.features: invalid feature name 'a&b'"):
        check_feature_names(["a&b"], "agent.features")


def test_the_agent_configuration_lists_the_nodes_features() -> None:
    assert parse_config({"agent": {"features": ["a100", "ib"]}}, "t.toml").agent.features == ("a100", "ib")
    assert parse_config({}, "t.toml").agent.features == ()
    with pytest.raises(ConfigError, match=r"agent.features: invalid feature name 'a\|b'"):
        parse_config({"agent": {"features": ["a|b"]}}, "t.toml")
    with pytest.raises(ConfigError, match="agent.features: expected a list of strings"):
        parse_config({"agent": {"features": [1]}}, "t.toml")


def test_the_fields_cross_the_wire() -> None:
    spec = JobSpec(name="j", command=("true",), constraint="a100&ib|h100", nodelist=("n1", "n2"), exclusive=True)
    assert spec_from_pb(spec_to_pb(spec)) == spec
    assert from_plain(spec_to_plain(spec), pb.JobSpec) == spec_to_pb(spec)
    plain = JobSpec(name="j", command=("true",))
    assert spec_from_pb(spec_to_pb(plain)) == plain
    inventory = replace(machine("pcie4", "n1"), features=("a6000", "ib"))
    assert inventory_from_pb(inventory_to_pb(inventory)) == inventory


# -- scheduling ----------------------------------------------------------------------------------------------


def snap(nodes: list, jobs: list, running_jobs: list = ()) -> Snapshot:  # type: ignore[type-arg,assignment]
    return Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(running_jobs))


def featured(name: str, *features: str, **kw: object) -> object:
    return replace(node(name, **kw), features=frozenset(features))  # type: ignore[arg-type]


def test_constraint_picks_the_nodes_with_the_features() -> None:
    nodes = [featured("a", "v100"), featured("b", "a100", "ib"), featured("c", "a100")]
    jobs = [pending(1, gpus=1, constraint="a100&ib"), pending(2, gpus=1, constraint="v100|h100"),
            pending(3, gpus=1, constraint="h100")]
    plan = schedule(snap(nodes, jobs), NOW, GARRISON)
    assert sorted((s.job_id, s.allocation.node_names) for s in plan.starts) == [(1, ("b",)), (2, ("a",))]
    assert plan.waiting[3] == Reason.NODES_UNAVAILABLE  # no node has it: never, whatever ends


def test_matching_or_puts_every_node_of_a_job_on_one_alternative() -> None:
    # Two a100 nodes (one busy), two v100 nodes: -N 2 -C "[a100|v100]" takes both v100s, never one of each,
    # and -C "a100|v100" (plain OR) may mix them. A one-node job takes any node with one of them.
    hold = running(50, {"a1": tuple(range(8))})
    nodes = [busy(featured("a1", "a100"), hold), featured("a2", "a100"),  # type: ignore[arg-type]
             featured("v1", "v100"), featured("v2", "v100")]
    jobs = [pending(1, gpus_per_node=8, nodes=2, constraint="[a100|v100]")]
    plan = schedule(snap(nodes, jobs, [hold]), NOW, GARRISON)
    assert [(s.job_id, s.allocation.node_names) for s in plan.starts] == [(1, ("v1", "v2"))]
    # Only one node of each free: the matching job waits, the plain OR starts on the two.
    nodes[3] = busy(featured("v2", "v100"), running(51, {"v2": tuple(range(8))}))  # type: ignore[arg-type]
    held = [hold, running(51, {"v2": tuple(range(8))})]
    plan = schedule(snap(nodes, jobs, held), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES
    plain = [pending(2, gpus_per_node=8, nodes=2, constraint="a100|v100")]
    plan = schedule(snap(nodes, plain, held), NOW, GARRISON)
    assert [(s.job_id, sorted(s.allocation.node_names)) for s in plan.starts] == [(2, ["a2", "v1"])]
    one = [pending(3, gpus=8, constraint="[h100|v100]")]
    assert [s.allocation.node_names for s in schedule(snap(nodes, one, held), NOW, GARRISON).starts] == [("v1",)]


def test_a_constrained_job_waits_for_its_busy_node_rather_than_taking_another() -> None:
    hold = running(50, {"b": tuple(range(8))})
    nodes = [featured("a", "v100"), busy(featured("b", "a100"), hold)]  # type: ignore[arg-type]
    plan = schedule(snap(nodes, [pending(1, gpus=4, constraint="a100")], [hold]), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES


def test_nodelist_gives_the_job_exactly_the_named_nodes() -> None:
    nodes = [node("a"), node("b"), node("c")]
    plan = schedule(snap(nodes, [pending(1, gpus=1, nodes=1, nodelist=("c",)),
                                 pending(2, gpus_per_node=2, nodes=2, nodelist=("a", "b"))]), NOW, GARRISON)
    assert sorted((s.job_id, s.allocation.node_names) for s in plan.starts) == [(1, ("c",)), (2, ("a", "b"))]


def test_with_more_nodes_than_listed_the_listed_ones_are_included_and_others_added() -> None:
    nodes = [node("a"), node("b"), node("c"), node("d")]
    plan = schedule(snap(nodes, [pending(1, gpus_per_node=8, nodes=3, nodelist=("d",))]), NOW, GARRISON)
    (start,) = plan.starts
    assert len(start.allocation.node_names) == 3 and "d" in start.allocation.node_names


def test_a_listed_node_that_is_busy_makes_the_job_wait() -> None:
    hold = running(50, {"b": tuple(range(8))})
    nodes = [node("a"), busy(node("b"), hold), node("c")]
    plan = schedule(snap(nodes, [pending(1, gpus_per_node=8, nodes=2, nodelist=("b",))], [hold]), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES


def test_exclusive_takes_every_gpu_cpu_and_megabyte_of_an_idle_node() -> None:
    nodes = [node("a", cpus=16, memory_mb=64_000), node("b", cpus=16, memory_mb=64_000, free={1, 2, 3, 4, 5, 6, 7})]
    plan = schedule(snap(nodes, [pending(1, gpus=1, exclusive=True)]), NOW, GARRISON)
    ((alloc,),) = [s.allocation.nodes for s in plan.starts]
    assert alloc.node == "a"  # b has a GPU in use, so it is not idle
    assert sorted(alloc.gpus) == list(range(8)) and alloc.cpus == tuple(range(16)) and alloc.mem_mb == 64_000


def test_exclusive_waits_for_a_node_where_even_a_gpu_less_job_runs() -> None:
    cpu_job = running(50, {"a": ()})
    nodes = [replace(node("a"), idle=False)]
    plan = schedule(snap(nodes, [pending(1, gpus=1, exclusive=True)], [cpu_job]), NOW, GARRISON)
    assert not plan.starts and plan.waiting[1] == Reason.RESOURCES


def test_no_job_joins_a_node_an_exclusive_job_holds_in_the_same_cycle_or_later() -> None:
    # Job 1 (exclusive, 1 GPU) takes all of a; job 2 asks for nothing at all, would fit beside it, and waits.
    plan = schedule(snap([node("a", gpus=8)], [pending(1, gpus=1, exclusive=True), pending(2)]), NOW, GARRISON)
    assert [(s.job_id, s.allocation.node_names) for s in plan.starts] == [(1, ("a",))]
    assert 2 in plan.waiting
    # Next cycle: a is held by the exclusive job (the controller marks it); the GPU-less job still waits.
    held = replace(node("a", free=set()), idle=False, held_exclusively=True)
    later = schedule(snap([held], [pending(2)]), NOW, GARRISON)
    assert not later.starts and later.waiting[2] == Reason.RESOURCES


def test_place_accepts_the_new_fields() -> None:
    nodes = [featured("a", "x"), featured("b", "y")]
    spec = JobSpec(name="j", command=("true",), gpus=2, constraint="y", exclusive=True)
    allocation = place(spec, nodes)  # type: ignore[arg-type]
    assert allocation is not None and allocation.node_names == ("b",) and len(allocation.nodes[0].gpus) == 8


# -- validation ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> dict[str, Node]:
    a100, v100 = machine("dgx-a100", "node1"), machine("dgx1v", "node2")
    return {
        "node1": Node("node1", replace(a100, features=("a100", "ib"))),
        "node2": Node("node2", replace(v100, features=("v100",))),
    }


def submit(known: dict[str, Node], **spec: object) -> JobSpec:
    resolved = validate_submission(JobSpec(name="j", command=("true",), **spec),  # type: ignore[arg-type]
                                   Principal("ann", 1000, 1000), ControllerConfig(), known, [])
    return resolved.spec


def refused(known: dict[str, Node], **spec: object) -> str:
    with pytest.raises(ValidationError) as caught:
        submit(known, **spec)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_feature_no_node_has_is_refused(cluster: dict[str, Node]) -> None:
    assert "invalid feature specification" in refused(cluster, constraint="nosuch")
    assert "'nosuch'" in refused(cluster, constraint="a100&nosuch")
    assert "no node in partition 'main' has features 'a100&v100'" in refused(cluster, constraint="a100&v100")
    assert "invalid --constraint" in refused(cluster, constraint="a100&&ib")
    assert submit(cluster, constraint="a100&ib|v100").constraint == "a100&ib|v100"


def test_the_constraint_narrows_what_the_job_must_fit_on(cluster: dict[str, Node]) -> None:
    assert refused(cluster, nodes=2, gpus_per_node=1, constraint="a100") == (
        "partition 'main' has 1 nodes; the job asks for 2 (counting only the nodes that match --constraint 'a100')")
    assert "9 GPUs on 1 node(s) exceed" in refused(cluster, gpus=9, nodelist=("node1",))
    submit(cluster, nodes=2, gpus_per_node=1, constraint="a100|v100")


def test_nodelist_checks(cluster: dict[str, Node]) -> None:
    assert refused(cluster, nodelist=("nosuch",)) == "--nodelist: no such node 'nosuch'"
    assert refused(cluster, nodelist=("node1", "node2"), nodes=1) == "--nodelist names 2 nodes but --nodes asks for 1"
    assert "both name node 'node2'" in refused(cluster, nodelist=("node2",), exclude=("node2",))
    assert "lacks the features 'a100'" in refused(cluster, nodelist=("node2",), constraint="a100")
    assert submit(cluster, nodelist=("node1", "node2")).nodes == 2  # -N from the list, as sbatch
    assert submit(cluster, nodelist=("node2",), nodes=2).nodes == 2
