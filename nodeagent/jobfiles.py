"""Reading a file that a job controls, as the root agent, without trusting it.

The ranks write into their attempt's user directory (torch's error files, the checkpoint mark). Anything
there may be a symlink to a root-only file, a hard link to one, a FIFO that blocks whoever opens it, or a
file growing without end. So the agent opens such a path without following a final symlink and without
blocking (O_NOFOLLOW | O_NONBLOCK), then, on the open descriptor, accepts only a regular file owned by the
job's user, and reads a bounded number of bytes. The directory itself belongs to root (its parent), so the
job cannot swap the directory for a link either. Callers run this off the event loop.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


def read_job_file(path: Path, owner_uid: int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``path`` if it is a regular file owned by ``owner_uid``; None otherwise
    (missing, a symlink, a FIFO, a device, a directory, another user's file: a root file hard-linked there)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:  # ELOOP for a symlink, ENOENT, EACCES, ENXIO for a socket...
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner_uid:
            return None
        chunks: list[bytes] = []
        remaining = limit
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def owner_of_directory(path: Path) -> int | None:
    """The uid owning ``path`` if it is a real directory (not a link to one), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_uid if stat.S_ISDIR(info.st_mode) else None
