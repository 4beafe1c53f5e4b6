"""Controller requests and agent messages <-> the engine's commands, results and instructions.

The engine (controller/engine.py) speaks only controller/commands.py's values; this module is where the
controller's RPC layer turns messages into them and them into messages. A request that cannot become a
command is refused here with a one-line ValidationError (INVALID_ARGUMENT), as the engine refused it before
it stopped reading messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from garrison.controller.commands import (
    AgentEvent,
    AgentInstruction,
    AttemptFinished,
    AttemptStarted,
    CancelCommand,
    CancelResult,
    CheckpointMarked,
    JobFilter,
    LeaseGrant,
    NodeRow,
    PartitionRow,
    Registration,
    RunningAttempt,
    RunningUsageReported,
    StillAlive,
    SubmitCommand,
    Submitted,
    TestSubmitResult,
    Welcome,
)
from garrison.controller.instructions import ReleaseGang
from garrison.controller.rpc.convert_step_messages import (
    STEP_EVENT_KINDS,
    step_event_from_pb,
    step_instruction_to_pb,
)
from garrison.controller.signals import parse_signal_name
from garrison.controller.state import AckResult, SignalAttempt
from garrison.controller.step_commands import AckStep, AckStepOutput, LaunchStep, SignalStep, StepStdin
from garrison.controller.validate import ValidationError
from garrison.model.domain import JobState
from garrison.model.launch import LaunchDescription
from garrison.model.state_codes import long_state_name
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire import convert

# --------------------------------------------------------------------------------------------------
# Client requests -> commands


def submit_command_from_pb(request: pb.SubmitJobRequest) -> SubmitCommand:
    """A SubmitJob request as a command (with or without test_only: the servicer chooses the operation)."""
    spec = convert.spec_from_pb(request.spec)  # InvalidRequest (INVALID_ARGUMENT) for a bad launch mode
    if request.HasField("array_max_running"):
        spec = replace(spec, array_max_running=request.array_max_running)
    return SubmitCommand(spec=spec, array_indices=tuple(request.array_indices), hold=request.hold)


def job_states(names: Iterable[str]) -> frozenset[JobState]:
    """State names in any case, or Slurm's codes (PD, R: what scancel -t and squeue -t take) -> states;
    ValidationError naming the first unknown one (in sorted order)."""
    upper = {long_state_name(name) for name in names}
    unknown = upper - {state.value for state in JobState}
    if unknown:
        raise ValidationError(f"unknown job state {sorted(unknown)[0]!r}")
    return frozenset(JobState(name) for name in upper)


def job_filter_from_pb(request: pb.ListJobsRequest) -> JobFilter:
    return JobFilter(
        job_refs=tuple(request.job_ids),
        users=frozenset(request.users),
        states=job_states(request.states),
        names=tuple(request.names),
        partitions=tuple(request.partitions),
        accounts=tuple(request.accounts),
    )


def cancel_command_from_pb(request: pb.CancelJobsRequest) -> CancelCommand:
    """The signal is read before the states, so a request wrong in both is refused for its signal."""
    signum = None
    if request.signal:
        try:
            signum = parse_signal_name(request.signal, "signal")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
    selection = JobFilter(
        job_refs=tuple(request.job_ids),
        users=frozenset({request.user}) if request.user else frozenset(),
        states=job_states(request.states),
        names=tuple(request.names),
        partitions=tuple(request.partitions),
        accounts=tuple(request.accounts),
    )
    return CancelCommand(jobs=selection, signal=signum)


# --------------------------------------------------------------------------------------------------
# Results -> responses


def submitted_to_pb(submitted: Submitted) -> pb.SubmitJobResponse:
    return pb.SubmitJobResponse(job_id=submitted.job_id, task_count=submitted.task_count)


def submit_estimate_to_pb(result: TestSubmitResult) -> pb.SubmitJobResponse:
    """gsub --test-only's answer."""
    response = pb.SubmitJobResponse(partition=result.partition, reason=result.reason, nodes=result.nodes)
    if result.estimated_start is not None:  # absent: no estimate
        response.estimated_start = result.estimated_start
    return response


def cancel_result_to_pb(result: CancelResult) -> pb.CancelJobsResponse:
    return pb.CancelJobsResponse(
        cancelled=result.cancelled, signalled=result.signalled, not_running=result.not_running
    )


