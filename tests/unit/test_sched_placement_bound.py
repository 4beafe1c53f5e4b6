"""The one-node search stops scoring nodes that cannot win (placement.Placer._one_node): once the best node
so far has the highest score any node could get, a node with a higher index is only counted. The choice
must be the very one of scoring every passing node, whatever order the candidates come in."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sched_helpers import machine, node, view_of

from garrison.controller.sched.framework import Candidate
from garrison.controller.sched.pipeline import build_pipeline
from garrison.controller.sched.placement import CandidateSource, Placer, candidates_of, request_for
from garrison.controller.sched.snapshot import NodeView
from garrison.model.domain import JobSpec, NodeInventory


def random_nodes(rng: random.Random, dgx1v: NodeInventory) -> list[NodeView]:
    nodes = []
    for i in range(12):
        free = set(rng.sample(range(8), rng.randrange(9)))
        if rng.random() < 0.3:  # a DGX-1V: not every GPU pair equally connected
            nodes.append(view_of(dgx1v, f"n{i}", free=free))
        else:
            nodes.append(node(f"n{i}", free=free))
    return nodes


def given(candidates: list[Candidate]) -> CandidateSource:
    """These candidates, in this order, at every call."""
    return lambda _request: candidates


@pytest.mark.parametrize("seed", range(4))
def test_one_node_search_skips_only_nodes_that_cannot_win(seed: int) -> None:
    rng = random.Random(seed)
    dgx1v = machine("dgx1v")
    for limit in (1, 2, 4, 16):
        bounded = Placer(build_pipeline(), score_limit=limit)
        unbounded = Placer(build_pipeline(), score_limit=limit)
        unbounded._ceilings = (None, None)  # scores every passing node, as before the bound
        assert bounded._ceilings == (None, 100)  # the default scorers are bounded for one GPU
        for _ in range(60):
            nodes = random_nodes(rng, dgx1v)
            request = request_for(1, JobSpec(name="j", command=("x",), gpus=rng.choice((1, 1, 2, 3, 4, 8))),
                                  "main", 3600)
            candidates = candidates_of(nodes, request)
            if rng.random() < 0.5:
                rng.shuffle(candidates)  # a node further on may have a lower index (reserved GPUs do that)
            assert bounded.place(request, given(candidates)) == unbounded.place(request, given(candidates))


def test_a_scorer_without_a_bound_scores_every_node() -> None:
    only_binpack = Placer(build_pipeline((("BinPack", 1),)))
    assert only_binpack._ceilings == (100, 100)
    with_topology = Placer(build_pipeline((("BinPack", 3), ("GpuTopology", 2))))
    assert with_topology._ceilings == (None, 100)


@pytest.mark.parametrize("seed", range(3))
def test_filters_left_out_for_a_request_would_pass_every_node(seed: int) -> None:
    # The placer leaves out, per request, the filters of the job's own node choice it did not make (-x, -C,
    # -w): it must place as when every filter checks every node.
    rng = random.Random(seed)
    dgx1v = machine("dgx1v")
    fast = Placer(build_pipeline())
    every = Placer(build_pipeline())
    every._steps_for = lambda _request: every._filters  # type: ignore[method-assign]
    for _ in range(80):
        nodes = [replace(v, features=frozenset(rng.sample(("ib", "a100", "big"), rng.randrange(3))))
                 for v in random_nodes(rng, dgx1v)]
        names = [v.name for v in nodes]
        choice: dict[str, object] = {}
        if rng.random() < 0.3:
            choice["exclude"] = tuple(rng.sample(names, rng.randrange(1, 4)))
        if rng.random() < 0.3:
            choice["constraint"] = rng.choice(("ib", "a100&big", "ib|big"))
        if rng.random() < 0.2:
            choice["nodelist"] = tuple(rng.sample(names, rng.randrange(1, 3)))
        if rng.random() < 0.3:
            choice["nodes"] = rng.choice((1, 2, 3))
        spec = JobSpec(name="j", command=("x",), gpus=rng.choice((1, 2, 4, 8, 12)), **choice)  # type: ignore[arg-type]
        request = request_for(1, spec, "main", 3600)
        candidates = candidates_of(nodes, request)
        assert fast.place(request, given(candidates)) == every.place(request, given(candidates))
        assert fast.passing(request, given(candidates)) == every.passing(request, given(candidates))
