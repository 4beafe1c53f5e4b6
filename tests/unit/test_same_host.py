"""controller/rpc/same_host.py, and GetUsage's rule: what unauthenticated or non-admin callers are told."""

from __future__ import annotations

import pytest

from garrison.controller.engine import PermissionDenied
from garrison.controller.rpc.accounting import usage_request_for
from garrison.controller.rpc.same_host import is_same_host_peer
from garrison.model.domain import Principal
from garrison.protos.v1 import accounting_pb2 as apb


def test_loopback_and_this_hosts_addresses_are_the_same_host_others_are_not() -> None:
    assert is_same_host_peer("ipv4:127.0.0.1:40000")
    assert is_same_host_peer("ipv4:127.0.1.5:40000")
    assert is_same_host_peer("ipv6:[::1]:40000")
    assert is_same_host_peer("unix:/run/garrison/controller.sock")
    assert not is_same_host_peer("ipv4:192.0.2.7:40000")  # TEST-NET-1: nobody's own address
    assert not is_same_host_peer("ipv6:[2001:db8::1]:40000")
    assert not is_same_host_peer("garbage")


def test_a_user_sees_only_their_own_usage_and_an_admin_everyones() -> None:
    mallory = Principal("mallory", 1002, 1002, (1002,))
    asked = apb.UsageRequest(start_time=0.0, end_time=1.0, accounts=["research"])
    assert list(usage_request_for(mallory, asked, is_admin=False).users) == ["mallory"]
    assert list(usage_request_for(mallory, asked, is_admin=False).accounts) == ["research"]
    with pytest.raises(PermissionDenied, match="the usage of alice is shown to admins only"):
        usage_request_for(mallory, apb.UsageRequest(start_time=0.0, end_time=1.0, users=["alice"]), is_admin=False)
    everyone = apb.UsageRequest(start_time=0.0, end_time=1.0)
    assert list(usage_request_for(mallory, everyone, is_admin=True).users) == []
