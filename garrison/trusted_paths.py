"""May a daemon trust this path? Its state directory, keys, database and sockets must be its own.

A root daemon that accepts a directory another user created first (``garrison up --state-dir /tmp/x``,
where x was made by a local user) accepts whatever that user put in it: a key file of theirs lets them
forge any credential, root's included. So every path a daemon keeps its secrets or its state in is
checked at start: it is a real directory or file (not a symlink), owned by the daemon's user (or root), and
nobody else may write to it, nor rename it away (its parent is not writable by others, unless sticky like
/tmp). A path that fails is refused with one line saying what is wrong and how to fix it; a missing
directory is created, private, by the daemon itself.

Standard library only: the controller, the agent and `garrison up` all use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["UntrustedPath", "check_trusted_dir", "check_trusted_file", "ensure_trusted_dir", "trusted_owners"]


class UntrustedPath(Exception):
    """A path a daemon would trust is not the daemon's own; the message is one line for the operator."""


def trusted_owners() -> frozenset[int]:
    """Who may own what this process trusts: itself, and root (who can do anything anyway)."""
    return frozenset({os.geteuid(), 0})


def _describe_owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check(path: Path, info: os.stat_result, what: str) -> None:
    if info.st_uid not in trusted_owners():
        raise UntrustedPath(
            f"{what} {path} belongs to {_describe_owner(info.st_uid)}, not to this daemon's user "
            f"({_describe_owner(os.geteuid())}) or root: refusing to trust it (remove it, or choose another path)"
        )
    if info.st_mode & 0o022:
        raise UntrustedPath(
            f"{what} {path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}): refusing to trust it "
            f"(chmod go-w {path})"
        )


def _check_parent(path: Path, what: str) -> None:
    """Others must not be able to rename ``path`` away and put their own in its place."""
    parent = path.absolute().parent
    try:
        info = os.stat(parent)
    except OSError as error:
        raise UntrustedPath(f"cannot check the directory of {what} {path}: {error.strerror}") from None
    if info.st_uid not in trusted_owners():
        raise UntrustedPath(
            f"{what} {path} is in {parent}, which belongs to {_describe_owner(info.st_uid)}: they could replace "
            "it; choose another place"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UntrustedPath(
            f"{what} {path} is in {parent}, which others may write to (mode {stat.S_IMODE(info.st_mode):04o}, "
            "not sticky): they could replace it; choose another place"
        )


def check_trusted_dir(path: Path, what: str = "directory") -> None:
    """Refuse ``path`` unless it is a real directory that only this daemon's user (or root) may change."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except OSError as error:
        raise UntrustedPath(f"cannot check {what} {path}: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedPath(f"{what} {path} is a symbolic link: give its real path")
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedPath(f"{what} {path} is not a directory")
    _check(path, info, what)
    _check_parent(path, what)


def check_trusted_file(path: Path, what: str = "file") -> None:
    """Refuse ``path`` if it exists and is not a regular file only this daemon's user (or root) may change.
    A missing file passes: the daemon creates it (in a directory checked with check_trusted_dir)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise UntrustedPath(f"cannot check {what} {path}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISSOCK(info.st_mode):
        raise UntrustedPath(f"{what} {path} is not a regular file")
    _check(path, info, what)


def ensure_trusted_dir(path: Path, what: str = "directory", mode: int = 0o700) -> None:
    """``path`` as a directory this daemon may trust: created with ``mode`` (and missing parents) if absent,
    else checked (check_trusted_dir) — never silently reused when it is someone else's."""
    path = Path(path)
    if not os.path.lexists(path):
        missing = []
        ancestor = path.absolute()
        while not os.path.lexists(ancestor):
            missing.append(ancestor)
            ancestor = ancestor.parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory, mode)
            except FileExistsError:
                pass  # created meanwhile: checked below like any existing one
            except OSError as error:
                raise UntrustedPath(f"cannot create {what} {directory}: {error.strerror}") from None
    check_trusted_dir(path, what)
