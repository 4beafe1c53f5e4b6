"""What one local user may hold of the controller's local socket (issue 20), against a real controller
process on real Unix sockets: the attack was 40 unfinished 8 MiB frames growing the controller from 78 to
408 MB. Also: refusals are logged rate-limited (each rate-limited request used to log a line).
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_helpers import ControllerProcess, running_controller

from garrison.controller.rpc.local import MAX_FRAME

HEADER = struct.Struct("!I")
OK, RESOURCE_EXHAUSTED = 0, 8
MB = 1 << 20


def rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def framed(method: str, body: bytes) -> bytes:
    name = method.encode()
    frame = bytes([len(name)]) + name + body
    return HEADER.pack(len(frame)) + frame


def read_answer(sock: socket.socket) -> tuple[int, bytes] | None:
    """The next answer frame (status, payload), or None if the controller closed the connection."""
    data = b""
    while len(data) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(data))
        if not chunk:
            return None
        data += chunk
    (length,) = HEADER.unpack(data)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            return None
        body += chunk
    return body[0], body[1:]


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(path))
    return sock


def hello(path: Path) -> int:
    with connect(path) as sock:
        sock.sendall(framed("Hello+json", b"{}"))
        answer = read_answer(sock)
    assert answer is not None
    return answer[0]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    extra = "local_frame_timeout_s = 3.0\n"
    with running_controller(tmp_path / "c", extra=extra, local_socket=True) as process:
        yield process


def sock_path(controller: ControllerProcess) -> Path:
    return controller.root / "controller.sock"


class TestConnectionLimits:
    def test_forty_unfinished_8_mib_frames_do_not_grow_the_controller(self, tmp_path: Path) -> None:
        with running_controller(tmp_path / "c", local_socket=True) as controller:  # the default limits
            self.forty_unfinished_frames(controller)

    def forty_unfinished_frames(self, controller: ControllerProcess) -> None:
        path = sock_path(controller)
        assert hello(path) == OK
        baseline = rss_bytes(controller.process.pid)
        held: list[socket.socket] = []
        refused = 0
        try:
            for _ in range(40):
                sock = connect(path)
                held.append(sock)
                try:
                    # A frame's header for 8 MiB, then 7 MiB of it, never the rest.
                    sock.sendall(HEADER.pack(MAX_FRAME) + b"\x05Hello" + b"x" * (7 * MB))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused and closed before it took it all
            grown = rss_bytes(controller.process.pid) - baseline  # with the frames within the limits held
            for sock in held:
                sock.settimeout(0.5)
                try:
                    answer = read_answer(sock)
                except TimeoutError:
                    continue  # still held: one of the few within the limits
                except ConnectionResetError:
                    answer = None
                if answer is not None:
                    assert answer[0] == RESOURCE_EXHAUSTED, answer
                    assert b"(local_max_" in answer[1], answer
                refused += 1
        finally:
            for sock in held:
                sock.close()
        print(f"controller grew by {grown / MB:.0f} MiB; {refused} of 40 connections refused")
        # 16 MiB of frames per uid by default (two of these), 16 connections at most: not 40 x 8 MiB.
        assert grown < 100 * MB
        assert refused >= 40 - 16
        assert hello(path) == OK  # still serving, and the budget is back once they are gone

    def test_a_uid_holds_at_most_16_connections(self, controller: ControllerProcess) -> None:
        path = sock_path(controller)
        held = [connect(path) for _ in range(16)]
        try:
            for sock in held:  # each one served (this also makes sure the controller counted them all)
                sock.sendall(framed("Hello+json", b"{}"))
                answer = read_answer(sock)
                assert answer is not None and answer[0] == OK
            with connect(path) as extra:
                answer = read_answer(extra)
            assert answer is not None and answer[0] == RESOURCE_EXHAUSTED
            assert "too many connections from uid" in answer[1].decode()
            assert "\n" not in answer[1].decode()
        finally:
            for sock in held:
                sock.close()

    def test_a_frame_that_does_not_arrive_in_time_is_refused(self, controller: ControllerProcess) -> None:
        with connect(sock_path(controller)) as sock:
            sock.sendall(HEADER.pack(1000) + b"\x05Hello")
            answer = read_answer(sock)  # what the controller sends when the frame timeout passes
        assert answer is not None and answer[0] == RESOURCE_EXHAUSTED
        assert "did not arrive whole within 3s" in answer[1].decode()

    def test_refusals_of_the_local_socket_are_logged_rate_limited(self, controller: ControllerProcess) -> None:
        path = sock_path(controller)
        held = [connect(path) for _ in range(16)]
        try:
            for sock in held:
                sock.sendall(framed("Hello+json", b"{}"))
                assert read_answer(sock) is not None
            for _ in range(100):
                with connect(path) as extra:
                    answer = read_answer(extra)
                    assert answer is not None and answer[0] == RESOURCE_EXHAUSTED
        finally:
            for sock in held:
                sock.close()
        controller.stop()
        log = controller.log_text()
        lines = [line for line in log.splitlines() if "refused a local connection" in line]
        assert 1 <= len(lines) <= 20
        summary = re.search(r"(\d+) more refusals of RESOURCE_EXHAUSTED local socket uid \d+", log)
        assert summary is not None and int(summary.group(1)) == 100 - len(lines)


def test_rate_limited_requests_are_logged_rate_limited(tmp_path: Path) -> None:
    """One user past the request rate limit, 500 requests: at most 20 lines, and one that counts the rest."""
    extra = "request_rate_per_s = 0.01\nrequest_burst = 1\n"
    with running_controller(tmp_path / "c", extra=extra, local_socket=True) as controller:
        path = sock_path(controller)
        statuses = []
        with connect(path) as sock:
            for _ in range(500):
                sock.sendall(framed("ListJobs+json", b"{}"))
                answer = read_answer(sock)
                assert answer is not None
                statuses.append(answer[0])
        controller.stop()
        log = controller.log_text()
    assert statuses.count(RESOURCE_EXHAUSTED) >= 498
    lines = [line for line in log.splitlines() if "refused ListJobs" in line]
    assert 1 <= len(lines) <= 20
    summary = re.search(r"(\d+) more refusals of RESOURCE_EXHAUSTED from uid \d+", log)
    assert summary is not None
    assert int(summary.group(1)) + len(lines) == statuses.count(RESOURCE_EXHAUSTED)
