"""What a node is told to start: one attempt of a job, seen from one node of its allocation.

The one launch description: the controller builds it (from the job, the attempt and the head node's
address), the wire carries it (``garrison.wire.convert.launch_to_pb`` / ``launch_from_pb``), and the node
agent plans each rank's environment from it. Plain values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from garrison.model.domain import Allocation, JobSpec


@dataclass(frozen=True, slots=True)
class LaunchDescription:
    job_id: int
    attempt: int
    user: str
    uid: int
    gid: int
    spec: JobSpec
    allocation: Allocation  # the whole gang, in node-rank order
    node_rank: int  # which entry of ``allocation`` is the receiving node
    master_addr: str
    master_port: int
    restart_count: int
    kill_wait_s: float
    time_limit_s: int
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def node(self) -> str:
        """The receiving node's name."""
        return self.allocation.nodes[self.node_rank].node
