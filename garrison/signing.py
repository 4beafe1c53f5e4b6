"""How Garrison signs a token and checks one: the codec shared by local credentials (garrison.auth) and
user tokens (garrison.tokens), and the key files they are signed with.

A token is URL-safe text ``<tag>.<claims>.<signature>``: ``<claims>`` is unpadded URL-safe base64 of
compact JSON with sorted keys, and ``<signature>`` the unpadded URL-safe base64 HMAC-SHA256 of
``<tag>.<claims>`` (so the tag is signed too, and a token of one kind can never pass for another). The
encoding is deterministic: the same key and claims always give the same text. The claims are readable
without the key; only the key's holder can sign or verify.

Each kind of token names itself in its errors ("malformed credential", "malformed token: ..."); a
``TokenFormat`` carries those words, so the two kinds share every line of the codec but not their messages.

This module imports nothing outside the standard library, because every CLI command that authenticates
loads it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "KEY_BYTES",
    "AuthError",
    "Base64Error",
    "SignedToken",
    "TokenFormat",
    "b64decode",
    "b64encode",
    "check_key_length",
    "decode_claims",
    "encode_token",
    "load_or_create_key",
    "signature_matches",
    "split_token",
]

KEY_BYTES = 32


class AuthError(Exception):
    """Authentication failed; the message is one line saying why."""


class Base64Error(ValueError):
    """Text that is not canonical unpadded URL-safe base64."""


@dataclass(frozen=True)
class TokenFormat:
    """One kind of signed token: its tag, its size limit, and the words its errors use."""

    tag: str  # the first field, e.g. "v1" for a credential, "t1" for a user token
    noun: str  # what the errors call it: "credential", "token"
    shape: str  # how the errors spell the expected layout: "version.claims.signature"
    max_chars: int
    error: type[AuthError]
    # User tokens come from files and environment variables, where a stray newline or space is common;
    # credentials come from the service's own answer, which has none.
    strips_whitespace: bool = False


# A dataclass, not a NamedTuple: importing typing would cost every authenticating CLI call a few ms.
@dataclass(frozen=True)
class SignedToken:
    """A token cut at its dots, its outer shape and tag already checked."""

    signed_text: str  # "<tag>.<claims>": what the signature covers
    encoded_claims: str
    signature: str


# ------------------------------------------------------------------------------------------ base64


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64decode(text: str) -> bytes:
    """The bytes of unpadded URL-safe base64; Base64Error for anything else."""
    # validate=True: the lenient default silently skips stray characters, which would let two different
    # strings stand for the same bytes.
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise Base64Error("bad base64") from None


# ------------------------------------------------------------------------------------------- codec


def check_key_length(key: bytes) -> None:
    if len(key) < KEY_BYTES:
        raise ValueError(f"credential key must be at least {KEY_BYTES} bytes, got {len(key)}")


def _signature(key: bytes, signed_text: str) -> str:
    return b64encode(hmac.new(key, signed_text.encode("ascii"), hashlib.sha256).digest())


def encode_token(key: bytes, tag: str, claims: Mapping[str, object]) -> str:
    """``<tag>.<claims>.<signature>`` for ``claims`` (JSON-serialisable), signed with ``key``."""
    encoded_claims = b64encode(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    signed_text = f"{tag}.{encoded_claims}"
    return f"{signed_text}.{_signature(key, signed_text)}"


def split_token(token: str, token_format: TokenFormat) -> SignedToken:
    """The parts of a token whose outer shape and tag are right; ``token_format.error`` otherwise."""
    error, noun = token_format.error, token_format.noun
    if not isinstance(token, str) or not token or len(token) > token_format.max_chars or not token.isascii():
        raise error(f"malformed {noun}")
    parts = (token.strip() if token_format.strips_whitespace else token).split(".")
    if len(parts) != 3:
        raise error(f"malformed {noun}: expected {token_format.shape}")
    tag, encoded_claims, signature = parts
    if tag != token_format.tag:
        raise error(f"unsupported {noun} version {tag[:16]!r}")
    return SignedToken(f"{tag}.{encoded_claims}", encoded_claims, signature)


def signature_matches(key: bytes, token: SignedToken) -> bool:
    """Whether ``token`` was signed with ``key``, compared in constant time."""
    # Compare the canonical text of the signature, not decoded bytes: base64 has spare bits, and a token
    # with an altered signature string should not verify even when it decodes to the same bytes.
    expected = _signature(key, token.signed_text).encode("ascii")
    return hmac.compare_digest(token.signature.encode("ascii", "replace"), expected)


def decode_claims(encoded_claims: str) -> object:
    """The JSON value in a token's claims field: Base64Error if it is not base64, ValueError (a
    UnicodeDecodeError or JSONDecodeError) if the bytes are not UTF-8 JSON. Checking the value's fields
    is for each kind of token."""
    return json.loads(b64decode(encoded_claims).decode("utf-8"))


# --------------------------------------------------------------------------------------------- key


def _read_key(path: Path) -> bytes:
    """The key at ``path``, refusing a file anyone but its owner can read: ssh's rule for private keys."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as key_file:
        info = os.fstat(key_file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise AuthError(f"key file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            # Someone else's key (planted in a directory they made first) would let them forge credentials.
            raise AuthError(
                f"key file {path} belongs to uid {info.st_uid}, not to this daemon's user (uid {os.geteuid()}): "
                "refusing it (remove it and restart to make a new key)"
            )
        if info.st_mode & 0o077:
            raise AuthError(
                f"key file {path} is readable by others (mode {info.st_mode & 0o777:04o}); want 0600"
            )
        key = key_file.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise AuthError(f"key file {path} holds {len(key)} bytes, expected {KEY_BYTES}")
    return key


def load_or_create_key(path: Path) -> bytes:
    """The signing key at ``path``; on first use, 32 random bytes written there with mode 0600.

    The new key is written to a private temporary file and hard-linked into place, so the key file
    appears complete or not at all, and two controllers starting at once agree on one key (the loser of
    the race gets EEXIST and reads the winner's) instead of one silently replacing the other's.
    """
    path = Path(path)
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise AuthError(f"cannot read key file {path}: {error.strerror}") from None

    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    key = os.urandom(KEY_BYTES)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask can only narrow the mode, but be explicit
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, path)
        except FileExistsError:
            return _read_key(path)
        finally:
            os.unlink(temporary)
        directory_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory_fd)  # a key lost in a crash would void every credential issued with it
        finally:
            os.close(directory_fd)
    except OSError as error:
        raise AuthError(f"cannot create key file {path}: {error.strerror}") from None
    return key
