"""Gang placement: where a whole job fits, all of it or nothing.

``place`` answers one question for one job against the free resources of a snapshot: which nodes and which
GPU indices on each. It never returns a partial allocation. The device choice inside a node prefers the
best-connected GPU set (most NVLink lanes among the chosen GPUs), and nodes are chosen best-fit (the
fewest free GPUs that still fit) so that whole nodes stay free for large gangs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from garrison.controller.domain import Allocation, JobSpec, NodeAllocation
from garrison.controller.sched.snapshot import NodeView


@dataclass(frozen=True, slots=True)
class GangShape:
    """How many nodes and how many GPUs on each, once the request is resolved against the cluster."""

    node_count: int | None  # None: the scheduler chooses the spread
    gpus_per_node: int | None  # None with node_count None: a total to spread
    total_gpus: int


def gang_shape(spec: JobSpec) -> GangShape:
    total = spec.total_gpus()
    if spec.gpus_per_node is not None:
        return GangShape(spec.nodes or 1, spec.gpus_per_node, total)
    if spec.nodes is not None:
        if spec.gpus is None:
            return GangShape(spec.nodes, 0, 0)
        return GangShape(spec.nodes, None, total)
    if total == 0:
        return GangShape(1, 0, 0)
    return GangShape(None, None, total)


def gpu_matches(gpu_name: str, gpu_type: str | None) -> bool:
    """`--gpus a100:2` matches "NVIDIA A100-SXM4-40GB": a case-insensitive substring test, like Slurm's
    AutoDetect type names derived from the product name."""
    return gpu_type is None or gpu_type.lower() in gpu_name.lower()


def usable_gpus(node: NodeView, gpu_type: str | None) -> list[int]:
    return sorted(i for i in node.free_gpus if gpu_matches(node.gpu_names[i], gpu_type))


def pick_connected_gpus(candidates: Sequence[int], count: int, nvlink: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The `count` GPUs among `candidates` with the most NVLink lanes between them (greedy from each seed).

    Greedy growth from every seed is exact for the machines we know (DGX-1V quads, NVLink pairs, NVSwitch
    all-to-all) and costs O(n^3) for n <= 8 candidates, which is nothing next to a cycle's budget.
    """
    if count <= 0:
        return ()
    if count >= len(candidates):
        return tuple(candidates[:count])
    if not nvlink or count == 1:
        return tuple(candidates[:count])
    best: tuple[int, tuple[int, ...]] | None = None
    for seed in candidates:
        chosen = [seed]
        remaining = [c for c in candidates if c != seed]
        score = 0
        while len(chosen) < count:
            gain, pick = max((sum(nvlink[c][o] for o in chosen), -c) for c in remaining)
            chosen.append(-pick)
            remaining.remove(-pick)
            score += gain
        ordered = tuple(sorted(chosen))
        if best is None or score > best[0] or (score == best[0] and ordered < best[1]):
            best = (score, ordered)
    assert best is not None
    return best[1]


def _node_allocation(node: NodeView, count: int, gpu_type: str | None) -> NodeAllocation:
    gpus = pick_connected_gpus(usable_gpus(node, gpu_type), count, node.nvlink)
    return NodeAllocation(node=node.name, gpus=gpus)


def _best_fit(nodes: Iterable[NodeView], need: int, gpu_type: str | None) -> list[NodeView]:
    """Nodes that can give `need` GPUs, tightest fit first (ties by name for determinism)."""
    fitting = [(len(usable_gpus(n, gpu_type)), n.name, n) for n in nodes]
    return [n for free, _, n in sorted(fitting, key=lambda t: (t[0], t[1])) if free >= need]


def place(spec: JobSpec, nodes: Sequence[NodeView]) -> Allocation | None:
    """An allocation for the whole job on `nodes` (already filtered to the eligible ones), or None."""
    shape = gang_shape(spec)
    if shape.node_count is not None and shape.gpus_per_node is not None:
        chosen = _best_fit(nodes, shape.gpus_per_node, spec.gpu_type)[: shape.node_count]
        if len(chosen) < shape.node_count:
            return None
        return Allocation(tuple(_node_allocation(n, shape.gpus_per_node, spec.gpu_type) for n in chosen))
    if shape.node_count is not None:
        # -N n -G g: spread g over exactly n nodes, the first nodes taking the remainder.
        per_node = [shape.total_gpus // shape.node_count] * shape.node_count
        for i in range(shape.total_gpus % shape.node_count):
            per_node[i] += 1
        available = _best_fit(nodes, per_node[-1], spec.gpu_type)
        allocations: list[NodeAllocation] = []
        for need in per_node:
            pick = next((n for n in available if len(usable_gpus(n, spec.gpu_type)) >= need), None)
            if pick is None:
                return None
            available.remove(pick)
            allocations.append(_node_allocation(pick, need, spec.gpu_type))
        return Allocation(tuple(allocations))
    # -G g alone: one node if any fits (best fit), else the fewest nodes, largest free sets first.
    single = _best_fit(nodes, shape.total_gpus, spec.gpu_type)
    if single:
        return Allocation((_node_allocation(single[0], shape.total_gpus, spec.gpu_type),))
    by_free = sorted(nodes, key=lambda n: (-len(usable_gpus(n, spec.gpu_type)), n.name))
    remaining = shape.total_gpus
    allocations = []
    for node in by_free:
        free = len(usable_gpus(node, spec.gpu_type))
        if free == 0:
            break
        take = min(free, remaining)
        allocations.append(_node_allocation(node, take, spec.gpu_type))
        remaining -= take
        if remaining == 0:
            return Allocation(tuple(allocations))
    return None
