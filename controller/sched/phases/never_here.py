"""A job that can never run on the nodes that are up (feasibility.py, the filters' UNRESOLVABLE on the idle
cluster) waits with NodesUnavailable or NodesDrained, and holds nobody back: nothing that ends would help."""

from __future__ import annotations

from garrison.controller.sched.cycle_state import Candidacy, CycleState
from garrison.controller.sched.feasibility import Feasibility
from garrison.controller.sched.plan import Reason


def never_here(state: CycleState, c: Candidacy) -> bool:
    feasibility = state.idle.verdict(c.request, c.key).feasibility
    if feasibility == Feasibility.RUNS:
        return False
    state.waiting[c.job.job_id] = (Reason.NODES_DRAINED if feasibility == Feasibility.NEEDS_DRAINED
                                   else Reason.NODES_UNAVAILABLE)
    return True
