"""Which MASTER_PORT does an attempt's gang rendezvous on?

It used to be a fixed function of the job id and the attempt number, so any user could compute the port
of someone else's next job and bind it first (the launch failed, and was retried at once, forever). Now:

- **Unpredictable**: an HMAC of (job, attempt) under a secret derived from the controller's key, which no
  user can read. The same attempt always gets the same port, after a controller restart too (a launch is
  resent to nodes that missed it, and every node of the gang must agree).
- **Outside the ephemeral range**: ``controller.rendezvous_ports`` (default 20000-32767, below Linux's
  default ip_local_port_range of 32768-60999, where the kernel picks ports for outgoing connections and
  caused failed launches). The controller warns at start if its own host's range overlaps.
- **No collision on one node**: two live attempts with the same head node never share a port (the next
  HMAC candidate is taken). Another cluster on the same host uses another key, hence other ports; a
  collision with it, or with any other process, fails that launch on the head node's port check, and the
  attempt after it gets another port (failed launches back off and are capped: controller/lifecycle.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Collection
from pathlib import Path

log = logging.getLogger("garrison.controller")

DEFAULT_RANGE = (20000, 32767)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_secret(key: bytes) -> bytes:
    """The ports' secret, derived from the controller's signing key (one key per cluster, kept across
    restarts), so that it never needs a file of its own and is never the key itself."""
    return hmac.new(key, b"garrison rendezvous ports v1", hashlib.sha256).digest()


class RendezvousPorts:
    def __init__(self, secret: bytes, port_range: tuple[int, int] = DEFAULT_RANGE) -> None:
        low, high = port_range
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"rendezvous port range {low}-{high} is not within 1024-65535")
        self.secret = secret
        self.low = low
        self.size = high - low + 1

    def candidate(self, job_id: int, attempt: int, index: int) -> int:
        digest = hmac.new(self.secret, f"{job_id}.{attempt}.{index}".encode(), hashlib.sha256).digest()
        return self.low + int.from_bytes(digest[:8], "big") % self.size

    def port_for(self, job_id: int, attempt: int, taken: Collection[int] = ()) -> int:
        """The attempt's port: its first candidate that ``taken`` (the ports of the other live attempts on
        its head node) does not hold. With every port of the range taken, the first candidate (its launch
        will then fail the port check and be retried later)."""
        for index in range(min(self.size, 64)):
            port = self.candidate(job_id, attempt, index)
            if port not in taken:
                return port
        return self.candidate(job_id, attempt, 0)


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def warn_if_ephemeral(port_range: tuple[int, int], ephemeral: tuple[int, int] | None) -> str | None:
    """A warning when the configured range overlaps this host's ephemeral ports (nodes are usually set up
    alike), else None."""
    if ephemeral is None:
        return None
    low, high = port_range
    if low <= ephemeral[1] and ephemeral[0] <= high:
        return (f"controller.rendezvous_ports {low}-{high} overlaps this host's ephemeral ports "
                f"{ephemeral[0]}-{ephemeral[1]} (net.ipv4.ip_local_port_range): launches may fail on ports the "
                "kernel gave to outgoing connections; choose a range outside it")
    return None
