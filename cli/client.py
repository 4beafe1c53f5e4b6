"""The CLI's connection to the controller: address, identity, deadlines, and errors -> messages + exit codes.

Kept lean on purpose, because every gsub/gqueue call pays for it. On the controller host the CLI speaks the
Controller RPCs over the controller's local Unix socket (controller/rpc/local.py: same servicer, identity
from the kernel) and never imports grpc. Elsewhere, or when the socket is unusable, it uses gRPC with a
credential. The local socket and credential service paths are learnt once from Hello and cached per
controller address, so a warm call is one round trip.
"""

from __future__ import annotations

import _socket  # not socket: it imports enum and selectors, ~25 M instructions of a call (callgrind)
import os
import struct
import sys
import time

from garrison.cli.fastpath import (
    CACHE_FORMAT,
    _dumps,
    _loads,
    cached_endpoints,
    config_identity,
    config_path,
    controller_address,
    endpoint_cache_file,
    patiently,
    rate_limit_wait,
    remember_config_address,
    write_cache,
)
from garrison.plainmsg import PLAIN_METHOD_SUFFIX, PlainMessage

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms, on every CLI call
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn, TypeVar

    T = TypeVar("T")

CREDENTIAL_METADATA = "x-garrison-credential"
DEFAULT_DEADLINE_S = 30.0
EXIT_USAGE = 2
EXIT_FAILURE = 1
HEADER = struct.Struct("!I")

# grpc.StatusCode values, so the local path can map errors without importing grpc.
OK, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNAVAILABLE, UNAUTHENTICATED = 0, 3, 5, 7, 14, 16
DEADLINE_EXCEEDED, UNIMPLEMENTED = 4, 12
STATUS_NAMES = {1: "cancelled", 2: "unknown", 8: "resource exhausted", 9: "failed precondition", 12: "unimplemented",
                13: "internal"}

RESPONSE_TYPES = {
    "Hello": "HelloResponse",
    "SubmitJob": "SubmitJobResponse",
    "CancelJobs": "CancelJobsResponse",
    "ListJobs": "ListJobsResponse",
    "GetJob": "JobInfo",
    "ListNodes": "ListNodesResponse",
    "KeepAllocation": "AllocationStatusReply",
    "ReleaseAllocation": "ReleaseAllocationReply",
    "ListSteps": "ListStepsResponse",
    "CancelStep": "CancelStepResponse",
}


