"""The CLI client's per-address cache of the controller's endpoints (cli/client.py), against a real controller:
a warm call reads the cache instead of asking Hello; a cache written for another address, or a stale local
socket path, is never believed; the call still succeeds and the cache is rewritten."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_helpers import running_controller

from garrison.cli.client import CACHE_FORMAT, Client, CliError
from garrison.protos.v1 import garrison_pb2 as pb

HEADER = struct.Struct("!I")


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = tmp_path_factory.mktemp("cliclient")
    with running_controller(root, extra="request_rate_per_s = 0\n", local_socket=True) as process:
        yield process


def cache_files(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "garrison").glob("controller-*"))


def list_jobs(address: str) -> None:
    with Client(address) as client:
        response = client.call("ListJobs", pb.ListJobsRequest())
    assert isinstance(response, pb.ListJobsResponse)


def test_first_call_caches_the_endpoints_for_its_address(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    list_jobs(controller.address)
    (cache,) = cache_files(tmp_path)
    lines = cache.read_text().split("\n")
    assert lines[0] == CACHE_FORMAT
    assert lines[1] == controller.address
    assert lines[3] == str(controller.root / "controller.sock")


@pytest.fixture
def impostor(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket that answers every request with NOT_FOUND "impostor": a call that reaches it fails."""
    path = tmp_path / "impostor.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                answer = bytes([5]) + b"impostor"
                conn.sendall(HEADER.pack(len(answer)) + answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    server.close()


def test_a_cache_for_another_address_is_not_believed(controller, impostor, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    list_jobs(controller.address)
    (cache,) = cache_files(tmp_path)
    # The file this address reads, written for another address (two addresses whose safe names coincide)
    # whose local socket is the impostor: believing it would send the request there.
    cache.write_text("\n".join((CACHE_FORMAT, controller.address + "0", "", str(impostor))))
    list_jobs(controller.address)
    lines = cache.read_text().split("\n")
    assert lines[1] == controller.address
    assert lines[3] == str(controller.root / "controller.sock")


def test_the_cache_is_what_a_warm_call_uses(controller, impostor, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The other side of the test above: the same planted socket under the right address is used (so that
    test would fail if the address were not checked)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    list_jobs(controller.address)
    (cache,) = cache_files(tmp_path)
    cache.write_text("\n".join((CACHE_FORMAT, controller.address, "", str(impostor))))
    with pytest.raises(CliError, match="impostor"):
        list_jobs(controller.address)


def test_a_stale_local_socket_path_is_refreshed(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    list_jobs(controller.address)
    (cache,) = cache_files(tmp_path)
    lines = cache.read_text().split("\n")
    cache.write_text("\n".join((*lines[:3], str(tmp_path / "gone.sock"))))
    list_jobs(controller.address)
    assert cache.read_text().split("\n")[3] == str(controller.root / "controller.sock")


class InterruptedBetweenReads:
    """The client's local socket, with a signal handler that raises (galloc's Ctrl-C) landing once, just
    after the answer's header was read and before its body was."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.armed = True

    def recv(self, count: int) -> bytes:
        data = self.sock.recv(count)
        if self.armed and count == HEADER.size:
            self.armed = False
            raise KeyboardInterrupt
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_call_interrupted_mid_answer_leaves_the_next_call_its_own_answer(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """galloc cancels its request after Ctrl-C on the same client: the interrupted answer's unread body must
    not be taken for the cancel's answer (its bytes read as a length hung galloc for the call deadline)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with Client(controller.address) as client:
        client.call("ListJobs", pb.ListJobsRequest())
        assert client._local is not None  # the local socket is in use
        client._local = InterruptedBetweenReads(client._local)  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            client.call("ListJobs", pb.ListJobsRequest())
        response = client.call("ListJobs", pb.ListJobsRequest())
    assert isinstance(response, pb.ListJobsResponse)


@pytest.mark.parametrize("content", ["", "garbage", "garrison-controller-endpoints 0\na\nb\nc", "\n\n\n\n\n"])
def test_a_malformed_cache_is_ignored(controller, tmp_path, monkeypatch, content: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    list_jobs(controller.address)
    (cache,) = cache_files(tmp_path)
    cache.write_text(content)
    list_jobs(controller.address)
    assert cache.read_text().split("\n")[:2] == [CACHE_FORMAT, controller.address]


def test_plain_calls_agree_over_the_local_socket_and_grpc(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """gsub's and gqueue's protobuf-free calls (Client.call_plain) give the same answers on either transport."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = {"name": "plain", "command": ["true"], "gpus": 1, "workdir": str(tmp_path)}
    answers = {}
    for transport in ("local", "grpc"):
        monkeypatch.setenv("GARRISON_TRANSPORT", transport)
        with Client(controller.address) as client:
            submitted = client.call_plain("SubmitJob", {"spec": spec, "array_indices": [1, 2]})
            listed = client.call_plain("ListJobs", {"job_ids": [str(submitted.job_id)]})
        assert submitted.task_count == 2
        answers[transport] = [(job.display_id.split("_")[1], job.name, job.gpus, job.HasField("exit_code"))
                              for job in listed.jobs]
    assert answers["local"] == answers["grpc"] == [("1", "plain", 1, False), ("2", "plain", 1, False)]


def test_a_plain_request_the_controller_refuses_is_a_usage_error(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for transport in ("local", "grpc"):
        monkeypatch.setenv("GARRISON_TRANSPORT", transport)
        with Client(controller.address) as client, pytest.raises(CliError, match="frobnicate") as refused:
            client.call_plain("ListJobs", {"frobnicate": 1})
        assert refused.value.exit_code == 2


@pytest.mark.parametrize("argv", [["gsub", "-G", "1", "-o", "/dev/null", "--wrap", "true"], ["gqueue"], ["gqueue", "--json"]])
def test_gsub_and_gqueue_import_neither_protobuf_nor_click(controller, tmp_path, argv) -> None:  # type: ignore[no-untyped-def]
    """What keeps them under 100 ms a call (docs/performance.md): a real call on the local socket loads
    no protobuf, grpc, click or typing. (Nor pathlib, but the editable install's import hook loads that.)"""
    import subprocess
    import sys

    probe = (
        "import sys, atexit\n"
        "heavy = ('google', 'grpc', 'click', 'typing')\n"
        "atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in heavy),"
        " file=sys.stderr))\n"
        f"sys.argv = {argv!r}\n"
        f"from garrison.cli.{argv[0]} import main\n"
        "main()\n"
    )
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path), "GARRISON_CONTROLLER": controller.address}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    # The first call learns the local socket's path through Hello over gRPC; a warm call is what users time.
    proc = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "LOADED []", proc.stderr


def test_gqueue_into_a_pipe_closed_early_stops_quietly(controller, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`gqueue | head -1`: no traceback when the reader goes away (click's commands get this from click)."""
    import subprocess
    import sys

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with Client(controller.address) as client:  # no agents: they all stay pending, a long listing
        submitted = client.call_plain("SubmitJob", {"spec": {"name": "many", "command": ["true"], "gpus": 1, "workdir": str(tmp_path)},
                                        "array_indices": list(range(1, 2001))})
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path), "GARRISON_CONTROLLER": controller.address}
    for args in (["-r"], ["--json"]):  # -r: one row per task, a long listing
        with subprocess.Popen([sys.executable, "-m", "garrison.cli.gqueue", *args], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline()
            proc.stdout.close()
            stderr = proc.stderr.read().decode()
        assert proc.returncode == 1 and stderr == "", stderr
    with Client(controller.address) as client:
        client.call("CancelJobs", pb.CancelJobsRequest(job_ids=[str(submitted.job_id)]))  # for the next tests
