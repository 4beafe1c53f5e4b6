"""Job steps on the agent link: agents' step messages as controller/step_commands.py events, and the
controller's step instructions as messages."""

from __future__ import annotations

from garrison.controller.step_commands import (
    AckStep,
    AckStepOutput,
    LaunchStep,
    SignalStep,
    StepEvent,
    StepInstruction,
    StepNodeFinished,
    StepOutputReceived,
    StepStdin,
    StepTasksExited,
)
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert_steps import step_launch_to_pb

STEP_EVENT_KINDS = frozenset({"step_output", "step_exits", "step_result"})
SIGNAL_ACTIONS = {"signal": pb.SignalJob.SIGNAL, "terminate": pb.SignalJob.TERMINATE, "kill": pb.SignalJob.KILL}


def step_event_from_pb(message: pb.AgentMessage) -> StepEvent | None:
    kind = message.WhichOneof("kind")
    if kind == "step_output":
        o = message.step_output
        return StepOutputReceived(job_id=o.job_id, step_id=o.step_id, task=o.task, stream=o.stream, data=o.data,
                                  offset=o.offset if o.HasField("offset") else None)
    if kind == "step_exits":
        e = message.step_exits
        return StepTasksExited(job_id=e.job_id, step_id=e.step_id, exits=tuple((x.task, x.exit_code) for x in e.exits))
    if kind == "step_result":
        r = message.step_result
        return StepNodeFinished(job_id=r.job_id, step_id=r.step_id, exits=tuple((x.task, x.exit_code) for x in r.exits),
                                error=r.error[:500])
    return None


def step_instruction_to_pb(instruction: StepInstruction) -> pb.ControllerMessage:
    if isinstance(instruction, LaunchStep):
        return pb.ControllerMessage(launch_step=step_launch_to_pb(instruction.description))
    if isinstance(instruction, SignalStep):
        return pb.ControllerMessage(signal_step=pb.StepSignal(
            job_id=instruction.job_id, step_id=instruction.step_id, action=SIGNAL_ACTIONS[instruction.action],
            signal=instruction.signal))
    if isinstance(instruction, StepStdin):
        message = pb.StepInput(job_id=instruction.job_id, step_id=instruction.step_id, data=instruction.data)
        if instruction.window is not None:
            message.window.rows, message.window.cols = instruction.window
        return pb.ControllerMessage(step_input=message)
    if isinstance(instruction, AckStep):
        return pb.ControllerMessage(step_ack=pb.StepAck(job_id=instruction.job_id, step_id=instruction.step_id))
    if isinstance(instruction, AckStepOutput):
        return pb.ControllerMessage(step_output_ack=pb.StepOutputAck(
            job_id=instruction.job_id, step_id=instruction.step_id,
            streams=[pb.StepStreamOffset(task=t, stream=s, offset=o) for t, s, o in instruction.streams],
            rewind=instruction.rewind))
    raise TypeError(f"no message for {type(instruction).__name__}")
