"""What agents tell the controller about job steps, and what it tells them: domain values, no protobuf.

The agent link's converters (controller/rpc/convert_requests.py) turn them into messages and back; the
engine hands them to its StepManager (controller/steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from garrison.model.steps import StepLaunchDescription

# --------------------------------------------------------------------------------------------------
# Agent -> controller


@dataclass(frozen=True, slots=True)
class StepOutputReceived:
    job_id: int
    step_id: int
    task: int
    stream: int  # 1 stdout, 2 stderr
    data: bytes
    offset: int | None = None  # where data starts in the task's stream; None from an agent that does not say


@dataclass(frozen=True, slots=True)
class StepTasksExited:
    """Some tasks of a step ended on a node (the others may still run): for --kill-on-bad-exit."""

    job_id: int
    step_id: int
    exits: tuple[tuple[int, int], ...]  # (task, exit code)


@dataclass(frozen=True, slots=True)
class StepNodeFinished:
    """Every task of the step on the node has ended; its output has all been sent before this."""

    job_id: int
    step_id: int
    exits: tuple[tuple[int, int], ...]
    error: str = ""  # the launch failed on that node


StepEvent = StepOutputReceived | StepTasksExited | StepNodeFinished

# --------------------------------------------------------------------------------------------------
# Controller -> agent


@dataclass(frozen=True, slots=True)
class LaunchStep:
    description: StepLaunchDescription


@dataclass(frozen=True, slots=True)
class SignalStep:
    job_id: int
    step_id: int
    action: str  # "signal" | "terminate" | "kill", as SignalAttempt's
    signal: int = 0


@dataclass(frozen=True, slots=True)
class StepStdin:
    """--pty: bytes typed at gsrun, or the terminal's new size (rows, cols), for task 0's terminal."""

    job_id: int
    step_id: int
    data: bytes = b""
    window: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class AckStep:
    """The node's result for the step is recorded: it may forget the step."""

    job_id: int
    step_id: int


@dataclass(frozen=True, slots=True)
class AckStepOutput:
    """The controller has the output of these streams up to these offsets: ((task, stream, offset), ...)."""

    job_id: int
    step_id: int
    streams: tuple[tuple[int, int, int], ...]
    rewind: bool = False  # the offsets go back: send again from them (a gsrun took the step up after a restart)


StepInstruction = LaunchStep | SignalStep | StepStdin | AckStep | AckStepOutput
