"""How certificate and key files are read and written: PEM only, private keys 0600, written atomically and
never through a link."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from garrison.tls.errors import TlsError

MAX_PEM_BYTES = 64 * 1024


def read_pem(path: str | os.PathLike[str], what: str, *, private: bool = False) -> bytes:
    """The bytes of a PEM file, refusing a private key that others can read (as ssh does)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise TlsError(f"cannot read {what} {os.fspath(path)}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as pem_file:
        info = os.fstat(pem_file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TlsError(f"{what} {os.fspath(path)} is not a regular file")
        if private and info.st_mode & 0o077:
            raise TlsError(
                f"{what} {os.fspath(path)} is readable by others (mode {info.st_mode & 0o777:04o}); want 0600"
            )
        data = pem_file.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise TlsError(f"{what} {os.fspath(path)} is not a PEM file")
    return data


def write_file(path: Path, data: bytes, mode: int, *, overwrite: bool = False) -> None:
    """Write ``data`` to ``path`` with ``mode``, atomically (temporary file + rename), never through a link."""
    path = Path(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise TlsError(f"{path} already exists; remove it first or pick another directory")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed it; never widened
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise TlsError(f"cannot write {path}: {error.strerror}") from None
