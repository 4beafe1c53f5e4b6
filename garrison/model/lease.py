"""The node lease (fencing): how long a silent node's ranks may still run, seen from both sides.

The controller grants each agent a lease of ``lease_s`` with every heartbeat it answers; the lease runs
from the moment the agent *sent* that heartbeat (so it never outlasts the controller's own view, which
counts from when it received it). The agent writes the lease's end to a file that every supervisor on
the node reads on a timer; a supervisor whose lease has run out stops its ranks (SIGTERM, the kill wait,
SIGKILL). The controller therefore releases a silent node's attempts (requeues them) only after
``fence_delay_s``: the lease, the supervisors' check interval, the kill wait and a margin, when their
ranks are known to have stopped. Plain values and arithmetic, no I/O.
"""

from __future__ import annotations

# How often a supervisor reads the lease file (nodeagent/supervisor/core.py keeps its own copy of this
# number, since it imports nothing from the package; a unit test checks the two agree).
SUPERVISOR_LEASE_CHECK_S = 1.0
# Scheduling delays, SIGKILL reaching every process of a group, clock rate differences: slack on top.
FENCE_MARGIN_S = 2.0


def fence_delay_s(lease_s: float, kill_wait_s: float) -> float:
    """Seconds after the controller last heard from a node by which every rank there has been stopped by
    its supervisor (whether the agent is frozen, dead or cut off): the lease, one check interval, the kill
    wait between SIGTERM and SIGKILL, and the margin."""
    return lease_s + SUPERVISOR_LEASE_CHECK_S + kill_wait_s + FENCE_MARGIN_S
