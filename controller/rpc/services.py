"""Thin gRPC servicers: authenticate, convert (controller/rpc/convert_requests.py), call the engine, map
domain errors to status codes. An agent's session lives here too: it turns what the engine tells the agent
into messages on its stream."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from garrison.auth import AuthError, verify_credential
from garrison.controller.commands import AgentInstruction
from garrison.controller.engine import Engine, NotFound, PermissionDenied
from garrison.controller.limits import (
    MAX_JOB_REF_CHARS,
    MAX_STATE_CHARS,
    check_filters,
    check_list,
    validate_registration,
)
from garrison.controller.ratelimit import AuthFailureLimiter, RateLimited, RateLimiter, RefusalLog, peer_host
from garrison.controller.rpc import steps_service
from garrison.controller.rpc.commandline import parse_command_line, submitted_response
from garrison.controller.rpc.convert_allocations import allocation_status_to_pb, release_result_to_pb
from garrison.controller.rpc.convert_requests import (
    agent_event_from_pb,
    cancel_command_from_pb,
    cancel_result_to_pb,
    instruction_to_pb,
    job_filter_from_pb,
    node_row_to_pb,
    partition_row_to_pb,
    registration_from_pb,
    submit_command_from_pb,
    submit_estimate_to_pb,
    submitted_to_pb,
)
from garrison.controller.rpc.same_host import is_same_host_peer
from garrison.controller.steps import StepNotFound, StepPermissionDenied
from garrison.controller.store.errors import StoreUnavailable
from garrison.controller.submitcaps import SubmitLimitExceeded
from garrison.controller.validate import ValidationError
from garrison.model.arrayfold import fold, folded_id
from garrison.model.domain import Job, JobState, Principal
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.tls import (
    CertificateInfo,
    TlsError,
    agent_certificate,
    certificate_names_node,
    read_revoked,
)
from garrison.tokens import TOKEN_METADATA_KEY, TokenRegistry
from garrison.wire import convert
from garrison.wire.batching import take_batch

log = logging.getLogger("garrison.controller.rpc")

CREDENTIAL_METADATA = "x-garrison-credential"
VERSION = "0.1.0"

# Domain errors -> gRPC status codes, in one place.
ERROR_CODES: dict[type[Exception], grpc.StatusCode] = {
    ValidationError: grpc.StatusCode.INVALID_ARGUMENT,
    convert.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AuthError: grpc.StatusCode.UNAUTHENTICATED,
    RateLimited: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # The database is down, full or read-only: nothing changed, and the client may retry. Its message is
    # always StoreUnavailable.MESSAGE, never the driver's (which the controller logs).
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    SubmitLimitExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StepNotFound: grpc.StatusCode.NOT_FOUND,
    StepPermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}
# Refusals of who is asking or of what they may do: each is logged with its reason (docs/security.md).
LOGGED_REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

R = TypeVar("R")


def _status_for(exc: Exception) -> grpc.StatusCode | None:
    for kind, code in ERROR_CODES.items():
        if isinstance(exc, kind):
            return code
    return None


def _one_line(exc: Exception, limit: int = 500) -> str:
    """An error's message as the client sees it: its first line, cut short if a request value made it long."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _log_refusal(servicer: Any, context: grpc.aio.ServicerContext, method: str, code: grpc.StatusCode,
                 why: str) -> None:
    """A refusal's log line, through the servicer's RefusalLog (rate-limited per client and kind)."""
    peer = context.peer()
    principal: Principal | None = getattr(context, "peer_principal", None)
    who = f"uid {principal.uid}" if principal is not None else peer_host(peer or "")
    line = f"refused {method} from {peer} ({code.name}): {why}"
    auth = getattr(servicer, "auth", None)
    refusals: RefusalLog | None = getattr(auth, "refusals", None)
    if refusals is None:
        log.warning("%s", line)
    else:
        refusals.refused((code.name, "from", who), line)


def pending_array_group(job: Job) -> tuple[int, str, str] | None:
    """The row a job shares in a folded listing (garrison/model/arrayfold.py): a pending array task's array,
    reason and partition; None for anything else."""
    if job.state is not JobState.PENDING or job.array_job_id is None or job.array_task_id is None:
        return None
    return (job.array_job_id, job.reason, job.partition)


