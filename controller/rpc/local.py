"""The Controller service on a Unix socket, for clients on the controller host.

Why: a CLI call should cost well under 100 ms, and `import grpc` alone costs 40-200 ms on small machines.
On the controller host the CLI can skip gRPC entirely: it sends the same protobuf request over this socket
and the kernel tells us who it is (SO_PEERCRED), which is a stronger proof than a credential. The RPCs
are the very same servicer methods as over gRPC (ControllerService), with the same validation, errors and
status codes; only the framing differs:

    request  = u32 length | u8 method-name length | method name | serialized request message
    response = u32 length | u8 status code (grpc.StatusCode value) | serialized response, or UTF-8 message

A method name ending in ``+json`` (``SubmitJob+json``) carries the request and the response as plain JSON
(garrison/plainmsg.py) instead of serialized protobuf: gsub and gqueue use it, so that they need not import
protobuf. The request is parsed into its message type just as strictly (unknown fields and wrong types are
INVALID_ARGUMENT) before the servicer sees it.

Several requests may share one connection. Clients elsewhere use gRPC (with tokens, issue 7).

Any local user can connect, so what one connection may cost is bounded (issue 20; ``LocalLimits``): a uid
holds at most so many connections at once, the frames being received (a frame's length is reserved when its
header arrives) take at most so many bytes per uid and in all, and a frame must arrive whole within a
time limit. A request past a limit gets RESOURCE_EXHAUSTED with one line saying which, and its connection
is closed. Before, 40 unfinished 8 MiB frames grew the controller from 78 to 408 MB.

One streaming RPC, ``RunStep`` (gsrun), turns its connection into a stream for the rest of its life: the
first frame names the method and carries the first StepClientMessage, every later frame from the client is
``u32 length | serialized StepClientMessage``, and each answer is a response frame as above with status OK
and a StepServerMessage; the stream's end is a frame with status ``STREAM_END`` (empty), or an error's
status and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from garrison.auth import principal_for
from garrison.model.domain import Principal
from garrison.plainmsg import PLAIN_METHOD_SUFFIX, PlainError, dump_plain, parse_plain
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import garrison_pb2 as pb

log = logging.getLogger("garrison.controller.local")

MAX_FRAME = 8 << 20
HEADER = struct.Struct("!I")
# Frames at least this large are parsed on a thread: a 100,000-task array's request is 600 KB of JSON,
# a third of a second to parse.
PARSE_OFF_LOOP_BYTES = 64 << 10


@dataclass(frozen=True)
class LocalLimits:
    """What the local socket's clients may hold of the controller (config: ``local_*``, docs/security.md)."""

    connections_per_uid: int = 16
    buffer_per_uid: int = 16 << 20  # bytes of frames being received, per uid
    buffer_total: int = 64 << 20  # and in all
    frame_timeout_s: float = 30.0  # from a frame's header to its last byte


class LimitRefused(Exception):
    """A connection or a frame past one of LocalLimits: answered RESOURCE_EXHAUSTED, then closed."""


STREAM_METHOD = "RunStep"
STREAM_END = 255  # the status byte of a stream's last frame

# method name -> request message type; responses come back as the servicer's return value
REQUEST_TYPES: dict[str, type[Any]] = {
    "Hello": pb.HelloRequest,
    "SubmitJob": pb.SubmitJobRequest,
    "SubmitCommandLine": pb.SubmitCommandLineRequest,
    "CancelJobs": pb.CancelJobsRequest,
    "ListJobs": pb.ListJobsRequest,
    "GetJob": pb.GetJobRequest,
    "ListNodes": pb.ListNodesRequest,
    "KeepAllocation": pb.KeepAllocationRequest,
    "ReleaseAllocation": pb.ReleaseAllocationRequest,
    "ListSteps": pb.ListStepsRequest,
    "CancelStep": pb.CancelStepRequest,
    # Of the Admin service, the one gjob asks of a pending job (its explanation), which any user may ask
    "QueueDetails": adminpb.QueueDetailsRequest,
    # Of the Accounting service, sacct's: scripts poll it (submitit), and over gRPC its import alone cost more
    # than the rest of the call
    "ListJobRecords": apb.JobRecordsRequest,
}


