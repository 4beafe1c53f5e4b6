"""The Prometheus endpoint both daemons serve: prometheus-client's threaded HTTP server on one registry.

``GET /metrics`` (any path, in fact) answers the text exposition format, gzip-compressed when asked. The
server runs in threads of its own, so a scrape never waits for the daemon's event loop except where a
collector chooses to (the controller's cluster view is taken on its loop, see controller/metrics.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry


def split_address(address: str) -> tuple[str, int]:
    """("0.0.0.0", 9817) from "0.0.0.0:9817"; ("::", 9817) from "[::]:9817". ValueError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


@dataclass
class MetricsEndpoint:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the system chose when the address asked for port 0)."""
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(address: str, registry: CollectorRegistry) -> MetricsEndpoint:
    """Serve ``registry`` on ``address`` (HOST:PORT). OSError if the address cannot be bound."""
    host, port = split_address(address)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsEndpoint(server, thread)
