"""NumaLocality: prefer the node where the job's CPUs can all sit on the NUMA nodes of its GPUs."""

from __future__ import annotations

from garrison.controller.sched.filters.cpu_memory import cpus_needed
from garrison.controller.sched.framework import Candidate, Request


def local_cpus(candidate: Candidate, gpus: tuple[int, ...]) -> frozenset[int]:
    view = candidate.view
    local: frozenset[int] = frozenset()
    for gpu in gpus:
        if gpu < len(view.gpu_cpus):
            local |= view.gpu_cpus[gpu]
    return local & candidate.free_cpus


class NumaLocality:
    name = "NumaLocality"

    def __init__(self, weight: int = 1) -> None:
        self.weight = weight

    def score(self, request: Request, candidate: Candidate, gpus: tuple[int, ...]) -> int:
        need = cpus_needed(request, len(gpus))
        if need == 0 or not gpus:
            return 100
        return round(100 * min(1.0, len(local_cpus(candidate, gpus)) / need))