def node_row_to_pb(row: NodeRow) -> pb.NodeInfo:
    info = convert.node_to_pb(
        row.node, list(row.allocated_gpus), row.connected, row.allocated_cpus, row.allocated_memory_mb
    )
    info.partitions.extend(row.partitions)
    return info


def partition_row_to_pb(row: PartitionRow) -> pb.PartitionSummary:
    return pb.PartitionSummary(
        name=row.name, default=row.default, default_time_s=row.default_time_s, max_time_s=row.max_time_s
    )


# --------------------------------------------------------------------------------------------------
# The agent link


def registration_from_pb(register: pb.Register, address: str) -> Registration:
    """An agent's Register, reachable at ``address`` (its own, or the peer's host when it gave none)."""
    return Registration(
        node=register.node_name,
        address=address,
        inventory=convert.inventory_from_pb(register.inventory),
        running=tuple(RunningAttempt(r.job_id, r.attempt, r.checkpoint_time) for r in register.running),
        finished=tuple(convert.result_from_pb(r) for r in register.finished),
        lease_request=register.lease_request,
    )


# An agent's node fault becomes the node's reason in listings: bounded, one printable line.
MAX_NODE_FAULT_CHARS = 200


def shown_node_fault(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:MAX_NODE_FAULT_CHARS])


def agent_event_from_pb(message: pb.AgentMessage) -> AgentEvent:
    """What an agent's message after its Register says; a heartbeat, an empty message or a second Register
    only shows that the node is alive."""
    kind = message.WhichOneof("kind")
    if kind == "started":
        return AttemptStarted(job_id=message.started.job_id, attempt=message.started.attempt)
    if kind == "checkpointed":
        c = message.checkpointed
        return CheckpointMarked(job_id=c.job_id, attempt=c.attempt, time=c.time)
    if kind == "finished":
        return AttemptFinished(result=convert.result_from_pb(message.finished))
    if kind == "heartbeat":
        return StillAlive(lease_request=message.heartbeat.lease_request,
                          node_fault=shown_node_fault(message.heartbeat.node_fault))
    if kind == "running_usage":
        u = message.running_usage
        return RunningUsageReported(job_id=u.job_id, attempt=u.attempt, usage=convert.attempt_usage_from_pb(u.usage))
    if kind in STEP_EVENT_KINDS:
        step_event = step_event_from_pb(message)
        if step_event is not None:
            return step_event
    return StillAlive()


SIGNAL_ACTIONS = {"signal": pb.SignalJob.SIGNAL, "terminate": pb.SignalJob.TERMINATE, "kill": pb.SignalJob.KILL}


def instruction_to_pb(instruction: AgentInstruction) -> pb.ControllerMessage:
    """What the engine tells an agent, as the message on the agent's stream."""
    if isinstance(instruction, LaunchDescription):
        return pb.ControllerMessage(launch=convert.launch_to_pb(instruction))
    if isinstance(instruction, SignalAttempt):
        return pb.ControllerMessage(
            signal=pb.SignalJob(
                job_id=instruction.job_id,
                attempt=instruction.attempt,
                action=SIGNAL_ACTIONS[instruction.action],
                signal=instruction.signal,
            )
        )
    if isinstance(instruction, AckResult):
        return pb.ControllerMessage(ack=pb.AckResult(job_id=instruction.job_id, attempt=instruction.attempt))
    if isinstance(instruction, LeaseGrant):
        return pb.ControllerMessage(lease=pb.NodeLeaseGrant(request=instruction.request,
                                                            duration_s=instruction.duration_s))
    if isinstance(instruction, ReleaseGang):
        return pb.ControllerMessage(release=pb.GangRelease(job_id=instruction.job_id, attempt=instruction.attempt))
    if isinstance(instruction, Welcome):
        return pb.ControllerMessage(registered=pb.RegisterAck(heartbeat_interval_s=instruction.heartbeat_interval_s,
                                                              step_output_acks=True, accepts_batches=True))
    if isinstance(instruction, LaunchStep | SignalStep | StepStdin | AckStep | AckStepOutput):
        return step_instruction_to_pb(instruction)
    raise TypeError(f"no message for {type(instruction).__name__}")
