"""Long-lived, revocable tokens for users on hosts other than the controller's (like Slurm's auth/jwt).

On the controller host the kernel vouches for a caller (garrison.auth). From a login node nothing does,
so an admin issues the user a token (``gadmin token issue --user alice --lifetime 7d``); the CLI keeps it
in a 0600 file in the user's config directory and sends it as ``x-garrison-token`` metadata, over TLS.

Format, garrison.signing's like the local credential's: ``t1.<claims>.<signature>``; ``<claims>`` is unpadded URL-safe base64
of compact JSON {"sub": user, "uid", "jti": token id, "iat", "exp"}, and ``<signature>`` the HMAC-SHA256
of ``t1.<claims>`` under the controller's token key (a different key from the credential key, so either
can be rotated alone). The version tag differs from the credential's ``v1`` and is signed, so one kind
can never be passed off as the other.

Revocation: the controller keeps a registry of the tokens it issued (ids, users, expiry; never the tokens
themselves) in a 0600 JSON file, written atomically before an issue or a revocation is answered. A token
is accepted only if its id is in the registry and not revoked, so a lost registry fails closed. Groups are
not in the token: they are read from the controller host's user database on every use, so a change of
groups takes effect at once, and a user whose uid changed or who was removed is refused.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from garrison.auth import principal_for
from garrison.model.domain import Principal
from garrison.signing import (
    AuthError,
    SignedToken,
    TokenFormat,
    decode_claims,
    encode_token,
    signature_matches,
    split_token,
)

TOKEN_METADATA_KEY = "x-garrison-token"
TOKEN_VERSION = "t1"
MAX_TOKEN_CHARS = 4096
DEFAULT_LIFETIME_S = 7 * 86400
TOKEN_ENV = "GARRISON_TOKEN"
TOKEN_FILE_ENV = "GARRISON_TOKEN_FILE"
REGISTRY_VERSION = 1
_TOKEN_ID = re.compile(r"^[0-9a-f]{16}$")
_LIFETIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class TokenError(AuthError):
    """A token is malformed, forged, expired or revoked; the message is one line saying which."""


USER_TOKEN_FORMAT = TokenFormat(
    tag=TOKEN_VERSION,
    noun="token",
    shape="t1.claims.signature",
    max_chars=MAX_TOKEN_CHARS,
    error=TokenError,
    strips_whitespace=True,
)


@dataclass(frozen=True)
class TokenClaims:
    user: str
    uid: int
    token_id: str
    issued_at: float
    expires_at: float


@dataclass(frozen=True)
class TokenRecord:
    """What the controller remembers of an issued token (never the token itself)."""

    token_id: str
    user: str
    uid: int
    issued_at: float
    expires_at: float
    issued_by: str
    revoked_at: float | None = None


# ------------------------------------------------------------------------------------ format


def parse_lifetime(text: str) -> float:
    """Seconds from ``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or a plain number of seconds."""
    match = _LIFETIME.match(text)
    if not match:
        raise ValueError(f"cannot parse lifetime {text!r} (examples: 7d, 12h, 30m, 3600)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not seconds > 0:
        raise ValueError(f"lifetime must be positive, got {text!r}")
    return seconds


def issue_token(key: bytes, claims: TokenClaims) -> str:
    body = {
        "sub": claims.user,
        "uid": claims.uid,
        "jti": claims.token_id,
        "iat": claims.issued_at,
        "exp": claims.expires_at,
    }
    return encode_token(key, TOKEN_VERSION, body)


def _split(token: str) -> SignedToken:
    return split_token(token, USER_TOKEN_FORMAT)


def _finite_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _decode(encoded: str) -> TokenClaims:
    try:
        body = decode_claims(encoded)
    except ValueError:  # bad base64 (Base64Error), not UTF-8 (UnicodeDecodeError), not JSON
        raise TokenError("malformed token: claims are not base64 JSON") from None
    if not isinstance(body, dict):
        raise TokenError("malformed token: claims are not an object")
    user, uid, token_id = body.get("sub"), body.get("uid"), body.get("jti")
    issued_at, expires_at = body.get("iat"), body.get("exp")
    if not isinstance(user, str) or not user or len(user) > 256:
        raise TokenError("malformed token: bad user")
    if type(uid) is not int or not 0 <= uid < 2**32:
        raise TokenError("malformed token: bad uid")
    if not isinstance(token_id, str) or not _TOKEN_ID.match(token_id):
        raise TokenError("malformed token: bad token id")
    if not _finite_number(issued_at) or not _finite_number(expires_at):
        raise TokenError("malformed token: bad times")
    assert isinstance(issued_at, int | float) and isinstance(expires_at, int | float)
    return TokenClaims(user, uid, token_id, float(issued_at), float(expires_at))


def verify_token_signature(key: bytes, token: str, now: float) -> TokenClaims:
    """The claims of a token signed with ``key`` and not expired at ``now``; TokenError otherwise."""
    parts = _split(token)
    if not signature_matches(key, parts):
        raise TokenError("token signature does not match (forged, altered, or signed with another key)")
    claims = _decode(parts.encoded_claims)
    if now >= claims.expires_at:
        raise TokenError(f"token {claims.token_id} of {claims.user} expired {now - claims.expires_at:.0f}s ago")
    return claims


def peek_token(token: str) -> TokenClaims:
    """A token's claims WITHOUT checking its signature: for the CLI to say when its token runs out."""
    return _decode(_split(token).encoded_claims)


