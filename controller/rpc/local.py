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
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import grpc

from garrison.auth import principal_for
from garrison.model.domain import Principal
from garrison.plainmsg import PLAIN_METHOD_SUFFIX, PlainError, dump_plain, parse_plain
from garrison.protos.v1 import garrison_pb2 as pb

log = logging.getLogger("garrison.controller.local")

MAX_FRAME = 8 << 20
HEADER = struct.Struct("!I")

# method name -> request message type; responses come back as the servicer's return value
REQUEST_TYPES: dict[str, type[Any]] = {
    "Hello": pb.HelloRequest,
    "SubmitJob": pb.SubmitJobRequest,
    "CancelJobs": pb.CancelJobsRequest,
    "ListJobs": pb.ListJobsRequest,
    "GetJob": pb.GetJobRequest,
    "ListNodes": pb.ListNodesRequest,
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


class LocalServer:
    def __init__(self, path: str, servicer: Any, principal_of: Callable[[int, int], Principal] = principal_for) -> None:
        self.path = path
        self.servicer = servicer
        self.principal_of = principal_of
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
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, gid = struct.unpack("3i", creds)
            principal = await asyncio.get_running_loop().run_in_executor(None, self.principal_of, uid, gid)
            while True:
                try:
                    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                except asyncio.IncompleteReadError:
                    return
                if not 1 <= length <= MAX_FRAME:
                    return
                frame = await reader.readexactly(length)
                writer.write(await self._answer(principal, frame))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("local client connection failed")
        finally:
            writer.close()

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
            request = parse_plain(body, request_type) if plain else request_type.FromString(body)
        except PlainError as err:
            return self._frame(_status_byte(grpc.StatusCode.INVALID_ARGUMENT), f"malformed request: {err}".encode())
        except Exception:
            return self._frame(_status_byte(grpc.StatusCode.INVALID_ARGUMENT), b"malformed request")
        try:
            response = await getattr(self.servicer, method)(request, LocalContext(principal))
        except LocalAbort as abort:
            return self._frame(_status_byte(abort.code), abort.details.encode())
        answer = dump_plain(response) if plain else response.SerializeToString()
        return self._frame(_status_byte(grpc.StatusCode.OK), answer)

    @staticmethod
    def _frame(status: int, body: bytes) -> bytes:
        return HEADER.pack(len(body) + 1) + bytes([status]) + body
