"""Local identity: who is calling the controller, as proven by the kernel rather than claimed in a request.

On the controller host a CredentialService listens on a Unix stream socket that any local user may open.
For each connection it asks the kernel who the peer is (SO_PEERCRED: grpcio does not expose peer
credentials itself), looks up the user's name and groups, and answers one line: a short-lived credential
signed with HMAC-SHA256 under a key only the controller can read. The CLI sends that credential as gRPC
metadata (``x-garrison-credential``) and the controller verifies it on every RPC; a user name in a
request body is never trusted.

Token format (garrison.signing's, with the tag ``v1``): ``v1.<claims>.<signature>`` where ``<claims>`` is
unpadded URL-safe base64 of compact JSON {"user", "uid", "gid", "groups", "exp"} and ``<signature>`` the
unpadded URL-safe base64 HMAC-SHA256 over ``v1.<claims>`` (so the version tag is signed too). The claims
are readable without the key, which lets the CLI know when its cached token runs out; only the controller
can verify.

This module imports only the standard library, garrison.signing and garrison.model, because every CLI
command that authenticates loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import pwd
import queue
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from garrison.model.domain import Principal
from garrison.signing import (
    AuthError,
    Base64Error,
    TokenFormat,
    check_key_length,
    decode_claims,
    encode_token,
    load_or_create_key,
    signature_matches,
    split_token,
)

__all__ = [
    "CREDENTIAL_METADATA_KEY",
    "DEFAULT_LIFETIME_S",
    "AuthError",
    "CredentialClaims",
    "CredentialService",
    "Principal",
    "cached_credential",
    "default_cache_dir",
    "fetch_credential",
    "issue_credential",
    "load_or_create_key",
    "peek_credential",
    "principal_for",
    "verify_credential",
]

log = logging.getLogger(__name__)

CREDENTIAL_METADATA_KEY = "x-garrison-credential"
TOKEN_VERSION = "v1"
DEFAULT_LIFETIME_S = 300.0
# Far above any real token (a user in a few hundred groups), far below anything that could hurt to parse.
MAX_TOKEN_CHARS = 16 * 1024
_ERROR_PREFIX = "ERROR "  # how the service says why it gave no credential; tokens start with "v1."
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class CredentialClaims:
    """What a credential says, read without checking its signature: for the holder's own bookkeeping."""

    principal: Principal
    expires_at: float


# ------------------------------------------------------------------------------------------ tokens


CREDENTIAL_FORMAT = TokenFormat(
    tag=TOKEN_VERSION,
    noun="credential",
    shape="version.claims.signature",
    max_chars=MAX_TOKEN_CHARS,
    error=AuthError,
)


def issue_credential(key: bytes, principal: Principal, now: float, lifetime_s: float) -> str:
    """A token proving ``principal`` until ``now + lifetime_s``, signed with ``key``."""
    check_key_length(key)
    if not lifetime_s > 0:
        raise ValueError(f"credential lifetime must be positive, got {lifetime_s}")
    claims = {
        "user": principal.user,
        "uid": principal.uid,
        "gid": principal.gid,
        "groups": list(principal.groups),
        "exp": float(now + lifetime_s),
    }
    return encode_token(key, TOKEN_VERSION, claims)


def _is_id(value: object) -> bool:
    # bool is an int subclass; True must not pass for uid 1.
    return type(value) is int and 0 <= value < 2**32


def _decode_claims(encoded_claims: str) -> CredentialClaims:
    try:
        claims = decode_claims(encoded_claims)
    except Base64Error:
        raise AuthError("malformed credential: bad base64") from None
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise AuthError("malformed credential: claims are not JSON") from None
    if not isinstance(claims, dict):
        raise AuthError("malformed credential: claims are not an object")
    user, uid, gid = claims.get("user"), claims.get("uid"), claims.get("gid")
    groups, expires_at = claims.get("groups"), claims.get("exp")
    if not isinstance(user, str) or not user:
        raise AuthError("malformed credential: bad user")
    if not _is_id(uid) or not _is_id(gid):
        raise AuthError("malformed credential: bad uid or gid")
    if not isinstance(groups, list) or not all(_is_id(group) for group in groups):
        raise AuthError("malformed credential: bad groups")
    if (
        isinstance(expires_at, bool)
        or not isinstance(expires_at, int | float)
        or not math.isfinite(expires_at)
    ):
        raise AuthError("malformed credential: bad expiry")
    assert isinstance(uid, int) and isinstance(gid, int)
    principal = Principal(user=user, uid=uid, gid=gid, groups=tuple(groups))
    return CredentialClaims(principal=principal, expires_at=float(expires_at))


