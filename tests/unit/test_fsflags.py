"""The top-of-hierarchy hint on the agent's jobs directory (nodeagent/fsflags.py), on the real filesystem."""

from __future__ import annotations

import array
import fcntl
import os
from pathlib import Path

import pytest

from garrison.nodeagent.fsflags import FS_IOC_GETFLAGS, FS_TOPDIR_FL, mark_top_of_hierarchy
from garrison.nodeagent.jobs import JobManager


def flags_of(directory: Path) -> int | None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        return flags[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def test_the_flag_is_set_where_the_filesystem_has_it_and_nothing_fails_where_not(tmp_path: Path) -> None:
    before = flags_of(tmp_path)
    marked = mark_top_of_hierarchy(tmp_path)
    after = flags_of(tmp_path)
    if marked:
        assert after is not None and after & FS_TOPDIR_FL
        assert before is not None and after == before | FS_TOPDIR_FL  # nothing else changed
        assert mark_top_of_hierarchy(tmp_path)  # again: already set
    else:
        assert after == before  # refused: left as it was
    assert not mark_top_of_hierarchy(tmp_path / "missing")


def test_tmpfs_refuses_it_quietly() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    directory = shm / f"garrison-fsflags-{os.getpid()}"
    directory.mkdir()
    try:
        assert mark_top_of_hierarchy(directory) is (bool((flags_of(directory) or 0) & FS_TOPDIR_FL))
    finally:
        directory.rmdir()


def test_the_agents_jobs_directory_is_marked(tmp_path: Path) -> None:
    if not mark_top_of_hierarchy(tmp_path):
        pytest.skip("this filesystem has no top-of-hierarchy flag")
    manager = JobManager(tmp_path / "state", notify_socket=str(tmp_path / "notify.sock"), allow_root_jobs=True)
    flags = flags_of(manager.jobs_dir)
    assert flags is not None and flags & FS_TOPDIR_FL
