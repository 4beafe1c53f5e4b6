"""garrison/loopback_listener.py: who holds a loopback port, from the kernel's socket tables.
(Another user's listener being refused is tests/e2e/test_security_node.py, with a real second user.)"""

from __future__ import annotations

import os
import socket

import pytest

from garrison.loopback_listener import (
    NobodyListens,
    UntrustedListener,
    _listener_uids_netlink,
    _listener_uids_proc,
    check_loopback_listener,
    listener_uids,
)


def test_our_own_listener_is_found_and_trusted_on_ipv4_and_ipv6() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as listener:
            try:
                listener.bind((host, 0))
            except OSError:
                continue  # no IPv6 loopback here
            listener.listen()
            port = listener.getsockname()[1]
            assert listener_uids(port) == {os.geteuid()}
            # Both ways of asking the kernel agree: sock_diag (netlink) and the /proc tables.
            assert _listener_uids_netlink(port) == _listener_uids_proc(port) == {os.geteuid()}
            check_loopback_listener(f"{host}:{port}" if family == socket.AF_INET else f"[{host}]:{port}")


def test_a_port_nobody_listens_on_gets_nothing_sent() -> None:
    with socket.socket() as bound_only:
        bound_only.bind(("127.0.0.1", 0))  # bound, not listening: not a server
        port = bound_only.getsockname()[1]
        assert listener_uids(port) == set()
        with pytest.raises(NobodyListens, match=f"not sending a credential to 127.0.0.1:{port}: nothing listens"):
            check_loopback_listener(f"127.0.0.1:{port}")
    with pytest.raises(UntrustedListener, match="no port"):
        check_loopback_listener("localhost")
