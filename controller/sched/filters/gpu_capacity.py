"""GpuCapacity: the node has enough GPUs of the requested type and memory, even if all were idle."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable


class GpuCapacity:
    name = "GpuCapacity"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if candidate.capable >= request.shape.min_gpus_per_node:
            return OK
        return unresolvable("too few GPUs of the requested type and memory")
