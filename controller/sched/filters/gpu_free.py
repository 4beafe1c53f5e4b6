"""GpuFree: enough of the node's matching GPUs are free for the whole of the job's run.

A GPU reserved for a higher-priority job from time T counts as free only for a job that ends by T (the
backfill rule), so the candidate's ``usable`` list already reflects reservations.
"""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unschedulable


class GpuFree:
    name = "GpuFree"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if len(candidate.usable) >= request.shape.min_gpus_per_node:
            return OK
        return unschedulable("GPUs busy")
