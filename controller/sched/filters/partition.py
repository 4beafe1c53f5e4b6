"""PartitionMember: the node belongs to the job's partition."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable


class PartitionMember:
    name = "PartitionMember"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if request.partition in candidate.view.partitions:
            return OK
        return unresolvable(f"not in partition {request.partition}")
