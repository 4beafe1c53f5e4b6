"""What the engine is asked to do and what it answers, in the domain's words (no protobuf).

controller/rpc/ turns requests and agents' messages into these commands and events
(controller/rpc/convert_requests.py) and the engine's results back into messages; the engine
(controller/engine.py) takes and returns only these, so it and ClusterState run and are tested without a
wire format. Plain frozen values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from garrison.controller.instructions import ReleaseGang
from garrison.controller.state import AckResult, SignalAttempt
from garrison.controller.step_commands import StepEvent, StepInstruction
from garrison.model.domain import AttemptUsage, JobSpec, JobState, Node, NodeInventory, NodeResult
from garrison.model.launch import LaunchDescription

# --------------------------------------------------------------------------------------------------
# Client commands and their results


@dataclass(frozen=True, slots=True)
class SubmitCommand:
    """gsub: one job, or an array of tasks when ``array_indices`` is not empty."""

    spec: JobSpec  # with the array's --array %N limit in ``array_max_running``
    array_indices: tuple[int, ...] = ()
    hold: bool = False  # gsub --hold: submitted held


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: int  # the job's id, or for an array the array job id (its first task's id)
    task_count: int


@dataclass(frozen=True, slots=True)
class TestSubmitResult:
    """gsub --test-only: when and where the job would start, and why it would wait."""

    __test__ = False  # a result type, not a test class for pytest to collect

    partition: str
    reason: str = ""  # "" if it would start now
    estimated_start: float | None = None  # None: no estimate
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JobFilter:
    """squeue's and scancel's selection: job references, then filters; each one given must hold (an empty
    one holds for every job)."""

    job_refs: tuple[str, ...] = ()  # "12", "12_3" (one array task) or "12" for a whole array
    users: frozenset[str] = frozenset()  # a set: every job is checked against it
    states: frozenset[JobState] = frozenset()
    names: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()

    @property
    def has_filters(self) -> bool:
        """Whether anything but job references narrows the selection."""
        return bool(self.users or self.states or self.names or self.partitions or self.accounts)


@dataclass(frozen=True, slots=True)
class CancelCommand:
    """gcancel: cancel the selected jobs, or with ``signal`` send that signal to the ranks of those running."""

    jobs: JobFilter
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: tuple[int, ...] = ()
    signalled: tuple[int, ...] = ()
    not_running: tuple[str, ...] = ()  # references the user named of which no job was running (signal only)


@dataclass(frozen=True, slots=True)
class NodeRow:
    """ginfo's view of one node: what it has, what is in use, and which partitions it is in."""

    node: Node
    allocated_gpus: tuple[int, ...]
    connected: bool
    allocated_cpus: int
    allocated_memory_mb: int
    partitions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PartitionRow:
    name: str
    default: bool
    default_time_s: int
    max_time_s: int


# --------------------------------------------------------------------------------------------------
# The agent link: what agents tell the engine, and what the engine tells them


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    """An attempt an agent still runs when it (re)registers, with its last checkpoint mark (0: none)."""

    job_id: int
    attempt: int
    checkpoint_time: float = 0.0


@dataclass(frozen=True, slots=True)
class Registration:
    """An agent's first message: who it is, what the node has, and what it still runs or has finished."""

    node: str
    address: str
    inventory: NodeInventory
    running: tuple[RunningAttempt, ...] = ()
    finished: tuple[NodeResult, ...] = ()
    lease_request: int = 0  # the node lease request the registration carries (0: the agent asks for none)


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class CheckpointMarked:
    job_id: int
    attempt: int
    time: float


@dataclass(frozen=True, slots=True)
class RunningUsageReported:
    """A node's figures for a running attempt so far (peak memory, CPU time): what gjob shows, as sstat."""

    job_id: int
    attempt: int
    usage: AttemptUsage


@dataclass(frozen=True, slots=True)
class AttemptFinished:
    result: NodeResult


@dataclass(frozen=True, slots=True)
class StillAlive:
    """Any other message (a heartbeat): it proves the node is alive, and may ask for the node lease."""

    lease_request: int = 0  # 0: no lease asked for
    node_fault: str | None = None  # a heartbeat's: "" healthy, else what keeps the node from running jobs


AgentEvent = AttemptStarted | CheckpointMarked | RunningUsageReported | AttemptFinished | StillAlive | StepEvent


@dataclass(frozen=True, slots=True)
class Welcome:
    """The answer to a registration: how often the agent must show it is alive."""

    heartbeat_interval_s: float


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """The node lease for the agent's request ``request``: its ranks may run ``duration_s`` from when it sent
    that request (garrison/model/lease.py)."""

    request: int
    duration_s: float


# What the engine hands an agent's session to send: the welcome, a lease, a launch, a gang's release, a
# signal, an acknowledgement, a job step's messages.
AgentInstruction = (
    Welcome | LeaseGrant | LaunchDescription | ReleaseGang | SignalAttempt | AckResult
    | StepInstruction
)


class AgentLink(Protocol):
    """One connected agent, as the engine sees it. The RPC layer's session (controller/rpc/services.py)
    puts each instruction on the agent's stream as a message."""

    @property
    def node(self) -> str: ...

    @property
    def address(self) -> str: ...  # where the other nodes reach this one (MASTER_ADDR for rank 0)

    def send(self, instruction: AgentInstruction) -> None: ...

    def close(self) -> None: ...
