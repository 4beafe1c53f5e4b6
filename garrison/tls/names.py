"""Which names the cluster's certificates carry, and which addresses may be reached in plain text.

One private CA per cluster signs the controller's certificate, whose subject alternative names include
the fixed name ``garrison-controller`` that every client and agent checks (whatever address it dialled),
and one certificate per node agent, named by the node, organisational unit ``agent``.
"""

from __future__ import annotations

import ipaddress
import re

from garrison.tls.errors import TlsError

CONTROLLER_TLS_NAME = "garrison-controller"
ORGANISATION = "garrison"
AGENT_UNIT = "agent"
CONTROLLER_UNIT = "controller"
# Node names end up in certificates, file names and log lines: keep them to host-name characters.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` names a loopback host, the only place plain text is allowed."""
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_node_name(name: str) -> str:
    if not NODE_NAME.match(name):
        raise TlsError(f"invalid node name {name[:80]!r}: 1-63 letters, digits, '.', '_' or '-'")
    if name == CONTROLLER_TLS_NAME:
        raise TlsError(f"{CONTROLLER_TLS_NAME!r} is reserved for the controller's certificate")
    return name
