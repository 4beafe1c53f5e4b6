"""Filesystem hints for the directories the agent churns through.

Every attempt gets a directory under jobs/ with a handful of files, and loses it when the controller has its
result: hundreds of inodes created and freed a second on a busy node. ext4 places a new directory near its
parent's block group, and its files in the directory's group, so they all land in one group; and ext4
without a journal will not reuse an inode freed in the last ~30 s (``recently_deleted``), so every new inode
there scans past all the recently freed ones first. `perf record -a` on one of this project's machines (ext4,
no journal), on a cluster that had run a few thousand one-GPU jobs, put 20% of the whole machine's CPU in that
scan (``find_inode_bit``), under the open() and mkdir() of job files.

The "top of directory hierarchy" flag (``chattr +T``, FS_TOPDIR_FL) tells ext4's Orlov allocator that the
directories created in this one are unrelated trees, to be spread over the block groups as it spreads the
root's: each attempt's inodes then meet only the few freed near them. It is a hint (ext2/3/4 read it; other
filesystems refuse it or ignore it), so failing to set it changes nothing but speed.
"""

from __future__ import annotations

import array
import fcntl
import os
from pathlib import Path

FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long)
FS_IOC_SETFLAGS = 0x40086602  # _IOW('f', 2, long)
FS_TOPDIR_FL = 0x00020000


def mark_top_of_hierarchy(directory: Path) -> bool:
    """Set FS_TOPDIR_FL on ``directory``; True if it is set now, False where the filesystem has no such flag
    (or refuses it)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        if flags[0] & FS_TOPDIR_FL:
            return True
        flags[0] |= FS_TOPDIR_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        return bool(flags[0] & FS_TOPDIR_FL)
    except OSError:  # ENOTTY/EOPNOTSUPP: no such flag here (tmpfs, NFS, ...)
        return False
    finally:
        os.close(fd)
