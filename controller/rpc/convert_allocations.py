"""galloc's allocation status and release results as messages (controller/allocations.py's values)."""

from __future__ import annotations

from garrison.controller.allocations import AllocationStatus, ReleaseResult
from garrison.protos.v1 import garrison_pb2 as pb


def allocation_status_to_pb(status: AllocationStatus, now: float) -> pb.AllocationStatusReply:
    msg = pb.AllocationStatusReply(
        job_id=status.job_id,
        state=status.state.value,
        reason=status.reason,
        keepalive_s=status.keepalive_s,
        position=status.position,
        outcome=status.outcome.value if status.outcome is not None else "",
        nodes=list(status.nodes),
        environment=status.environment,
        now=now,
    )
    if status.estimated_start is not None:
        msg.estimated_start = status.estimated_start
    return msg


def release_result_to_pb(result: ReleaseResult) -> pb.ReleaseAllocationReply:
    return pb.ReleaseAllocationReply(released=result.released, state=result.state.value)