class LocalAbort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LocalContext:
    """What a servicer method needs of its context, for a request from the local socket."""

    def __init__(self, principal: Principal) -> None:
        self.peer_principal = principal

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "unix:local"

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise LocalAbort(code, details)


def _status_byte(code: grpc.StatusCode) -> int:
    return int(code.value[0])


def _parse(body: bytes, request_type: type[Any], plain: bool) -> Any:
    return parse_plain(body, request_type) if plain else request_type.FromString(body)


class ConnectionBudget:
    """The connections and the bytes of unfinished frames each uid holds, against LocalLimits."""

    def __init__(self, limits: LocalLimits) -> None:
        self.limits = limits
        self.connections: Counter[int] = Counter()
        self.buffered: Counter[int] = Counter()
        self.buffered_total = 0

    def connect(self, uid: int) -> None:
        if self.connections[uid] >= self.limits.connections_per_uid:
            raise LimitRefused(f"too many connections from uid {uid} to the local socket: at most "
                               f"{self.limits.connections_per_uid} at once (local_max_connections_per_user)")
        self.connections[uid] += 1

    def disconnect(self, uid: int) -> None:
        self.connections[uid] -= 1
        if self.connections[uid] <= 0:
            del self.connections[uid]

    def reserve(self, uid: int, length: int) -> None:
        if self.buffered[uid] + length > self.limits.buffer_per_uid:
            raise LimitRefused(f"uid {uid} is sending too much at once on the local socket: at most "
                               f"{self.limits.buffer_per_uid >> 20} MiB of requests in flight "
                               "(local_max_buffer_per_user_mb)")
        if self.buffered_total + length > self.limits.buffer_total:
            raise LimitRefused("the local socket is receiving too much at once: at most "
                               f"{self.limits.buffer_total >> 20} MiB of requests in flight, retry shortly "
                               "(local_max_buffer_total_mb)")
        self.buffered[uid] += length
        self.buffered_total += length

    def release(self, uid: int, length: int) -> None:
        self.buffered[uid] -= length
        self.buffered_total -= length
        if self.buffered[uid] <= 0:
            del self.buffered[uid]


