"""NodeNotExcluded: the job did not ask to stay off the node (gsub -x, sbatch --exclude)."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable


class NodeNotExcluded:
    name = "NodeNotExcluded"
    reads_node_name = True
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if candidate.view.name in request.exclude:
            return unresolvable("excluded by the job")
        return OK
