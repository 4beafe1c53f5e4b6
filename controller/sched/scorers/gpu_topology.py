"""GpuTopology: prefer the node where the job's GPUs are as well connected as on an idle node of its kind
(a DGX-1V quad that is still fully NVLink-connected, a PCIe box's NVLink pair)."""

from __future__ import annotations

from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.snapshot import NodeView
from garrison.controller.sched.topology import Matrix, best_affinity, gpu_affinity, set_affinity

# (id(nvlink), id(topo)) -> (nvlink, topo, their affinity matrix, count -> best_affinity): gpu_affinity and best_affinity
# are cached by value, so each call hashes the node's whole matrices (64 entries each on an 8-GPU node); a
# node view keeps the same matrix objects from one cycle to the next, so they are looked up by identity
# here (checked: an entry is used only for the very objects it was made from). A memo of pure functions.
_BY_MATRIX: dict[tuple[int, int], tuple[object, object, Matrix, dict[int, int]]] = {}


def node_affinity(view: NodeView) -> tuple[Matrix, dict[int, int]]:
    """gpu_affinity(view.nvlink, view.topo), and a memo of best_affinity for it by GPU count."""
    nvlink, topo = view.nvlink, view.topo
    key = (id(nvlink), id(topo))
    found = _BY_MATRIX.get(key)
    if found is None or found[0] is not nvlink or found[1] is not topo:
        if len(_BY_MATRIX) >= 1024:
            _BY_MATRIX.clear()
        found = _BY_MATRIX[key] = (nvlink, topo, gpu_affinity(nvlink, topo), {})
    return found[2], found[3]


class GpuTopology:
    name = "GpuTopology"

    def __init__(self, weight: int = 2) -> None:
        self.weight = weight

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        if len(gpus) < 2:
            return 100
        affinity, bests = node_affinity(candidate.view)
        best = bests.get(len(gpus))
        if best is None:
            best = bests[len(gpus)] = best_affinity(affinity, len(gpus))
        if best <= 0:
            return 100
        return round(100 * set_affinity(gpus, affinity) / best)
