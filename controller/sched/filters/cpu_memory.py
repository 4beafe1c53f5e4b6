"""CpuMemoryFit: the node has the CPUs and host memory the job asks for on each of its nodes."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable, unschedulable


def cpus_needed(request: Request, gpus_on_node: int) -> int:
    return request.cpus_per_gpu * gpus_on_node if gpus_on_node else request.cpus_per_node


def mem_needed(request: Request, gpus_on_node: int, node_memory_mb: int = 0) -> int:
    """Host memory the job holds on a node of ``node_memory_mb`` where it has ``gpus_on_node`` GPUs."""
    if request.mem_whole_node:
        return node_memory_mb
    return request.mem_mb or request.mem_per_gpu_mb * gpus_on_node


class CpuMemoryFit:
    name = "CpuMemoryFit"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        cpus = cpus_needed(request, request.shape.min_gpus_per_node)
        view = candidate.view
        mem = mem_needed(request, request.shape.min_gpus_per_node, view.memory_mb)
        if cpus > view.cpus or mem > view.memory_mb:
            return unresolvable("too few CPUs or too little memory")
        if cpus > len(candidate.free_cpus) or mem > candidate.free_memory_mb:
            return unschedulable("CPUs or memory busy")
        return OK
