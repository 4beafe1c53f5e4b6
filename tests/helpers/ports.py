"""Which loopback TCP port can a test give a daemon it starts?

One the kernel just handed out: bind port 0 on 127.0.0.1, read the port back and release it. Another
process could in principle take it before the daemon binds it; the window is the daemon's start-up, and
a daemon that fails to bind says so in its log.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
