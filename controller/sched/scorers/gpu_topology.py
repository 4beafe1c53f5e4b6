"""GpuTopology: prefer the node where the job's GPUs are as well connected as on an idle node of its kind
(a DGX-1V quad that is still fully NVLink-connected, a PCIe box's NVLink pair)."""

from __future__ import annotations

from garrison.controller.sched.framework import Candidate, Request
from garrison.controller.sched.topology import best_affinity, gpu_affinity, set_affinity


class GpuTopology:
    name = "GpuTopology"

    def __init__(self, weight: int = 2) -> None:
        self.weight = weight

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        if len(gpus) < 2:
            return 100
        affinity = gpu_affinity(candidate.view.nvlink, candidate.view.topo)
        best = best_affinity(affinity, len(gpus))
        if best <= 0:
            return 100
        return round(100 * set_affinity(gpus, affinity) / best)
