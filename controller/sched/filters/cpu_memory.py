"""CpuMemoryFit: the node has the CPUs and host memory the job asks for on each of its nodes."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable, unschedulable


def cpus_needed(request: Request, gpus_on_node: int) -> int:
    return request.cpus_per_gpu * gpus_on_node if gpus_on_node else request.cpus_per_node


class CpuMemoryFit:
    name = "CpuMemoryFit"

    def check(self, request: Request, candidate: Candidate) -> Status:
        cpus = cpus_needed(request, request.shape.min_gpus_per_node)
        view = candidate.view
        if cpus > view.cpus or request.mem_mb > view.memory_mb:
            return unresolvable("too few CPUs or too little memory")
        if cpus > len(candidate.free_cpus) or request.mem_mb > candidate.free_memory_mb:
            return unschedulable("CPUs or memory busy")
        return OK
