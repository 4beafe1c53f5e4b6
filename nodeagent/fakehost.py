"""A fake node's own host name: on a local cluster (fake_topology) every agent runs on one host, so a job's
``hostname`` would name that host, not its node. Scripts written for Slurm build their rendezvous from it
(``RDZV_HOST=$(hostname)``) and torchrun decides from it which node hosts the c10d store (it hosts the store
where the endpoint names this host), so each fake node's agent gives itself, and everything it starts, a UTS
namespace named after the node. It needs root (CAP_SYS_ADMIN); without, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import socket

CLONE_NEWUTS = 0x04000000


def take_node_name(node_name: str) -> bool:
    """Give this process (and what it starts later) a UTS namespace whose host name is ``node_name``. Call it
    before any thread starts: a namespace is per thread, inherited by the threads and children made after.
    True when done; False where the process may not (not root) or the kernel refuses."""
    if os.geteuid() != 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0:
        return False
    try:
        socket.sethostname(node_name)
    except OSError:
        return False
    return True
