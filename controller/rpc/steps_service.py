"""gsrun's RPCs: RunStep (one stream per step: the request, then output one way and the terminal's bytes,
signals and window sizes the other), ListSteps and CancelStep. Thin, as services.py's servicers: they
authenticate, convert and hand over to the engine's StepManager (controller/steps.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from garrison.controller.engine import Engine
from garrison.controller.signals import parse_signal_name
from garrison.controller.steps import StepNotFound, StepPermissionDenied
from garrison.model.domain import Principal
from garrison.model.jobrefs import parse_job_ref
from garrison.model.steps import RefusalKind, Step, StepRefused, StepState, parse_step_ref
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert import InvalidRequest
from garrison.wire.convert_steps import step_request_from_pb, step_to_pb

log = logging.getLogger("garrison.controller.rpc.steps")

# Output held for one gsrun that reads too slowly; beyond it output is dropped, and gsrun told how much.
MAX_BUFFERED_OUTPUT = 8 << 20
MAX_STDIN_CHUNK = 64 << 10
MAX_LISTED_STEPS = 10000

STEP_ERROR_CODES: dict[type[Exception], grpc.StatusCode] = {
    StepNotFound: grpc.StatusCode.NOT_FOUND,
    StepPermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
}


def refusal_code(exc: StepRefused) -> grpc.StatusCode:
    # BUSY is not the caller's mistake: the same request may succeed once other steps end. (Not
    # RESOURCE_EXHAUSTED: on the local socket that means its per-user limits, and gsrun then tries gRPC.)
    return grpc.StatusCode.FAILED_PRECONDITION if exc.kind == RefusalKind.BUSY else grpc.StatusCode.INVALID_ARGUMENT


class StreamClient:
    """A step's gsrun as the StepManager sees it: messages queued for the stream, output bounded."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.StepServerMessage | None] = asyncio.Queue()
        self.buffered = 0
        self.dropped = 0
        self.done = False

    def output(self, task: int, stream: int, data: bytes, offset: int | None = None) -> None:
        if self.buffered + len(data) > MAX_BUFFERED_OUTPUT:
            self.dropped += len(data)
            return
        self.buffered += len(data)
        chunk = pb.StepOutputChunk(task=task, stream=stream, data=data)
        if offset is not None:
            chunk.offset = offset
        self.queue.put_nowait(pb.StepServerMessage(output=chunk))

    def notice(self, text: str) -> None:
        self.queue.put_nowait(pb.StepServerMessage(notice=text))

    def ended(self, step: Step, task_codes: tuple[int, ...]) -> None:
        self.done = True
        self.queue.put_nowait(pb.StepServerMessage(ended=pb.StepEndInfo(
            exit_code=step.exit_code or 0, state=step.state.value, task_exit_codes=list(task_codes),
            reason=step.reason)))
        self.queue.put_nowait(None)

    def close(self) -> None:
        self.done = True  # not gone: replaced, so its end must not stop the step
        self.queue.put_nowait(None)

    def taken(self, message: pb.StepServerMessage) -> pb.StepServerMessage | None:
        """Account for a message leaving the queue; a notice of dropped output once there is room again."""
        if message.WhichOneof("kind") == "output":
            self.buffered -= len(message.output.data)
        if self.dropped and self.buffered < MAX_BUFFERED_OUTPUT // 2:
            dropped, self.dropped = self.dropped, 0
            return pb.StepServerMessage(notice=f"{dropped} bytes of output dropped: gsrun read too slowly")
        return None


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, StepRefused):
        await context.abort(refusal_code(exc), str(exc))
    for kind, code in STEP_ERROR_CODES.items():
        if isinstance(exc, kind):
            await context.abort(code, str(exc).splitlines()[0] if str(exc) else kind.__name__)
    raise exc