def folded_job_to_pb(row: Job | Sequence[Job], now: float) -> pb.JobInfo:
    """One row of a folded listing: a job, or the pending tasks of one array as their first task's JobInfo."""
    if isinstance(row, Job):
        return convert.job_to_pb(row, now)
    info = convert.job_to_pb(row[0], now)
    assert row[0].array_job_id is not None
    info.display_id = folded_id(row[0].array_job_id, [task.array_task_id or 0 for task in row],
                                row[0].spec.array_max_running)
    info.folded_tasks = len(row)
    return info


def mapped_errors(handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            code = _status_for(exc)
            if code is None:
                if isinstance(exc, asyncio.CancelledError | grpc.aio.AbortError):
                    raise
                log.exception("internal error in %s", handler.__name__)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
                raise
            if isinstance(exc, StoreUnavailable):
                log.warning("%s refused, the database is unavailable: %s", handler.__name__, exc.cause)
            elif code in LOGGED_REFUSALS and not getattr(exc, "quiet", False):
                _log_refusal(self, context, handler.__name__, code, _one_line(exc))
            await context.abort(code, _one_line(exc))
            raise

    return wrapper


@dataclass(eq=False)
class AgentSession:
    """One agent's stream, as the engine's AgentLink: what the engine sends becomes the next message."""

    node: str
    address: str
    queue: asyncio.Queue[pb.ControllerMessage | None] = field(default_factory=asyncio.Queue)
    refusal: str = ""  # why the agent's stream was cut (an undecodable message), told to it at the end

    def send(self, instruction: AgentInstruction) -> None:
        self.queue.put_nowait(instruction_to_pb(instruction))

    def close(self) -> None:
        self.queue.put_nowait(None)


class MalformedStreamMessage(Exception):
    """A message on a stream did not decode (controller/rpc/security.py); the servicer ends the call with
    INVALID_ARGUMENT itself, because aborting from the reading task races with its sending half."""


class Authenticator:
    """Who is asking: the local socket's kernel-proven identity, a local credential, or a token.

    A user name in a request body is never trusted. ``principal`` also applies the per-user rate limit;
    agents authenticate in AgentLinkService (mutual TLS, or a credential from an ``agent_uids`` uid).
    """

    def __init__(
        self,
        key: bytes,
        clock: Callable[[], float],
        tokens: TokenRegistry | None = None,
        limiter: RateLimiter | None = None,
        failures: AuthFailureLimiter | None = None,
        refusals: RefusalLog | None = None,
    ) -> None:
        self.key = key
        self.clock = clock
        self.tokens = tokens
        self.limiter = limiter
        self.failures = failures
        # Where refusals are logged, rate-limited (mapped_errors); the default logs at most 20 a kind per 10 s.
        self.refusals = refusals if refusals is not None else RefusalLog(lambda line: log.warning("%s", line))

    def identify(self, context: grpc.aio.ServicerContext) -> tuple[Principal, str]:
        """(principal, how it was proven), or AuthError saying why the caller is not believed."""
        # The local socket (controller/rpc/local.py) proves identity with the kernel's peer credentials.
        proven: Principal | None = getattr(context, "peer_principal", None)
        if proven is not None:
            return proven, "local socket"
        if self.failures is None:
            return self._verify(context)
        host = peer_host(context.peer() or "")
        self.failures.admit(host)
        try:
            return self._verify(context)
        except AuthError:
            self.failures.failed(host)
            raise

    def _verify(self, context: grpc.aio.ServicerContext) -> tuple[Principal, str]:
        credential = token = None
        for item in context.invocation_metadata() or ():
            if item.key in (CREDENTIAL_METADATA, TOKEN_METADATA_KEY):
                value = item.value
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
                if item.key == CREDENTIAL_METADATA:
                    credential = text
                else:
                    token = text
        if credential is not None:
            return verify_credential(self.key, credential, self.clock()), "credential"
        if token is not None:
            if self.tokens is None:
                raise AuthError("this controller does not accept tokens")
            return self.tokens.verify(token), "token"
        raise AuthError(
            "no credential or token: every request must carry one (the local credential service on the "
            "controller host, or a token from an admin elsewhere; see docs/security.md)"
        )

    def check_rate(self, principal: Principal) -> None:
        if self.limiter is not None:
            self.limiter.check(principal)

    def principal(self, context: grpc.aio.ServicerContext) -> Principal:
        principal, _ = self.identify(context)
        self.check_rate(principal)
        return principal


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, engine: Engine, auth: Authenticator, credential_socket: str, local_socket: str = "") -> None:
        self.engine = engine
        self.auth = auth
        self.credential_socket = credential_socket
        self.local_socket = local_socket

    async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloResponse:
        # Unauthenticated: the socket paths only to callers on this host, the only ones who can use them.
        if not is_same_host_peer(context.peer()):
            return pb.HelloResponse(version=VERSION)
        return pb.HelloResponse(
            version=VERSION, credential_socket=self.credential_socket, local_socket=self.local_socket
        )

    @mapped_errors
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.SubmitJobResponse:
        return await self._submit(self.auth.principal(context), request)

    async def _submit(self, principal: Principal, request: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
        command = submit_command_from_pb(request)
        if request.test_only:
            return submit_estimate_to_pb(await self.engine.test_submit(principal, command))
        return submitted_to_pb(await self.engine.submit_async(principal, command))

    @mapped_errors
    async def SubmitCommandLine(
        self, request: pb.SubmitCommandLineRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitCommandLineResponse:
        principal = self.auth.principal(context)
        parsed = parse_command_line(request)
        if isinstance(parsed, pb.SubmitCommandLineResponse):
            return parsed
        return submitted_response(parsed.submission, await self._submit(principal, parsed.request))

    @mapped_errors
    async def CancelJobs(self, request: pb.CancelJobsRequest, context: grpc.aio.ServicerContext) -> pb.CancelJobsResponse:
        principal = self.auth.principal(context)
        check_list(request.job_ids, "job ids", MAX_JOB_REF_CHARS)
        check_list(request.states, "states", MAX_STATE_CHARS)
        check_list([request.user], "users")
        check_list([request.signal], "signal", MAX_STATE_CHARS)
        check_filters(request)
        return cancel_result_to_pb(await self.engine.cancel_async(principal, cancel_command_from_pb(request)))

    @mapped_errors
    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        self.auth.principal(context)
        check_list(request.job_ids, "job ids", MAX_JOB_REF_CHARS)
        check_list(request.states, "states", MAX_STATE_CHARS)
        check_list(request.users, "users")
        check_filters(request)
        jobs = self.engine.list_jobs(job_filter_from_pb(request))
        now = self.engine.clock.now()
        if not request.fold_pending_arrays:
            return pb.ListJobsResponse(jobs=[convert.job_to_pb(j, now) for j in jobs])
        return pb.ListJobsResponse(jobs=[folded_job_to_pb(row, now) for row in fold(jobs, pending_array_group)])

    @mapped_errors
    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.JobInfo:
        principal = self.auth.principal(context)
        check_list([request.job_id], "job ids", MAX_JOB_REF_CHARS)
        job = self.engine.with_running_usage(self.engine.job_for_viewer(principal, request.job_id))
        return convert.job_to_pb(job, self.engine.clock.now(), with_spec=True)

    @mapped_errors
    async def ListNodes(self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        self.auth.principal(context)
        return pb.ListNodesResponse(
            nodes=[node_row_to_pb(row) for row in self.engine.nodes_view()],
            partitions=[partition_row_to_pb(row) for row in self.engine.partitions_view()],
        )

    @mapped_errors
    async def KeepAllocation(
        self, request: pb.KeepAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocationStatusReply:
        principal = self.auth.principal(context)
        status = self.engine.allocations.keep(principal, request.job_id)
        return allocation_status_to_pb(status, self.engine.clock.now())

    @mapped_errors
    async def ReleaseAllocation(
        self, request: pb.ReleaseAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseAllocationReply:
        principal = self.auth.principal(context)
        return release_result_to_pb(self.engine.allocations.release(principal, request.job_id, request.exit_code))

    # Job steps (gsrun): controller/rpc/steps_service.py

    async def RunStep(
        self, request_iterator: AsyncIterator[pb.StepClientMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StepServerMessage]:
        try:
            principal = self.auth.principal(context)
        except (AuthError, RateLimited) as exc:
            code = grpc.StatusCode.UNAUTHENTICATED if isinstance(exc, AuthError) else grpc.StatusCode.RESOURCE_EXHAUSTED
            await context.abort(code, _one_line(exc))
            return
        async for message in steps_service.run_step(self.engine, principal, request_iterator, context):
            yield message

    @mapped_errors
    async def ListSteps(self, request: pb.ListStepsRequest, context: grpc.aio.ServicerContext) -> pb.ListStepsResponse:
        self.auth.principal(context)
        check_list(request.job_ids, "job ids", MAX_JOB_REF_CHARS)
        check_list(request.users, "users")
        return steps_service.list_steps(self.engine, request)

    @mapped_errors
    async def CancelStep(self, request: pb.CancelStepRequest, context: grpc.aio.ServicerContext) -> pb.CancelStepResponse:
        principal = self.auth.principal(context)
        check_list([request.step_id], "step ids", MAX_JOB_REF_CHARS)
        check_list([request.signal], "signal", MAX_STATE_CHARS)
        return steps_service.cancel_step(self.engine, principal, request)


class AgentLinkService(pb_grpc.AgentLinkServicer):
    def __init__(
        self, engine: Engine, auth: Authenticator, agent_uids: set[int], *, require_certificate: bool = False,
        revoked_file: str = "",
    ) -> None:
        self.engine = engine
        self.auth = auth
        self.agent_uids = agent_uids
        # With TLS an agent proves which node it is with its certificate (mutual TLS on agent_address);
        # without (loopback only) it proves its uid with a local credential.
        self.require_certificate = require_certificate
        # Serials of agent certificates revoked by an admin (gadmin cert revoke), read at every connection so
        # a revocation needs no restart.
        self.revoked_file = revoked_file

    def _check_not_revoked(self, certificate: CertificateInfo) -> None:
        if self.revoked_file and certificate.serial in read_revoked(self.revoked_file):
            raise TlsError(
                f"the certificate of node {certificate.common_name!r} (serial {certificate.serial:x}) was revoked"
            )

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str) -> None:
        log.warning("refused agent connection from %s (%s): %s", context.peer(), code.name, reason)
        await context.abort(code, reason)

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        certificate: CertificateInfo | None = None
        if self.require_certificate:
            try:
                certificate = agent_certificate(context.auth_context())  # parsed once per connection
                self._check_not_revoked(certificate)
            except TlsError as exc:
                await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, str(exc))
                return
        else:
            try:
                principal, _ = self.auth.identify(context)
            except AuthError as exc:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))
                return
            except RateLimited as exc:  # this host failed authentication too often: not even checked
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
                return
            if principal.uid not in self.agent_uids:
                await self._refuse(
                    context, grpc.StatusCode.PERMISSION_DENIED, f"uid {principal.uid} may not act as an agent"
                )
                return
        try:
            first = await anext(aiter(request_iterator), None)
        except MalformedStreamMessage as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        if first is None or first.WhichOneof("kind") != "register" or not first.register.node_name:
            await self._refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Register with a node name"
            )
            return
        register = first.register
        address = register.address or peer_host(context.peer() or "") or "127.0.0.1"
        registration = registration_from_pb(register, address)
        try:
            validate_registration(registration.node, registration.inventory, register.address)
        except ValidationError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        if certificate is not None and not certificate_names_node(certificate, register.node_name):
            await self._refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of node {certificate.common_name!r} may not register as {register.node_name!r}",
            )
            return
        session = AgentSession(node=registration.node, address=registration.address)
        try:
            self.engine.agent_connected(session, registration)
        except StoreUnavailable as exc:  # not expected (registering needs no write), but never a raw message
            log.warning("registration of %s refused, the database is unavailable: %s", registration.node, exc.cause)
            await context.abort(grpc.StatusCode.UNAVAILABLE, StoreUnavailable.MESSAGE)
            return

        async def read() -> None:
            try:
                async for message in request_iterator:
                    # Grouped: this turn's reports of every agent are written in one transaction.
                    if message.WhichOneof("kind") == "batch":
                        # In their order, as if each had come alone (a batch inside one is only "alive").
                        for each in message.batch.messages:
                            self.engine.agent_message(session, agent_event_from_pb(each), grouped=True)
                    else:
                        self.engine.agent_message(session, agent_event_from_pb(message), grouped=True)
            except (asyncio.CancelledError, grpc.aio.AioRpcError, grpc.aio.AbortError):
                pass
            except MalformedStreamMessage as exc:
                session.refusal = str(exc)
            except Exception:
                log.exception("agent stream from %s failed", session.node)
            finally:
                session.close()

        reader = asyncio.create_task(read())
        # An agent that reads batches (garrison/wire/batching.py) gets what the engine told it by the time this
        # generator runs again (a cycle's launches, a group's acknowledgements) as one write; an older one,
        # every message on its own.
        batches = register.accepts_batches
        try:
            held: pb.ControllerMessage | None = None
            closed = False
            while not closed:
                going = held if held is not None else await session.queue.get()
                held = None
                if going is None:
                    break
                if not batches:
                    yield going
                    continue
                messages, held, closed = take_batch(going, session.queue)
                yield messages[0] if len(messages) == 1 else pb.ControllerMessage(
                    batch=pb.ControllerMessages(messages=messages))
        finally:
            reader.cancel()
            self.engine.agent_disconnected(session)
        if session.refusal:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, session.refusal)


