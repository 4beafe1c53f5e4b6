"""Is a gRPC peer on this host? Hello tells only such callers where the local sockets are (issue 20)."""

from __future__ import annotations

import ipaddress
import socket


def is_same_host_peer(peer: str) -> bool:
    """Whether a gRPC peer (``ipv4:10.0.0.5:41234``, ``ipv6:[::1]:41234``, ``unix:...``) is this host: a
    loopback address, or one of this host's own (binding to an address succeeds only on its own host)."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return True
    if kind not in ("ipv4", "ipv6"):
        return False
    host = rest.rpartition(":")[0].strip("[]")
    family = socket.AF_INET if kind == "ipv4" else socket.AF_INET6
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, ValueError):
        return False
    return True