async def run_step(engine: Engine, principal: Principal, request_iterator: AsyncIterator[pb.StepClientMessage],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[pb.StepServerMessage]:
    first = await anext(aiter(request_iterator), None)
    kind = None if first is None else first.WhichOneof("kind")
    if first is None or kind not in ("start", "attach"):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "the first message of RunStep must be its start (or an attach to a step)")
        return
    client = StreamClient()
    try:
        if kind == "attach":
            step = engine.steps.attach(principal, first.attach.job_id, first.attach.step_id, client,
                                       _offsets_had(first.attach))
        else:
            spec = first.start
            request = step_request_from_pb(spec)
            step = engine.steps.start(principal, spec.job_id, request, client,
                                      umask=spec.umask & 0o777 if spec.HasField("umask") else None)
    except (StepRefused, StepNotFound, StepPermissionDenied, InvalidRequest) as exc:
        if not isinstance(exc, StepRefused | StepNotFound):
            log.warning("refused step from %s: %s", principal.user, exc)
        await _abort(context, exc)
        return
    yield pb.StepServerMessage(started=pb.StepStartedInfo(
        job_id=step.job_id, step_id=step.step_id, nodes=list(step.layout.node_names), ntasks=step.layout.ntasks,
        attached=kind == "attach"))
    if step.state != StepState.RUNNING:  # taken up after its end: only the end is left to tell
        yield pb.StepServerMessage(ended=pb.StepEndInfo(exit_code=step.exit_code or 0, state=step.state.value,
                                                        reason=step.reason))
        return

    async def read() -> None:
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, grpc.aio.AbortError):
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "stdin":
                    engine.steps.stdin(step.job_id, step.step_id, data=message.stdin[:MAX_STDIN_CHUNK])
                elif kind == "window":
                    rows, cols = min(message.window.rows, 10000), min(message.window.cols, 10000)
                    engine.steps.stdin(step.job_id, step.step_id, window=(rows, cols))
                elif kind == "signal":
                    if 0 < message.signal < 65:
                        engine.steps.signal(step.job_id, step.step_id, message.signal)
                elif kind == "cancel":
                    with contextlib.suppress(StepNotFound):
                        engine.steps.cancel(principal, step.job_id, step.step_id)
        if not client.done:
            # gsrun sends until the step has ended: its requests ending first means it is gone.
            client.queue.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while True:
            message = await client.queue.get()
            if message is None:
                break
            notice = client.taken(message)
            yield message
            if notice is not None:
                yield notice
    finally:
        reader.cancel()
        if not client.done:
            engine.steps.client_gone(step.job_id, step.step_id, client)


MAX_ATTACH_STREAMS = 2 * 65536  # two streams per task; more than any step has


def _offsets_had(attach: pb.StepAttach) -> dict[tuple[int, int], int] | None:
    """How far gsrun has each stream (every stream it does not name, it has nothing of); None: it cannot say."""
    if attach.have_unknown:
        return None
    if len(attach.have) > MAX_ATTACH_STREAMS:
        raise InvalidRequest(f"an attach names at most {MAX_ATTACH_STREAMS} streams")
    had: dict[tuple[int, int], int] = {}
    for offset in attach.have:
        if offset.stream not in (1, 2):
            raise InvalidRequest(f"stream must be 1 (stdout) or 2 (stderr), not {offset.stream}")
        had[(offset.task, offset.stream)] = offset.offset
    return had


def list_steps(engine: Engine, request: pb.ListStepsRequest) -> pb.ListStepsResponse:
    job_ids: list[int] = []
    for ref in request.job_ids:
        try:
            job_ids.append(parse_job_ref(ref.partition(".")[0])[0])
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
    steps = engine.state.store.query_steps(job_ids, list(request.users), limit=MAX_LISTED_STEPS)
    return pb.ListStepsResponse(steps=[step_to_pb(s) for s in steps])


def cancel_step(engine: Engine, principal: Principal, request: pb.CancelStepRequest) -> pb.CancelStepResponse:
    try:
        job_id, step = parse_step_ref(request.step_id)
        signum = parse_signal_name(request.signal, "--signal") if request.signal else None
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if not step.isdigit():
        raise InvalidRequest(f"{request.step_id}: the batch step ends with its job: gcancel {job_id}")
    engine.steps.cancel(principal, job_id, int(step), signum)
    return pb.CancelStepResponse()
