"""Whether this node can run jobs safely as far as its agent can tell: today, whether its state directory can
be written.

Everything an attempt needs on the node goes through the agent's state directory: the job directory and its
launch file, the supervisor's status, and the node lease file that the supervisors read to know they may go
on (nodeagent/lease.py). When that file system is full (ENOSPC, EDQUOT), read-only (EROFS) or failing (EIO),
no launch can succeed and the lease cannot be renewed. Left alone, the controller would keep sending the node
jobs that fail at launch, each counted against the job (a node that swallows jobs), and the link would die
on the first lease grant it could not record. Instead the agent keeps its link, says what is wrong in every
heartbeat (``Heartbeat.node_fault``), and the controller drains the node until the heartbeats stop saying it
(controller/reconcile.py ``node_fault``), as slurmd's node is drained when it cannot launch.

A fault is noticed where a write fails, and cleared by a probe: while faulted, each heartbeat tries to write
and remove a small file in the state directory, and the first that succeeds clears it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path

log = logging.getLogger("garrison.agent")

# What a write to a file system that cannot take it fails with; any other error is the operation's own.
FILE_SYSTEM_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
PROBE_FILE = ".health-probe"


class StateDirHealth:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.fault = ""  # "" while nothing is wrong: what a heartbeat says

    def record(self, error: BaseException, doing: str) -> bool:
        """Note ``error`` (raised while ``doing``) if it is the state directory's file system failing; returns
        whether it was (the caller then carries on instead of treating it as its own failure)."""
        if not isinstance(error, OSError) or error.errno not in FILE_SYSTEM_FAULTS:
            return False
        # A write to an open file (os.write) names no file: the agent's own writes are to its state directory.
        where = os.path.abspath(error.filename) if isinstance(error.filename, str) else str(self.state_dir)
        if not any(where == root or where.startswith(root + os.sep)
                   for root in (str(self.state_dir), str(self.state_dir.resolve()))):
            return False  # a file elsewhere (a job's output, a cgroup): not the agent's own disk
        fault = f"cannot write its state directory {self.state_dir} ({doing}): {os.strerror(error.errno)}"
        if fault != self.fault:
            log.error("%s: the node is drained until it can", fault)
        self.fault = fault
        return True

    def probe(self) -> None:
        """While faulted, try a write where the fault was; clear the fault if it succeeds."""
        if not self.fault:
            return
        path = self.state_dir / PROBE_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"probe\n" * 64)  # a block's worth: an empty file would need no space
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError as error:
            if error.errno in FILE_SYSTEM_FAULTS:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                return
            raise
        log.warning("state directory %s can be written again: the fault is cleared (%s)", self.state_dir,
                    self.fault)
        self.fault = ""
