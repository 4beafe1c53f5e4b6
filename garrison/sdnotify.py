"""systemd's readiness protocol (sd_notify) without libsystemd: one datagram to $NOTIFY_SOCKET.

The units are Type=notify: systemd counts a daemon as started only when it sends READY=1, so units ordered
after it, and `systemctl start`, wait until it really serves. Outside systemd (no NOTIFY_SOCKET) every call
here does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("garrison.sdnotify")


def notify(fields: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> bool:
    """Send ``KEY=value`` lines (READY, STATUS, STOPPING, ...); True if a notification socket took them."""
    address = environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.warning("ignoring NOTIFY_SOCKET %r: neither a path nor an abstract socket", address)
        return False
    # A newline inside a value would start a field of its own.
    message = "\n".join(f"{key}={value.replace(chr(10), ' ')}" for key, value in fields.items())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError as exc:
        # Never fatal: a daemon that cannot tell systemd it is ready still serves (systemd times it out).
        log.warning("cannot notify systemd at %s: %s", environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def ready(status: str) -> bool:
    return notify({"READY": "1", "STATUS": status})


def status(text: str) -> bool:
    return notify({"STATUS": text})


def stopping(status: str = "stopping") -> bool:
    return notify({"STOPPING": "1", "STATUS": status})
