"""NodeReady: the node is up, connected and not drained."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable


class NodeReady:
    name = "NodeReady"
    reads_node_name = False
    about_node_state = True

    def check(self, request: Request, candidate: Candidate) -> Status:
        view = candidate.view
        if view.drained:
            return unresolvable("drained")
        if not view.schedulable:
            return unresolvable("down")
        return OK