# ---------------------------------------------------------------------------------- registry


class TokenRegistry:
    """The controller's record of issued tokens, persisted to a 0600 JSON file on every change.

    Thread-safe; all methods are cheap except the ones that change the file (issue, revoke), which fsync.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: bytes,
        *,
        clock: Callable[[], float] = time.time,
        max_lifetime_s: float = 365 * 86400,
        lookup_user: Callable[[str], tuple[int, int]] | None = None,
        principal_of: Callable[[int, int], Principal] = principal_for,
    ) -> None:
        self.path = Path(path)
        self._key = key
        self._clock = clock
        self.max_lifetime_s = max_lifetime_s
        self._lookup_user = lookup_user or _lookup_user
        self._principal_of = principal_of
        self._lock = threading.Lock()
        self._records: dict[str, TokenRecord] = {}
        self._load()

    # --- persistence -----------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as error:
            raise AuthError(f"cannot read token registry {self.path}: {error.strerror}") from None
        with os.fdopen(fd, "rb") as registry:
            info = os.fstat(registry.fileno())
            if info.st_mode & 0o077:
                raise AuthError(f"token registry {self.path} is readable by others; want mode 0600")
            try:
                document = json.loads(registry.read())
                if document.get("version") != REGISTRY_VERSION:
                    raise ValueError(f"unknown version {document.get('version')!r}")
                records = {tid: TokenRecord(**fields) for tid, fields in document["tokens"].items()}
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                raise AuthError(f"token registry {self.path} is corrupt: {error}") from None
        self._records = records

    def _save(self) -> None:
        now = self._clock()
        # Forget tokens that expired over a day ago: an expired token is refused by its own claims.
        self._records = {tid: r for tid, r in self._records.items() if r.expires_at > now - 86400}
        document = {"version": REGISTRY_VERSION, "tokens": {tid: asdict(r) for tid, r in self._records.items()}}
        data = json.dumps(document, indent=1, sort_keys=True).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise AuthError(f"cannot write token registry {self.path}: {error.strerror}") from None

    # --- operations ------------------------------------------------------------------------------

    def issue(self, user: str, lifetime_s: float, issued_by: str) -> tuple[str, TokenRecord]:
        """A new token for ``user`` (who must exist on this host), valid for ``lifetime_s``.

        ValueError for a bad user or lifetime (the caller maps it to INVALID_ARGUMENT).
        """
        if not math.isfinite(lifetime_s) or lifetime_s <= 0:
            raise ValueError("token lifetime must be positive")
        if lifetime_s > self.max_lifetime_s:
            raise ValueError(
                f"token lifetime {lifetime_s:.0f}s exceeds the maximum of {self.max_lifetime_s:.0f}s "
                "(controller.token_max_lifetime)"
            )
        uid, _ = self._lookup_user(user)
        now = self._clock()
        claims = TokenClaims(user, uid, secrets.token_hex(8), now, now + lifetime_s)
        record = TokenRecord(claims.token_id, user, uid, now, claims.expires_at, issued_by)
        with self._lock:
            self._records[record.token_id] = record
            try:
                self._save()
            except AuthError:
                del self._records[record.token_id]
                raise
        return issue_token(self._key, claims), record

    def verify(self, token: str) -> Principal:
        """Who a token speaks for, or TokenError: forged, expired, unknown, revoked, or a changed user."""
        claims = verify_token_signature(self._key, token, self._clock())
        with self._lock:
            record = self._records.get(claims.token_id)
        if record is None or record.uid != claims.uid or record.user != claims.user:
            raise TokenError(f"token {claims.token_id} is not known to this controller (revoked or lost)")
        if record.revoked_at is not None:
            raise TokenError(f"token {claims.token_id} of {claims.user} was revoked")
        try:
            entry = pwd.getpwuid(claims.uid)
        except KeyError:
            raise TokenError(f"token {claims.token_id}: uid {claims.uid} no longer exists on the controller host") from None
        if entry.pw_name != claims.user:
            raise TokenError(f"token {claims.token_id}: uid {claims.uid} is now {entry.pw_name!r}, not {claims.user!r}")
        return self._principal_of(entry.pw_uid, entry.pw_gid)

    def revoke(self, token_ids: list[str], user: str = "") -> list[TokenRecord]:
        """Revoke the given tokens and, if ``user`` is set, every live token of that user."""
        for token_id in token_ids:
            if not _TOKEN_ID.match(token_id):
                raise ValueError(f"invalid token id {token_id[:40]!r} (16 hex digits)")
        now = self._clock()
        with self._lock:
            unknown = [tid for tid in token_ids if tid not in self._records]
            if unknown:
                raise KeyError(f"no such token {unknown[0]}")
            chosen = set(token_ids)
            if user:
                chosen |= {tid for tid, r in self._records.items() if r.user == user}
            changed = []
            previous = dict(self._records)
            for tid in sorted(chosen):
                record = self._records[tid]
                if record.revoked_at is None:
                    self._records[tid] = replace(record, revoked_at=now)
                    changed.append(self._records[tid])
            if changed:
                try:
                    self._save()
                except AuthError:
                    self._records = previous
                    raise
        return changed

    def records(self, user: str = "", include_inactive: bool = False) -> list[TokenRecord]:
        now = self._clock()
        with self._lock:
            records = list(self._records.values())
        return sorted(
            (
                r
                for r in records
                if (not user or r.user == user)
                and (include_inactive or (r.revoked_at is None and r.expires_at > now))
            ),
            key=lambda r: (r.issued_at, r.token_id),
        )


def _lookup_user(user: str) -> tuple[int, int]:
    if not user or len(user) > 256 or "\0" in user:
        raise ValueError("invalid user name")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"no user {user!r} on the controller host") from None
    return entry.pw_uid, entry.pw_gid


# ------------------------------------------------------------------------------- client side


def default_token_file(environ: dict[str, str] | os._Environ[str] = os.environ, home: str | None = None) -> Path:
    """Where the CLI looks for its token: $GARRISON_TOKEN_FILE, else $XDG_CONFIG_HOME/garrison/token."""
    explicit = environ.get(TOKEN_FILE_ENV)
    if explicit:
        return Path(explicit)
    base = environ.get("XDG_CONFIG_HOME") if home is None else None
    if not base:
        base = os.path.join(home if home is not None else os.path.expanduser("~"), ".config")
    return Path(base) / "garrison" / "token"


def read_token_file(path: Path) -> str:
    """The token in ``path``, refusing one others could read or that belongs to someone else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TokenError(f"no token file {path}") from None
    except OSError as error:
        raise TokenError(f"cannot read token file {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as token_file:
        info = os.fstat(token_file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"token file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise TokenError(f"token file {path} belongs to uid {info.st_uid}, not to you")
        if info.st_mode & 0o077:
            raise TokenError(
                f"token file {path} is readable by others (mode {info.st_mode & 0o777:04o}); "
                f"run: chmod 600 {path}"
            )
        data = token_file.read(MAX_TOKEN_CHARS + 2)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} does not hold a token") from None
    _split(token)
    return token


def write_token_file(path: Path, token: str) -> None:
    """Store a token as the current user: parent directories 0700, the file 0600, never through a link."""
    _split(token)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def install_token_for(user: str, token: str) -> Path:
    """Write ``token`` into ``user``'s config directory, as that user.

    Run as root for another user, the writing happens in a child process that has dropped to the user's
    uid, gid and groups first, so a symbolic link planted in the user's home cannot make root write (or
    chown) anything the user could not write themselves.
    """
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise TokenError(f"no user {user!r} on this host") from None
    path = default_token_file({}, home=entry.pw_dir)
    if entry.pw_uid == os.geteuid():
        write_token_file(path, token)
        return path
    if os.geteuid() != 0:
        raise TokenError(f"only root can install a token for {user}; give it to them to store in {path}")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become the user, then write
        os.close(read_end)
        message = b""
        try:
            os.setgroups(os.getgrouplist(entry.pw_name, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.umask(0o077)
            write_token_file(path, token)
        except BaseException as error:  # noqa: B036 - a forked child must never return into the caller
            message = f"{type(error).__name__}: {error}".encode(errors="replace")
        finally:
            os.write(write_end, message)
            os._exit(1 if message else 0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        reason = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0 or reason:
        raise TokenError(f"cannot install the token in {path} as {user}: {reason or 'failed'}")
    return path


def user_token(environ: dict[str, str] | os._Environ[str] = os.environ, now: float | None = None) -> str:
    """The CLI's token: $GARRISON_TOKEN, else the token file; TokenError if none, or if it has expired."""
    token = environ.get(TOKEN_ENV, "").strip()
    where = f"${TOKEN_ENV}"
    if token:
        _split(token)
    else:
        path = default_token_file(environ)
        token, where = read_token_file(path), str(path)
    claims = peek_token(token)
    current = time.time() if now is None else now
    if current >= claims.expires_at:
        expired = time.strftime("%Y-%m-%d %H:%M", time.localtime(claims.expires_at))
        raise TokenError(f"the token in {where} expired at {expired}; ask an admin for a new one")
    return token
