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
    # -- What the agent cannot know by itself, for Slurm's variables (SLURM_JOB_ACCOUNT, ...) --------------
    account: str = ""  # the resolved account, partition and QoS (not only what the user typed)
    partition: str = ""
    qos: str = ""
    cluster_name: str = ""  # the controller's cluster_name setting
    array_task_count: int = 0  # the array's index set, summarised: 0 when not an array task
    array_task_min: int = 0
    array_task_max: int = 0
    array_task_step: int = 0
    batch_signal: int = 0  # --signal=B:SIG: SIG goes to each rank's own process, not its group; 0 = none
    start_time: float = 0.0  # the attempt's start as the controller recorded it (SLURM_JOB_START_TIME); 0: unknown
    # A gang of several nodes: the ranks start only once the controller has heard that every node launched
    # (GangRelease), so no rank runs user code when the launch fails on another node. One node: no wait.
    start_barrier: bool = False

    @property
    def node(self) -> str:
        """The receiving node's name."""
        return self.allocation.nodes[self.node_rank].node