class CliError(Exception):
    """A one-line message for the user and the exit status to leave with."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE, retryable: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.retryable = retryable  # the controller is unreachable or slow: asking again later may work


def as_refusal(error: CliError, exit_code: int, words: str = "") -> CliError:
    """A refusal of the request itself (the controller's INVALID_ARGUMENT, EXIT_USAGE here) with the command's own
    exit status and, before the reason, its own words (srun's "Unable to allocate resources: "); any other
    error as it is."""
    if error.exit_code != EXIT_USAGE:
        return error
    return CliError(f"{words}{error}", exit_code)


class _LocalUnusable(Exception):
    """The local socket is missing, refused or closed on us: use gRPC instead."""


def fail(prog: str, error: CliError) -> NoReturn:
    print(f"{prog}: error: {error}", file=sys.stderr)
    sys.exit(error.exit_code)


def run_command(command: Callable[[list[str]], None], argv: list[str] | None) -> None:
    """Run a non-click command (gsub, gqueue) on ``argv`` (default: the process's arguments). If the reader
    of its output goes away (``gqueue | head``), exit 1 without a traceback, as click does for the other
    commands; later writes, and the flush at exit, go to /dev/null (Python's recipe)."""
    try:
        command(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could no longer be handled
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)


# call_plain's methods of services other than Controller, which the controller's local socket also serves
# (controller/rpc/local.py's REQUEST_TYPES): method -> its messages' module, its request's type, its stubs'
# module and its stub, for the gRPC path.
OTHER_SERVICES = {
    "QueueDetails": ("admin_pb2", "QueueDetailsRequest", "admin_pb2_grpc", "AdminStub"),
    "ListJobRecords": ("accounting_pb2", "JobRecordsRequest", "accounting_pb2_grpc", "AccountingStub"),
}


def _plain_json(request: dict[str, Any]) -> str:
    """``request`` as compact JSON, without importing json (it imports re: ~24 M instructions of a call,
    callgrind) where the fast path's writer takes it, as it takes every request of the plain forms but floats."""
    try:
        return _dumps(request)
    except TypeError:
        import json

        return json.dumps(request, separators=(",", ":"))


def _token_requested() -> bool:
    return bool(os.environ.get("GARRISON_TOKEN") or os.environ.get("GARRISON_TOKEN_FILE"))


# The controller's answer when its database cannot take the change (its StoreUnavailable.MESSAGE; the two are
# checked to agree): the controller was reached, nothing was changed, and the same command may be retried.
DATABASE_UNAVAILABLE = "the database is unavailable, retry"


def _error_for(code: int, details: str, address: str) -> CliError:
    details = details.splitlines()[0] if details else ""
    if code == UNAVAILABLE and details == DATABASE_UNAVAILABLE:
        return CliError(f"the controller at {address} changed nothing: {details}", retryable=True)
    if code == UNAVAILABLE:
        return CliError(f"cannot reach the controller at {address}: {details or 'unavailable'}", retryable=True)
    if code == DEADLINE_EXCEEDED:
        return CliError(f"the controller at {address} did not answer in time", retryable=True)
    if code == INVALID_ARGUMENT:
        return CliError(details, EXIT_USAGE)
    if code == UNAUTHENTICATED:
        return CliError(f"not authenticated: {details}")
    if code == PERMISSION_DENIED:
        return CliError(f"permission denied: {details}")
    if code == NOT_FOUND:
        return CliError(details)
    return CliError(f"{STATUS_NAMES.get(code, f'status {code}')}: {details}")


class Client:
    def __init__(self, address: str | None = None) -> None:
        self.address = address or controller_address() or self._address_from_config()
        self._channel: Any = None
        self._stubs: dict[Any, Any] = {}
        self._tls = False
        self._local: _socket.socket | None = None

    @staticmethod
    def _address_from_config() -> str:
        # Imported only here: most calls find the controller in GARRISON_CONTROLLER, or cached (cli/fastpath.py)
        from garrison.config import ConfigError, controller_address_from_env

        path = config_path()
        identity = config_identity(path)  # before reading: a change while we read is seen next time
        try:
            address = controller_address_from_env()
        except ConfigError as exc:
            raise CliError(f"cannot find the controller: {exc}") from None
        remember_config_address(path, identity, address)
        return address

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    # What the controller told us about itself, cached per address

    def _endpoints(self, refresh: bool = False) -> dict[str, str]:
        if not refresh:
            cached = cached_endpoints(self.address)
            if cached is not None:
                return cached
        from garrison.protos.v1 import garrison_pb2 as pb

        hello = self._grpc_call("Hello", pb.HelloRequest(), authenticated=False)
        endpoints = {"credential_socket": hello.credential_socket, "local_socket": hello.local_socket}
        write_cache(endpoint_cache_file(self.address),
                    (CACHE_FORMAT, self.address, hello.credential_socket, hello.local_socket))
        return endpoints

    # ---------------------------------------------------------------------------------------------
    # Local socket

    def _local_call(self, method: str, request: Any, path: str) -> Any:
        payload = self._local_exchange(method, request.SerializeToString(), path)
        from garrison.protos.v1 import garrison_pb2 as pb

        return getattr(pb, RESPONSE_TYPES[method]).FromString(payload)

    def _local_exchange(self, method: str, body: bytes, path: str) -> bytes:
        """One request and its answer on the local socket: the answer's payload, or the error it names."""
        if not path:
            raise _LocalUnusable
        if self._local is None:
            self._local = self._connect_local(path)
        name = method.encode()
        frame = bytes([len(name)]) + name + body
        local = self._local

        def once() -> bytes:
            local.sendall(HEADER.pack(len(frame)) + frame)
            (length,) = HEADER.unpack(self._recv(HEADER.size))
            return self._recv(length)

        try:
            answer = patiently(once)  # a refusal for the request rate is asked again when the controller says
        except TimeoutError:
            raise CliError(f"the controller at {path} did not answer in time") from None
        except OSError:
            self._local.close()
            self._local = None
            raise _LocalUnusable from None
        except BaseException:
            # Interrupted mid-exchange (galloc's Ctrl-C handler raises from whatever it interrupts): the
            # rest of this answer may still be on the way, and would be read as the next call's answer.
            self._local.close()
            self._local = None
            raise
        status, payload = answer[0], answer[1:]
        if status == UNIMPLEMENTED:
            raise _LocalUnusable  # a controller older than this CLI (a "+json" method): gRPC still works
        if status != OK:
            raise _error_for(status, payload.decode(errors="replace"), self.address)
        return payload

    @staticmethod
    def _connect_local(path: str) -> _socket.socket:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(DEFAULT_DEADLINE_S)
        try:
            sock.connect(path)
            # Only a socket served by root or by ourselves is the controller: anyone may create a
            # socket at a path in a shared directory (garrison up in /tmp), and requests carry scripts.
            _, server_uid, _ = struct.unpack("3i", sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12))
            if server_uid not in (0, os.geteuid()):
                raise OSError(f"{path} is served by uid {server_uid}")
        except OSError:
            sock.close()
            raise _LocalUnusable from None
        return sock

    def open_local_stream(self, method: str, first: bytes) -> _socket.socket | None:
        """A streaming RPC on the local socket (controller/rpc/local.py: its first frame names the method
        and carries the first message), or None where it cannot be used: gsrun then takes gRPC."""

        def connect(path: str) -> _socket.socket:
            if not path:
                raise _LocalUnusable
            sock = self._connect_local(path)
            name = method.encode()
            frame = bytes([len(name)]) + name + first
            try:
                sock.sendall(HEADER.pack(len(frame)) + frame)
            except OSError:
                sock.close()
                raise _LocalUnusable from None
            sock.settimeout(None)  # a step runs as long as its job lets it
            return sock

        return self._over_local_socket(connect)

    def _recv(self, count: int) -> bytes:
        assert self._local is not None
        data = b""
        while len(data) < count:
            chunk = self._local.recv(count - len(data))
            if not chunk:
                raise ConnectionResetError("controller closed the connection")
            data += chunk
        return data

    # ---------------------------------------------------------------------------------------------
    # gRPC

    def _grpc_call(self, method: str, request: Any, authenticated: bool = True) -> Any:
        from garrison.protos.v1 import garrison_pb2_grpc

        return self.service_call(garrison_pb2_grpc.ControllerStub, method, request, authenticated)

    def _stub(self, stub_class: Any) -> Any:
        """A stub of ``stub_class`` on this client's one channel (TLS when configured), both made once."""
        if self._channel is None:
            from garrison.tls import TlsError, client_ca_file, client_channel

            try:
                self._tls = bool(client_ca_file(self.address))
                self._channel = client_channel(self.address)
            except TlsError as exc:
                raise CliError(str(exc)) from None
        stub = self._stubs.get(stub_class)
        if stub is None:
            stub = self._stubs[stub_class] = stub_class(self._channel)
        return stub

    def service_call(self, stub_class: Any, method: str, request: Any, authenticated: bool = True) -> Any:
        """One RPC of any garrison.v1 service over gRPC (TLS when configured), with this user's identity."""
        import grpc

        stub = self._stub(stub_class)
        if authenticated and not self._tls:
            self._check_plaintext_server()
        waited = 0.0
        fresh = False
        while True:
            identity = self._identity(fresh) if authenticated else None
            metadata = (identity,) if identity is not None else ()
            try:
                return getattr(stub, method)(request, timeout=DEFAULT_DEADLINE_S, metadata=metadata)
            except grpc.RpcError as exc:
                code = exc.code()
                renewable = identity is not None and identity[0] == CREDENTIAL_METADATA
                if code == grpc.StatusCode.UNAUTHENTICATED and renewable and not fresh:
                    fresh = True
                    continue  # a cached credential the controller no longer takes (its key changed): renew it
                details = exc.details() or ""
                wait = rate_limit_wait(code.value[0], details, waited)
                if wait is not None:  # refused for the request rate, nothing done: ask again when told
                    time.sleep(wait)
                    waited += wait
                    continue
                if code == grpc.StatusCode.UNAVAILABLE and "Socket closed" in details and not self._tls:
                    details += " (a TLS controller? set GARRISON_TLS_CA to the cluster CA certificate)"
                raise _error_for(code.value[0], details, self.address) from None

    def _check_plaintext_server(self) -> None:
        """Plain text is loopback only (garrison/tls): send a credential there only to a port held by root or
        by ourselves, never to another user listening in the controller's place (garrison/loopback_listener.py)."""
        from garrison.loopback_listener import NobodyListens, UntrustedListener, check_loopback_listener

        try:
            check_loopback_listener(self.address, "a credential or token")
        except NobodyListens:
            # As a refused connection would be: retryable (gsub --wait rides out a controller restart).
            raise CliError(f"cannot reach the controller at {self.address}: nothing listens there",
                           retryable=True) from None
        except UntrustedListener as exc:
            raise CliError(str(exc)) from None
    def stream_call(self, stub_class: Any, method: str, requests: Any) -> Any:
        """A streaming RPC over gRPC (gsrun's RunStep): the iterator of answers. No deadline: a step runs as
        long as its job lets it; errors come out of the iterator as grpc.RpcError (see ``error_of``)."""
        stub = self._stub(stub_class)
        return getattr(stub, method)(requests, metadata=(self._identity(),))

    def error_of(self, exc: Any) -> CliError:
        """A grpc.RpcError out of ``stream_call`` as the CLI's one-line error."""
        return _error_for(exc.code().value[0], exc.details() or "", self.address)

    def _identity(self, fresh: bool = False) -> tuple[str, str]:
        """The metadata that proves who we are: a local credential, else a token (docs/security.md)."""
        from garrison.tokens import TOKEN_METADATA_KEY, TokenError, user_token

        if _token_requested():
            try:
                return TOKEN_METADATA_KEY, user_token()  # asked for explicitly: no local credential then
            except TokenError as exc:
                raise CliError(str(exc)) from None
        try:
            return CREDENTIAL_METADATA, self._credential(fresh)
        except CliError as no_credential:
            try:
                return TOKEN_METADATA_KEY, user_token()
            except TokenError as no_token:
                raise CliError(f"{no_credential}; and no usable token: {no_token}") from None

    def _credential(self, fresh: bool = False) -> str:
        import math

        from garrison.auth import AuthError, cached_credential

        for refresh in (False, True):
            socket_path = self._endpoints(refresh=refresh)["credential_socket"]
            try:
                # min_validity_s=inf: never reuse the cached credential (the controller refused it).
                return cached_credential(socket_path, min_validity_s=math.inf if fresh else 30.0)
            except AuthError as exc:
                if refresh or not os.path.exists(socket_path):
                    # Not on the controller host (no such socket): a token is the way in from here.
                    raise CliError(
                        f"cannot get a credential from {socket_path}: {exc} "
                        "(run the CLI on the controller host, or ask an admin for a token: docs/security.md)"
                    ) from None
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------------------------------------

    def call(self, method: str, request: Any) -> Any:
        """One Controller RPC: over the local socket when this host has it, else over gRPC."""
        answer = self._over_local_socket(lambda path: self._local_call(method, request, path))
        return answer if answer is not None else self._grpc_call(method, request)

    def call_plain(self, method: str, request: dict[str, Any]) -> PlainMessage:
        """``call`` with the request and the answer in their plain form (garrison/plainmsg.py): on the
        local socket neither this process nor the answer touches protobuf, which gsub and gqueue cannot
        afford to import. Over gRPC the messages are converted here."""
        body = _plain_json(request).encode()
        payload = self._over_local_socket(lambda path: self._local_exchange(method + PLAIN_METHOD_SUFFIX, body, path))
        if payload is not None:
            return PlainMessage(_loads(payload))
        import importlib

        from garrison.plainmsg import PlainError, from_plain, to_plain

        messages, request_name, stubs, stub_name = OTHER_SERVICES.get(
            method, ("garrison_pb2", method + "Request", "garrison_pb2_grpc", "ControllerStub"))
        request_type = getattr(importlib.import_module(f"garrison.protos.v1.{messages}"), request_name)
        stub_class = getattr(importlib.import_module(f"garrison.protos.v1.{stubs}"), stub_name)
        try:
            message = from_plain(request, request_type)
        except PlainError as err:
            raise CliError(f"malformed request: {err}", EXIT_USAGE) from None
        return PlainMessage(to_plain(self.service_call(stub_class, method, message)))

    def _over_local_socket(self, exchange: Callable[[str], T]) -> T | None:
        """``exchange(socket path)`` on this host's local socket, or None when it cannot be used here."""
        if os.environ.get("GARRISON_TRANSPORT") == "grpc" or _token_requested():
            # Forced (to test the remote path), or a token asked for by name: the local socket would
            # speak for this process's own uid instead.
            return None
        for refresh in (False, True):
            try:
                return exchange(self._endpoints(refresh=refresh).get("local_socket", ""))
            except _LocalUnusable:
                continue  # a stale cache or another host: ask again, then fall back to gRPC
        return None
