"""Reading a file that a job controls, as the root agent, without trusting it.

The ranks write into their attempt's user directory (torch's error files, the checkpoint mark). Anything
there may be a symlink to a root-only file, a hard link to one, a FIFO that blocks whoever opens it, or a
file growing without end. So the agent opens such a path without following a final symlink and without
blocking (O_NOFOLLOW | O_NONBLOCK), then, on the open descriptor, accepts only a regular file owned by the
job's user, and reads a bounded number of bytes. The directory itself belongs to root (its parent), so the
job cannot swap the directory for a link either. Callers run this off the event loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: str | os.PathLike[str]) -> None:
    """``rm -rf path`` for a directory the agent made (an attempt's or a step's), with the job's user's own
    directory in it: nothing a link names is touched, and nothing that cannot be removed stops it.

    shutil.rmtree does this for any tree, at the price of a lstat, an open, a fstat and a close for every
    directory in it, the top one included, and Python work per entry; these directories hold a handful of
    the agent's and the supervisor's files and one empty user directory, and removing them was the larger
    part of the agent's work after a job. So the entries are unlinked through a descriptor of the
    directory itself (opened without following a link, so it is the real one), a subdirectory is removed
    with rmdir when it is empty, and only a subdirectory with something in it (what a job left in its user
    directory: a link, a FIFO, another tree) goes to shutil.rmtree, which is safe against links and races
    inside a directory someone else can write to."""
    try:
        fd = os.open(path, _DIRECTORY_FLAGS)
    except FileNotFoundError:
        return
    except OSError:  # not a directory, or a link to one: shutil.rmtree refuses a link, as it should
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        for name in os.listdir(fd):
            try:
                os.unlink(name, dir_fd=fd)  # a link is removed itself, never followed
            except IsADirectoryError:
                try:
                    os.rmdir(name, dir_fd=fd)
                except OSError:  # not empty
                    shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
            except OSError:
                pass  # removed meanwhile, or not removable: the rmdir below falls back to rmtree
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError:
        with contextlib.suppress(OSError):
            shutil.rmtree(path, ignore_errors=True)
