"""Helpers for tests that start the daemons as processes: the $NOTIFY_SOCKET receiver."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path


class NotifySocket:
    """The receiving end of $NOTIFY_SOCKET, as systemd has it: a bound AF_UNIX datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []

    def close(self) -> None:
        self.sock.close()

    def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float) -> dict[str, str]:
        """The first message (already received or arriving within ``timeout``) that satisfies predicate."""
        for message in self.messages:
            if predicate(message):
                return message
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no such notification within {timeout}s; got {self.messages}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            message = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(message)
            if predicate(message):
                return message
