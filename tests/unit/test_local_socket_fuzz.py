"""Hostile input on the controller's local Unix socket (controller/rpc/local.py), the CLI's transport on the
controller host: garbage frames, bad lengths, unknown methods, undecodable and hypothesis-made requests.
The real controller answers each with a clear refusal or a valid response, never INTERNAL, and stays up."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_helpers import running_controller
from test_rpc_fuzz import messages

from garrison.controller.rpc.local import MAX_FRAME, REQUEST_TYPES
from garrison.plainmsg import PLAIN_METHOD_SUFFIX, dump_plain, parse_plain
from garrison.protos.v1 import accounting_pb2 as apb
from garrison.protos.v1 import admin_pb2 as adminpb
from garrison.protos.v1 import garrison_pb2 as pb

HEADER = struct.Struct("!I")
OK, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNIMPLEMENTED, UNAUTHENTICATED = 0, 3, 5, 7, 12, 16
CLEAR = {INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, UNIMPLEMENTED, UNAUTHENTICATED, 8}  # 8: rate limit
METHODS = sorted(REQUEST_TYPES)
RESPONSE_TYPES = {"Hello": pb.HelloResponse, "SubmitJob": pb.SubmitJobResponse, "CancelJobs": pb.CancelJobsResponse,
                  "SubmitCommandLine": pb.SubmitCommandLineResponse, "QueueDetails": adminpb.QueueDetailsResponse,
                  "ListJobs": pb.ListJobsResponse, "GetJob": pb.JobInfo, "ListNodes": pb.ListNodesResponse,
                  "KeepAllocation": pb.AllocationStatusReply, "ReleaseAllocation": pb.ReleaseAllocationReply,
                  "ListSteps": pb.ListStepsResponse, "CancelStep": pb.CancelStepResponse,
                  "ListJobRecords": apb.JobRecordsResponse}


@pytest.fixture(scope="module")
def socket_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, object]]:
    root = tmp_path_factory.mktemp("localfuzz")
    with running_controller(root, extra="request_rate_per_s = 0\n", local_socket=True) as controller:
        yield root / "controller.sock", controller


def exchange(path: Path, raw: bytes) -> bytes | None:
    """Send raw bytes; return the answer frame, or None when the controller closed the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        return None
    (length,) = HEADER.unpack(data[: HEADER.size])
    frame = data[HEADER.size : HEADER.size + length]
    assert len(frame) == length, "a truncated answer"
    return frame


def framed(method: str, payload: bytes) -> bytes:
    name = method.encode()[:255]
    body = bytes([len(name)]) + name + payload
    return HEADER.pack(len(body)) + body


def check(frame: bytes | None, method: str) -> None:
    if frame is None:
        return  # refusing to parse a broken frame by closing is a clear answer for a raw socket
    status, body = frame[0], frame[1:]
    if status == OK:
        assert method in REQUEST_TYPES
        return
    assert status in CLEAR, f"{method}: status {status}: {body[:200]!r}"
    text = body.decode()
    assert text and "\n" not in text and len(text) <= 1000, f"{method}: unclear: {text!r}"


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300))
def test_garbage_bytes(socket_path: tuple[Path, object], raw: bytes) -> None:
    path, _ = socket_path
    frame = exchange(path, raw)
    if frame is not None:
        assert frame[0] in CLEAR | {OK}


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_framed_requests(socket_path: tuple[Path, object], data: st.DataObject) -> None:
    path, _ = socket_path
    method = data.draw(st.one_of(st.sampled_from(METHODS), st.text(max_size=30)), label="method")
    if method in REQUEST_TYPES and data.draw(st.booleans(), label="well-formed"):
        payload = data.draw(messages(REQUEST_TYPES[method].DESCRIPTOR), label="message").SerializeToString()
    else:
        payload = data.draw(st.binary(max_size=200), label="payload")
    check(exchange(path, framed(method, payload)), method)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_plain_json_requests(socket_path: tuple[Path, object], data: st.DataObject) -> None:
    """The "+json" methods gsub and gqueue use: valid plain messages, JSON of the wrong shape, and junk."""
    path, _ = socket_path
    method = data.draw(st.sampled_from(METHODS), label="method")
    payload = data.draw(
        st.one_of(
            messages(REQUEST_TYPES[method].DESCRIPTOR).map(dump_plain),
            st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
                         max_leaves=8).map(lambda value: json.dumps(value).encode()),
            st.binary(max_size=100),
        ),
        label="payload",
    )
    frame = exchange(path, framed(method + PLAIN_METHOD_SUFFIX, payload))
    check(frame, method)
    if frame is not None and frame[0] == OK:
        parse_plain(frame[1:], RESPONSE_TYPES[method])  # the answer is the response message, as plain JSON


def test_bad_lengths_close_the_connection(socket_path: tuple[Path, object]) -> None:
    path, _ = socket_path
    assert exchange(path, HEADER.pack(0)) is None
    assert exchange(path, HEADER.pack(MAX_FRAME + 1) + b"x" * 10) is None


def test_controller_survived_and_still_answers(socket_path: tuple[Path, object]) -> None:
    path, controller = socket_path
    assert controller.process.poll() is None  # type: ignore[attr-defined]
    frame = exchange(path, framed("ListNodes", pb.ListNodesRequest().SerializeToString()))
    assert frame is not None and frame[0] == OK
    pb.ListNodesResponse.FromString(frame[1:])
    log = controller.log_text()  # type: ignore[attr-defined]
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
