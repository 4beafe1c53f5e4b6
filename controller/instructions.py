"""What the engine must do on the agent links after a state change.

The state operations (controller/state.py and the modules it is made of) return these instead of doing
I/O; the engine (controller/engine.py) turns them into messages on the agents' streams.
"""

from __future__ import annotations

from dataclasses import dataclass

from garrison.model.domain import Job


@dataclass(frozen=True, slots=True)
class Launch:
    node: str
    job: Job
    attempt: int


@dataclass(frozen=True, slots=True)
class SignalAttempt:
    node: str
    job_id: int
    attempt: int
    action: str  # "signal" | "terminate" | "kill"
    signal: int = 0


@dataclass(frozen=True, slots=True)
class AckResult:
    node: str
    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class ReleaseGang:
    """Every node of the gang has launched the attempt: ``node``'s ranks may start (its start barrier)."""

    node: str
    job_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class EndSession:
    """Close ``node``'s stream: it was declared silent, so an agent that is only frozen finds out when it wakes,
    and registers again (its lease tells it whether its attempts were stopped meanwhile)."""

    node: str
    reason: str


Instruction = Launch | SignalAttempt | AckResult | ReleaseGang | EndSession