def verify_credential(key: bytes, token: str, now: float) -> Principal:
    """The principal a token proves, or AuthError if it is malformed, tampered with, or expired."""
    check_key_length(key)
    parts = split_token(token, CREDENTIAL_FORMAT)
    if not signature_matches(key, parts):
        raise AuthError("credential signature does not match (tampered with, or signed with another key)")
    claims = _decode_claims(parts.encoded_claims)
    if now >= claims.expires_at:
        raise AuthError(f"credential expired {now - claims.expires_at:.0f}s ago")
    return claims.principal


def peek_credential(token: str) -> CredentialClaims:
    """Read a token's claims WITHOUT checking the signature: only for deciding when to fetch a new one."""
    return _decode_claims(split_token(token, CREDENTIAL_FORMAT).encoded_claims)


# ------------------------------------------------------------------------------------------ service


def principal_for(uid: int, gid: int) -> Principal:
    """The principal for a kernel-reported uid/gid: the account name and its groups from the user database.

    An unknown uid (a container user, say) still gets a principal, named by the number, so it can be
    refused by policy with a clear name rather than failing obscurely here.
    """
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return Principal(user=str(uid), uid=uid, gid=gid, groups=(gid,))
    try:
        groups = os.getgrouplist(user, gid)
    except OSError:
        groups = [gid]
    return Principal(user=user, uid=uid, gid=gid, groups=tuple(sorted(set(groups))))


