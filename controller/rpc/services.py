"""Thin gRPC servicers: authenticate, convert, call the engine, map domain errors to status codes."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from garrison.auth import AuthError, verify_credential
from garrison.controller.domain import Principal
from garrison.controller.engine import AgentSession, Engine, NotFound, PermissionDenied
from garrison.controller.rpc import convert
from garrison.controller.validate import ValidationError
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

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
}

R = TypeVar("R")


def _status_for(exc: Exception) -> grpc.StatusCode | None:
    for kind, code in ERROR_CODES.items():
        if isinstance(exc, kind):
            return code
    return None


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
            if code == grpc.StatusCode.PERMISSION_DENIED:
                log.warning("refused %s: %s", handler.__name__, exc)
            await context.abort(code, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise

    return wrapper


class Authenticator:
    def __init__(self, key: bytes, clock: Callable[[], float]) -> None:
        self.key = key
        self.clock = clock

    def principal(self, context: grpc.aio.ServicerContext) -> Principal:
        # The local socket (controller/rpc/local.py) proves identity with the kernel's peer credentials.
        proven: Principal | None = getattr(context, "peer_principal", None)
        if proven is not None:
            return proven
        for item in context.invocation_metadata() or ():
            if item.key == CREDENTIAL_METADATA:
                value = item.value
                token = value.decode() if isinstance(value, bytes) else value
                return verify_credential(self.key, token, self.clock())
        raise AuthError("no credential: every request must carry one (see the local credential service)")


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, engine: Engine, auth: Authenticator, credential_socket: str, local_socket: str = "") -> None:
        self.engine = engine
        self.auth = auth
        self.credential_socket = credential_socket
        self.local_socket = local_socket

    async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloResponse:
        return pb.HelloResponse(
            version=VERSION, credential_socket=self.credential_socket, local_socket=self.local_socket
        )

    @mapped_errors
    async def SubmitJob(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.SubmitJobResponse:
        principal = self.auth.principal(context)
        job_id, count = self.engine.submit(principal, request)
        return pb.SubmitJobResponse(job_id=job_id, task_count=count)

    @mapped_errors
    async def CancelJobs(self, request: pb.CancelJobsRequest, context: grpc.aio.ServicerContext) -> pb.CancelJobsResponse:
        principal = self.auth.principal(context)
        return pb.CancelJobsResponse(cancelled=self.engine.cancel(principal, request))

    @mapped_errors
    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        self.auth.principal(context)
        now = self.engine.clock.now()
        return pb.ListJobsResponse(jobs=[convert.job_to_pb(j, now) for j in self.engine.list_jobs(request)])

    @mapped_errors
    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.JobInfo:
        self.auth.principal(context)
        job = self.engine.get_job(request.job_id)
        return convert.job_to_pb(job, self.engine.clock.now(), with_spec=True)

    @mapped_errors
    async def ListNodes(self, request: pb.ListNodesRequest, context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        self.auth.principal(context)
        return pb.ListNodesResponse(nodes=self.engine.nodes_view())


class AgentLinkService(pb_grpc.AgentLinkServicer):
    def __init__(self, engine: Engine, auth: Authenticator, agent_uids: set[int]) -> None:
        self.engine = engine
        self.auth = auth
        self.agent_uids = agent_uids

    async def Connect(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        try:
            principal = self.auth.principal(context)
        except AuthError as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
            return
        if principal.uid not in self.agent_uids:
            log.warning("refused agent connection from uid %d", principal.uid)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"uid {principal.uid} may not act as an agent")
            return
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "register" or not first.register.node_name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Register with a node name")
            return
        register = first.register
        peer_host = _peer_host(context.peer())
        session = AgentSession(node=register.node_name, address=register.address or peer_host)
        self.engine.agent_connected(session, register)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    self.engine.agent_message(session, message)
            except (asyncio.CancelledError, grpc.aio.AioRpcError):
                pass
            except Exception:
                log.exception("agent stream from %s failed", session.node)
            finally:
                session.close()

        reader = asyncio.create_task(read())
        try:
            while True:
                message = await session.queue.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            self.engine.agent_disconnected(session)


def _peer_host(peer: str) -> str:
    # "ipv4:127.0.0.1:5555" / "ipv6:[::1]:5555"
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or "127.0.0.1"