class LocalServer:
    def __init__(
        self,
        path: str,
        servicer: Any,
        principal_of: Callable[[int, int], Principal] = principal_for,
        limits: LocalLimits | None = None,
        refused: Callable[[int, str], None] | None = None,
        admin_servicer: Any = None,
        accounting_servicer: Any = None,
    ) -> None:
        self.path = path
        self.servicer = servicer
        # The servicers of the other services' methods in REQUEST_TYPES, by the file that declares the request
        self.servicers = {adminpb.DESCRIPTOR: admin_servicer, apb.DESCRIPTOR: accounting_servicer}
        self.principal_of = principal_of
        self.budget = ConnectionBudget(limits or LocalLimits())
        # Told (uid, why) of each refusal past a limit; the controller logs them, rate-limited.
        self.refused = refused
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o666)  # any local user may ask; who they are comes from the kernel

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock: socket.socket = writer.get_extra_info("socket")
        uid: int | None = None
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, peer_uid, gid = struct.unpack("3i", creds)
            self.budget.connect(peer_uid)
            uid = peer_uid
            principal = await asyncio.get_running_loop().run_in_executor(None, self.principal_of, uid, gid)
            while True:
                try:
                    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                except asyncio.IncompleteReadError:
                    return
                if not 1 <= length <= MAX_FRAME:
                    return
                self.budget.reserve(uid, length)
                try:
                    frame = await asyncio.wait_for(reader.readexactly(length), self.budget.limits.frame_timeout_s)
                    if frame[1 : 1 + frame[0]] == STREAM_METHOD.encode():
                        self.budget.release(uid, length)
                        length = 0
                        await self._stream(principal, uid, frame[1 + frame[0] :], reader, writer)
                        return
                    answer = await self._answer(principal, frame)
                    del frame
                finally:
                    if length:
                        self.budget.release(uid, length)
                writer.write(answer)
                await writer.drain()
        except LimitRefused as refusal:
            self._refuse(writer, peer_uid, str(refusal))
        except TimeoutError:
            self._refuse(writer, peer_uid, f"a request did not arrive whole within {self.budget.limits.frame_timeout_s:g}s "
                                           "(local_frame_timeout_s)")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The controller is stopping with this connection open (a gsrun's step stream): its client takes
            # the step up again from the next controller. Not re-raised: Python 3.11's stream callback logs a
            # cancelled handler as an ERROR with a traceback.
            pass
        except Exception:
            log.exception("local client connection failed")
        finally:
            if uid is not None:
                self.budget.disconnect(uid)
            writer.close()

    def _refuse(self, writer: asyncio.StreamWriter, uid: int, why: str) -> None:
        if self.refused is not None:
            self.refused(uid, why)
        try:
            writer.write(self._frame(_status_byte(grpc.StatusCode.RESOURCE_EXHAUSTED), why.encode()))
        except (ConnectionError, RuntimeError):
            pass

    async def _answer(self, principal: Principal, frame: bytes) -> bytes:
        name_length = frame[0]
        method = frame[1 : 1 + name_length].decode(errors="replace")
        plain = method.endswith(PLAIN_METHOD_SUFFIX)
        if plain:
            method = method[: -len(PLAIN_METHOD_SUFFIX)]
        request_type = REQUEST_TYPES.get(method)
        if request_type is None:
            return self._frame(_status_byte(grpc.StatusCode.UNIMPLEMENTED), f"unknown method {method!r}".encode())
        body = frame[1 + name_length :]
        try:
            if len(body) >= PARSE_OFF_LOOP_BYTES:
                request = await asyncio.get_running_loop().run_in_executor(None, _parse, body, request_type, plain)
            else:
                request = _parse(body, request_type, plain)
        except PlainError as err:
            return self._frame(_status_byte(grpc.StatusCode.INVALID_ARGUMENT), f"malformed request: {err}".encode())
        except Exception:
            return self._frame(_status_byte(grpc.StatusCode.INVALID_ARGUMENT), b"malformed request")
        try:
            servicer = self.servicers.get(request_type.DESCRIPTOR.file, self.servicer)
            if servicer is None:
                return self._frame(_status_byte(grpc.StatusCode.UNIMPLEMENTED), f"no {method} here".encode())
            response = await getattr(servicer, method)(request, LocalContext(principal))
        except LocalAbort as abort:
            return self._frame(_status_byte(abort.code), abort.details.encode())
        answer = dump_plain(response) if plain else response.SerializeToString()
        return self._frame(_status_byte(grpc.StatusCode.OK), answer)

    async def _stream(self, principal: Principal, uid: int, first: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """RunStep on this connection: client frames in as messages, the servicer's answers out as frames."""

        async def requests() -> Any:
            yield pb.StepClientMessage.FromString(first)
            while True:
                try:
                    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                    if not 1 <= length <= MAX_FRAME:
                        return
                    # Each frame's length is reserved as any request's is, and its body must arrive within the
                    # frame timeout; the wait for the next header is not timed (gsrun idles between inputs).
                    self.budget.reserve(uid, length)
                    try:
                        body = await asyncio.wait_for(reader.readexactly(length), self.budget.limits.frame_timeout_s)
                    finally:
                        self.budget.release(uid, length)
                except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, LimitRefused):
                    return  # the client went away: the servicer treats the end of its requests so
                try:
                    message = pb.StepClientMessage.FromString(body)
                except DecodeError:
                    return
                yield message

        try:
            answers = getattr(self.servicer, STREAM_METHOD)(requests(), LocalContext(principal))
            async with contextlib.aclosing(answers):
                async for answer in answers:
                    writer.write(self._frame(_status_byte(grpc.StatusCode.OK), answer.SerializeToString()))
                    await writer.drain()
            writer.write(self._frame(STREAM_END, b""))
        except LocalAbort as abort:
            writer.write(self._frame(_status_byte(abort.code), abort.details.encode()))
        except DecodeError:
            writer.write(self._frame(_status_byte(grpc.StatusCode.INVALID_ARGUMENT), b"malformed stream message"))
        await writer.drain()

    @staticmethod
    def _frame(status: int, body: bytes) -> bytes:
        return HEADER.pack(len(body) + 1) + bytes([status]) + body
