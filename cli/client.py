"""The CLI's connection to the controller: address, credential, deadlines, and errors -> messages + exit codes.

Kept lean on purpose: grpc and the generated modules are imported only when a call is made, and the
credential service's socket path is cached per controller address so a warm call is one RPC.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from garrison.config import ConfigError, controller_address_from_env

if TYPE_CHECKING:
    from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc

CREDENTIAL_METADATA = "x-garrison-credential"
DEFAULT_DEADLINE_S = 30.0
EXIT_USAGE = 2
EXIT_FAILURE = 1

T = TypeVar("T")


class CliError(Exception):
    """A one-line message for the user and the exit status to leave with."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fail(prog: str, error: CliError) -> NoReturn:
    print(f"{prog}: error: {error}", file=sys.stderr)
    sys.exit(error.exit_code)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "garrison"


class Client:
    def __init__(self, address: str | None = None) -> None:
        try:
            self.address = address or controller_address_from_env()
        except ConfigError as exc:
            raise CliError(f"cannot find the controller: {exc}") from None
        import grpc

        self._grpc = grpc
        self.channel = grpc.insecure_channel(self.address)
        from garrison.protos.v1 import garrison_pb2_grpc

        self.stub: pb_grpc.ControllerStub = garrison_pb2_grpc.ControllerStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------

    def _socket_cache(self) -> Path:
        digest = hashlib.sha256(self.address.encode()).hexdigest()[:16]
        return _cache_dir() / f"controller-{digest}.json"

    def _credential_socket(self, refresh: bool = False) -> str:
        cache = self._socket_cache()
        if not refresh:
            try:
                return str(json.loads(cache.read_text())["credential_socket"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
        from garrison.protos.v1 import garrison_pb2 as pb

        hello = self._invoke(self.stub.Hello, pb.HelloRequest(), authenticated=False)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"credential_socket": hello.credential_socket}))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home only costs one extra RPC per call
        return str(hello.credential_socket)

    def _credential(self) -> str:
        from garrison.auth import AuthError, cached_credential

        for refresh in (False, True):
            socket_path = self._credential_socket(refresh=refresh)
            try:
                return cached_credential(socket_path)
            except AuthError as exc:
                if refresh:
                    raise CliError(
                        f"cannot get a credential from {socket_path}: {exc} "
                        "(run the CLI on the controller host, or see docs/ for tokens)"
                    ) from None
        raise AssertionError("unreachable")

    def _invoke(self, method: Callable[..., T], request: Any, authenticated: bool = True,
                deadline_s: float = DEFAULT_DEADLINE_S) -> T:
        grpc = self._grpc
        metadata = ((CREDENTIAL_METADATA, self._credential()),) if authenticated else ()
        try:
            return method(request, timeout=deadline_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise self._translate(exc) from None

    def _translate(self, exc: Any) -> CliError:
        grpc = self._grpc
        code = exc.code()
        details = (exc.details() or "").splitlines()[0] if exc.details() else ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return CliError(f"cannot reach the controller at {self.address}: {details or 'unavailable'}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return CliError(f"the controller at {self.address} did not answer in time")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return CliError(details, EXIT_USAGE)
        if code == grpc.StatusCode.UNAUTHENTICATED:
            # A stale cached credential (e.g. the controller's key changed): forget it next time.
            return CliError(f"not authenticated: {details}")
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return CliError(f"permission denied: {details}")
        if code == grpc.StatusCode.NOT_FOUND:
            return CliError(details)
        return CliError(f"{code.name.lower()}: {details}")

    def call(self, method_name: str, request: Any) -> Any:
        return self._invoke(getattr(self.stub, method_name), request)