class CredentialService:
    """Hands each local caller a credential for the identity the kernel reports for it.

    One thread accepts connections and a few workers answer them, so a slow user-database lookup (LDAP,
    say) for one caller does not hold up the rest. Callers send nothing: connecting is the request.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        key: bytes,
        *,
        lifetime_s: float = DEFAULT_LIFETIME_S,
        clock: Callable[[], float] = time.time,
        workers: int = 4,
    ) -> None:
        check_key_length(key)
        if not hasattr(socket, "SO_PEERCRED"):
            raise AuthError("the credential service needs SO_PEERCRED (Linux)")
        self.socket_path = os.fspath(socket_path)
        self._key = key
        self._lifetime_s = lifetime_s
        self._clock = clock
        self._worker_count = max(1, workers)
        self._listener: socket.socket | None = None
        self._socket_identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket we bound
        self._wake_reader: socket.socket | None = None
        self._wake_writer: socket.socket | None = None
        self._connections: queue.SimpleQueue[socket.socket | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> CredentialService:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        if self._listener is not None:
            raise RuntimeError("credential service already started")
        self._remove_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.socket_path)
            # Any local user may ask: the answer only ever proves who the asker already is.
            os.chmod(self.socket_path, 0o666)
            info = os.stat(self.socket_path)
            listener.listen(socket.SOMAXCONN)
            listener.setblocking(False)
        except OSError as error:
            listener.close()
            raise AuthError(f"cannot listen on {self.socket_path}: {error.strerror or error}") from None
        self._listener = listener
        self._socket_identity = (info.st_dev, info.st_ino)
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._threads = [threading.Thread(target=self._accept_loop, name="credential-accept", daemon=True)]
        self._threads += [
            threading.Thread(target=self._answer_loop, name=f"credential-worker-{number}", daemon=True)
            for number in range(self._worker_count)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop accepting, finish the connections already accepted, and remove the socket file."""
        if self._listener is None:
            return
        assert self._wake_writer is not None and self._wake_reader is not None
        self._wake_writer.send(b"x")
        self._threads[0].join()
        for _ in self._threads[1:]:
            self._connections.put(None)
        for thread in self._threads[1:]:
            thread.join()
        self._listener.close()
        self._wake_reader.close()
        self._wake_writer.close()
        self._listener = self._wake_reader = self._wake_writer = None
        self._threads = []
        # Remove the socket only if it is still ours: a successor may already have bound a new one there.
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(self.socket_path)
            if (info.st_dev, info.st_ino) == self._socket_identity:
                os.unlink(self.socket_path)
        self._socket_identity = None

    def _remove_stale_socket(self) -> None:
        try:
            info = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise AuthError(f"{self.socket_path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(self.socket_path)
        except OSError:
            os.unlink(self.socket_path)  # nobody listening: left behind by a process that died
            return
        finally:
            probe.close()
        raise AuthError(f"a credential service is already listening on {self.socket_path}")

    def _accept_loop(self) -> None:
        assert self._listener is not None and self._wake_reader is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _ in selector.select()}
                if self._wake_reader in ready:
                    return
                # Drain the backlog: under a burst many connections are waiting behind one wake-up.
                while True:
                    try:
                        connection, _ = self._listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as error:  # out of file descriptors, say: wait for the next wake-up
                        log.warning("credential service accept failed: %s", error)
                        break
                    self._connections.put(connection)

    def _answer_loop(self) -> None:
        while True:
            connection = self._connections.get()
            if connection is None:
                return
            with connection:
                try:
                    connection.setblocking(True)
                    connection.settimeout(2.0)
                    connection.sendall(self._answer(connection).encode("utf-8") + b"\n")
                except OSError as error:  # the caller hung up or stalled: its loss, not ours
                    log.debug("credential service could not answer a caller: %s", error)

    def _answer(self, connection: socket.socket) -> str:
        try:
            pid, uid, gid = _UCRED.unpack(
                connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
            principal = principal_for(uid, gid)
            token = issue_credential(self._key, principal, self._clock(), self._lifetime_s)
        except Exception as error:  # one bad lookup must not kill a worker thread
            log.exception("credential service failed to issue a credential")
            return f"{_ERROR_PREFIX}{' '.join(str(error).split()) or type(error).__name__}"
        log.debug("issued a credential to %s (uid %d, pid %d)", principal.user, uid, pid)
        return token


# ------------------------------------------------------------------------------------------- client


def fetch_credential(socket_path: str, timeout_s: float = 2.0) -> str:
    """Ask the local credential service for a credential for this process's user."""
    deadline = time.monotonic() + timeout_s
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(timeout_s)
        try:
            client.connect(socket_path)
        except FileNotFoundError:
            raise AuthError(
                f"no credential service at {socket_path}: the socket does not exist "
                "(is garrison-controller running on this host?)"
            ) from None
        except ConnectionRefusedError:
            raise AuthError(
                f"credential service at {socket_path} refused the connection "
                "(stale socket: is garrison-controller running?)"
            ) from None
        except TimeoutError:
            raise AuthError(f"timed out connecting to the credential service at {socket_path}") from None
        except OSError as error:
            raise AuthError(
                f"cannot reach the credential service at {socket_path}: {error.strerror}"
            ) from None

        received = bytearray()
        while b"\n" not in received and len(received) <= MAX_TOKEN_CHARS + len(_ERROR_PREFIX):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AuthError(f"timed out waiting for the credential service at {socket_path}")
            client.settimeout(remaining)
            try:
                chunk = client.recv(4096)
            except TimeoutError:
                raise AuthError(f"timed out waiting for the credential service at {socket_path}") from None
            except OSError as error:
                raise AuthError(f"credential service at {socket_path} failed: {error.strerror}") from None
            if not chunk:
                break
            received += chunk
    finally:
        client.close()

    line = received.partition(b"\n")[0].decode("utf-8", "replace").strip()
    if line.startswith(_ERROR_PREFIX):
        raise AuthError(f"credential service refused: {line[len(_ERROR_PREFIX) :]}")
    if not line:
        raise AuthError(f"credential service at {socket_path} closed the connection without a credential")
    peek_credential(line)  # a garbled answer fails here with a clear error, not later at the controller
    return line


def default_cache_dir() -> Path | None:
    """$XDG_CACHE_HOME/garrison, else ~/.cache/garrison; None when there is no home to put it in."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore a relative value
        return Path(xdg) / "garrison"
    try:
        return Path.home() / ".cache" / "garrison"
    except RuntimeError:
        return None


def _cache_file(cache_dir: Path, socket_path: str) -> Path:
    # Keyed by the effective uid too, so a HOME shared between identities (sudo keeping HOME, say)
    # never hands one user's token to another.
    socket_key = hashlib.sha256(os.path.abspath(socket_path).encode("utf-8", "surrogateescape")).hexdigest()
    return cache_dir / f"credential-{os.geteuid()}-{socket_key[:24]}"


def _read_cached(path: Path) -> str | None:
    """The cached token, if the file is ours alone; anything odd about it means "no cache"."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as cache:
        info = os.fstat(cache.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None
        data = cache.read(MAX_TOKEN_CHARS + 1)
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def _write_cached(path: Path, token: str) -> None:
    """Store the token atomically with mode 0600. Best effort: a read-only home just means no cache."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as cache:
            cache.write(token.encode("ascii") + b"\n")
        os.replace(temporary, path)
    except OSError as error:
        log.debug("not caching the credential in %s: %s", path, error)
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def cached_credential(
    socket_path: str,
    cache_dir: Path | None = None,
    min_validity_s: float = 30.0,
    *,
    now: float | None = None,
    timeout_s: float = 2.0,
) -> str:
    """A credential for this process's user, reused from the cache while it has over ``min_validity_s``
    left, else fetched from the service at ``socket_path`` and cached (mode 0600) for next time.

    ``now`` is the wall-clock time to judge validity by (default: the current time).
    """
    current_time = time.time() if now is None else now
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    cache_file = _cache_file(directory, socket_path) if directory is not None else None

    if cache_file is not None:
        token = _read_cached(cache_file)
        if token is not None:
            try:
                claims = peek_credential(token)
            except AuthError:
                claims = None
            if (
                claims is not None
                and claims.principal.uid == os.geteuid()
                and claims.expires_at - current_time > min_validity_s
            ):
                return token

    token = fetch_credential(socket_path, timeout_s=timeout_s)
    if cache_file is not None:
        _write_cached(cache_file, token)
    return token
