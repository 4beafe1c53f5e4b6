"""Who listens on this loopback port? Checked before a credential is sent over plain text.

On loopback without TLS (``garrison up``) nothing proves who answers: a local user who binds the
controller's port while the controller is down (or restarting) receives every credential the CLI and the
agents send, and may replay it while it lasts. So before sending one, the sender asks the kernel who owns
the socket listening on that port (sock_diag, else ``/proc/net/tcp`` and ``tcp6``: each socket's uid) and sends
nothing unless that is root or its own user: the same rule as for the controller's Unix socket (its
peer's SO_PEERCRED). A port on which nobody listens is refused too, so that no one can take it between
this look and the connection: while the controller listens, no other user can bind it (Linux shares a
port with SO_REUSEPORT only between sockets of one uid).

Standard library only (the CLI imports it on every authenticated call over TCP).
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["NobodyListens", "UntrustedListener", "check_loopback_listener", "listener_uids"]

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"


class UntrustedListener(Exception):
    """The port is not served by root or by this process's user; the message says who serves it."""


class NobodyListens(UntrustedListener):
    """Nothing listens on the port (the controller is down): as unreachable as a refused connection."""


def listener_uids(port: int) -> set[int]:
    """The uids owning a listening TCP socket on ``port``, on any address of this network namespace: from
    the kernel's sock_diag netlink interface (listening sockets only: fast), else from /proc/net/tcp*
    (which walks every connection of the host: ~50 ms on a big one)."""
    try:
        return _listener_uids_netlink(port)
    except OSError:
        return _listener_uids_proc(port)


_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_DIAG_MSG_UID = struct.Struct("=I")  # inet_diag_msg.idiag_uid, at byte 64 of the message


def _listener_uids_netlink(port: int) -> set[int]:
    uids: set[int] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(2.0)
        for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            # struct inet_diag_req_v2: family, IPPROTO_TCP, no extensions, pad, states; a zero socket id.
            request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN) + bytes(48)
            diag.send(_HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP,
                                   sequence, 0) + request)
            done = False
            while not done:
                data = diag.recv(65536)
                offset = 0
                while offset + _HEADER.size <= len(data):
                    length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                    if length < _HEADER.size:
                        raise OSError("malformed sock_diag answer")
                    body = offset + _HEADER.size
                    if kind == _NLMSG_DONE:
                        done = True
                        break
                    if kind == _NLMSG_ERROR:
                        raise OSError("sock_diag refused the request")
                    if length >= _HEADER.size + 68:
                        source_port = int.from_bytes(data[body + 4 : body + 6], "big")
                        if source_port == port:
                            uids.add(_DIAG_MSG_UID.unpack_from(data, body + 64)[0])
                    offset += (length + 3) & ~3
    return uids


def _listener_uids_proc(port: int, tables: tuple[str, ...] = _TABLES) -> set[int]:
    uids: set[int] = set()
    for table in tables:
        try:
            with open(table, encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != _LISTEN:
                        continue
                    _, _, port_hex = fields[1].rpartition(":")
                    if int(port_hex, 16) == port:
                        uids.add(int(fields[7]))
        except FileNotFoundError:
            continue  # no IPv6 here
    return uids


def _port_of(address: str) -> int:
    _, _, port = address.rpartition(":")
    return int(port)


def check_loopback_listener(address: str, what: str = "a credential") -> None:
    """Raise UntrustedListener unless every listener on ``address``'s port is root's or ours (and there is
    one). ``what`` names what would have been sent, for the message."""
    try:
        port = _port_of(address)
    except ValueError:
        raise UntrustedListener(f"not sending {what} to {address}: no port in the address") from None
    trusted = {0, os.geteuid()}
    owners = listener_uids(port)
    if not owners:
        raise NobodyListens(f"not sending {what} to {address}: nothing listens there (is the controller up?)")
    strangers = sorted(owners - trusted)
    if strangers:
        raise UntrustedListener(
            f"not sending {what} to {address}: port {port} is held by uid {strangers[0]}, not by root or "
            "you (the controller down and someone else listening in its place?)"
        )
