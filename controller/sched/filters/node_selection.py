"""The job's own choice of nodes (sbatch -C, -w, --exclusive): NodeFeatures, NodeListed, NodeExclusive."""

from __future__ import annotations

from garrison.controller.sched.framework import OK, Candidate, Request, Status, unresolvable, unschedulable
from garrison.model.features import satisfies


class NodeFeatures:
    """The node has the features the job's -C/--constraint expression asks for."""

    name = "NodeFeatures"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if satisfies(candidate.view.features, request.constraint):
            return OK
        return unresolvable("lacks the features the job asks for")


def restricted_to_list(request: Request) -> bool:
    """-w names every node the job gets (else it names some, and the placer adds others: Slurm's -N > -w)."""
    count = request.shape.node_count
    return bool(request.nodelist) and (count is None or count <= len(request.nodelist))


class NodeListed:
    """The node is one the job named with -w/--nodelist, when those are all the nodes it gets."""

    name = "NodeListed"
    reads_node_name = True
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if not restricted_to_list(request) or candidate.view.name in request.nodelist:
            return OK
        return unresolvable("not in the job's --nodelist")


class NodeExclusive:
    """--exclusive: such a job wants a node nothing else holds (and then takes all of it); no other job joins a
    node an --exclusive job holds, even one asking for no GPU, CPU or memory."""

    name = "NodeExclusive"
    reads_node_name = False
    about_node_state = False

    def check(self, request: Request, candidate: Candidate) -> Status:
        if not request.exclusive:
            return unschedulable("held by an --exclusive job") if candidate.held_exclusively else OK
        view = candidate.view
        whole = (
            candidate.idle
            and len(candidate.usable) == candidate.capable
            and len(candidate.free_cpus) >= view.cpus
            and candidate.free_memory_mb >= view.memory_mb
        )
        return OK if whole else unschedulable("in use (--exclusive wants the whole node)")
