"""A real controller process for the security tests: its own config, SQLite store, loopback ports, and TLS
files when asked, started as ``python -m garrison.controller.main`` and stopped with SIGTERM.

Readiness is the controller answering Hello over gRPC (with TLS when configured), not a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from helpers.polling import WaitTimeout, wait_until
from helpers.ports import free_port

from garrison.auth import fetch_credential
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.tls import CHANNEL_OPTIONS, channel_credentials, init_ca, issue_agent

START_TIMEOUT_S = 60.0


def make_ca(directory: Path, nodes: tuple[str, ...] = ("node1",)) -> Path:
    """A cluster CA in ``directory`` with the controller's certificate and one certificate per node."""
    init_ca(directory, controller_names=["127.0.0.1", "localhost"])
    for node in nodes:
        issue_agent(directory, node)
    return directory


@dataclass
class ControllerProcess:
    root: Path
    config: Path
    address: str
    agent_address: str
    ca_dir: Path | None
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def credential_socket(self) -> str:
        return str(self.root / "auth.sock")

    @property
    def database(self) -> str:
        return f"sqlite:///{self.root / 'controller.db'}"

    def credential(self) -> str:
        return fetch_credential(self.credential_socket)

    def client_channel(self) -> grpc.Channel:
        if self.ca_dir is None:
            return grpc.insecure_channel(self.address)
        credentials = channel_credentials(str(self.ca_dir / "ca.crt"))
        return grpc.secure_channel(self.address, credentials, options=CHANNEL_OPTIONS)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def write_config(
    root: Path, *, tls_dir: Path | None, extra: str = "", local_socket: bool = False
) -> tuple[Path, str, str]:
    address = f"127.0.0.1:{free_port()}"
    agent_address = f"127.0.0.1:{free_port()}" if tls_dir is not None else ""
    lines = [
        "[controller]",
        f'address = "{address}"',
        f'database = "sqlite:///{root / "controller.db"}"',
        f'state_dir = "{root / "state"}"',
        f'credential_socket = "{root / "auth.sock"}"',
        f'local_socket = "{root / "controller.sock" if local_socket else ""}"',
        f'key_file = "{root / "state" / "credential.key"}"',
        "heartbeat_interval_s = 1.0",
        "heartbeat_timeout_s = 30.0",
        "allow_root_jobs = true",
    ]
    if tls_dir is not None:
        lines += [
            f'tls_cert = "{tls_dir / "controller.crt"}"',
            f'tls_key = "{tls_dir / "controller.key"}"',
            f'tls_ca = "{tls_dir / "ca.crt"}"',
            f'agent_address = "{agent_address}"',
        ]
    config = root / "garrison.toml"
    config.write_text("\n".join(lines) + "\n" + extra)
    return config, address, agent_address


@contextmanager
def running_controller(
    root: Path, *, tls_dir: Path | None = None, extra: str = "", reuse: ControllerProcess | None = None,
    local_socket: bool = False,
) -> Iterator[ControllerProcess]:
    """A controller on a new configuration in ``root``, or (``reuse``) on a stopped one's config and store."""
    root.mkdir(parents=True, exist_ok=True)
    if reuse is not None:
        config, address, agent_address, tls_dir = reuse.config, reuse.address, reuse.agent_address, reuse.ca_dir
    else:
        config, address, agent_address = write_config(root, tls_dir=tls_dir, extra=extra, local_socket=local_socket)
    log = root / "controller.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "garrison.controller.main", "--config", str(config)],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
    controller = ControllerProcess(root, config, address, agent_address, tls_dir, process, log)
    try:
        _wait_until_serving(controller)
        yield controller
    finally:
        controller.stop()


def _wait_until_serving(controller: ControllerProcess) -> None:
    with controller.client_channel() as channel:
        stub = pb_grpc.ControllerStub(channel)

        def answers_hello() -> bool:
            if controller.process.poll() is not None:
                raise RuntimeError(f"the controller exited {controller.process.returncode}:\n{controller.log_text()[-3000:]}")
            try:
                # wait_for_ready blocks until the port accepts, so this turns false only on real failures.
                stub.Hello(pb.HelloRequest(), timeout=1.0, wait_for_ready=True)
            except grpc.RpcError:
                return False
            return True

        try:
            wait_until(answers_hello, START_TIMEOUT_S, what="the controller to answer Hello")
        except WaitTimeout:
            raise RuntimeError(f"the controller did not serve:\n{controller.log_text()[-3000:]}") from None
