"""The cluster CA and mutual TLS: certificate files, and a real controller refusing agents and clients that
do not hold the right certificates (real gRPC over loopback TLS)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from security_helpers import make_ca, running_controller

from garrison.config import ConfigError, parse_config
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.tls import (
    CHANNEL_OPTIONS,
    TlsError,
    TlsFiles,
    channel_credentials,
    check_agent_transport,
    check_node_name,
    client_channel,
    describe,
    init_ca,
    is_loopback,
    issue_agent,
    read_pem,
    read_revoked,
    server_credentials,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------------------------------- files


def test_init_ca_writes_the_ca_and_controller_certificate_with_private_keys_0600(tmp_path: Path) -> None:
    written = init_ca(tmp_path / "ca", controller_names=["ctl.example", "10.0.0.1"])
    names = sorted(p.name for p in written)
    assert names == ["ca.crt", "ca.key", "controller.crt", "controller.key"]
    assert _mode(tmp_path / "ca" / "ca.key") == 0o600
    assert _mode(tmp_path / "ca" / "controller.key") == 0o600
    assert _mode(tmp_path / "ca" / "ca.crt") == 0o644
    ca = describe((tmp_path / "ca" / "ca.crt").read_bytes())
    assert ca.is_ca
    controller = describe((tmp_path / "ca" / "controller.crt").read_bytes())
    assert controller.unit == "controller" and not controller.is_ca
    # The fixed name every client checks, plus the host names given.
    assert controller.dns_names[:2] == ("garrison-controller", "ctl.example")


def test_init_ca_refuses_to_replace_an_existing_ca(tmp_path: Path) -> None:
    init_ca(tmp_path)
    key_before = (tmp_path / "ca.key").read_bytes()
    with pytest.raises(TlsError, match="already exists"):
        init_ca(tmp_path)
    assert (tmp_path / "ca.key").read_bytes() == key_before


def test_issue_agent_names_the_node_and_keeps_its_key_private(tmp_path: Path) -> None:
    init_ca(tmp_path)
    cert, key = issue_agent(tmp_path, "gpu-017")
    assert _mode(key) == 0o600
    info = describe(cert.read_bytes())
    assert (info.common_name, info.unit, info.dns_names) == ("gpu-017", "agent", ("gpu-017",))
    with pytest.raises(TlsError, match="already exists"):
        issue_agent(tmp_path, "gpu-017")
    issue_agent(tmp_path, "gpu-017", overwrite=True)  # renewal is explicit


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 64, "node/1", "garrison-controller", "n\n1"])
def test_node_names_that_cannot_be_certified(tmp_path: Path, name: str) -> None:
    with pytest.raises(TlsError):
        check_node_name(name)


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    init_ca(tmp_path)
    os.chmod(tmp_path / "controller.key", 0o644)
    with pytest.raises(TlsError, match="readable by others"):
        read_pem(tmp_path / "controller.key", "private key", private=True)
    with pytest.raises(TlsError, match="readable by others"):
        server_credentials(
            TlsFiles(str(tmp_path / "controller.crt"), str(tmp_path / "controller.key"), str(tmp_path / "ca.crt")),
            require_client_cert=True,
        )


def test_issuing_without_the_ca_key_fails_clearly(tmp_path: Path) -> None:
    init_ca(tmp_path)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(TlsError, match="cannot read CA key"):
        issue_agent(tmp_path, "node1")


# ------------------------------------------------------------------------------------------ policy


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1:1", True), ("127.9.9.9:1", True), ("localhost:1", True), ("[::1]:1", True),
     ("0.0.0.0:1", False), ("10.1.2.3:1", False), ("ctl.example:1", False), ("[::]:1", False)],
)
def test_only_loopback_counts_as_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_tls_settings_come_together_and_need_an_agent_port() -> None:
    with pytest.raises(ConfigError, match="tls_key: TLS needs"):
        parse_config({"controller": {"tls_cert": "/c"}}, "f.toml")
    with pytest.raises(ConfigError, match="agent_address: required with TLS"):
        parse_config({"controller": {"tls_cert": "/c", "tls_key": "/k", "tls_ca": "/a"}}, "f.toml")
    with pytest.raises(ConfigError, match="agent_address: only used with TLS"):
        parse_config({"controller": {"agent_address": "0.0.0.0:7"}}, "f.toml")
    with pytest.raises(ConfigError, match="must differ"):
        parse_config(
            {"controller": {"tls_cert": "/c", "tls_key": "/k", "tls_ca": "/a", "address": "h:1", "agent_address": "h:1"}},
            "f.toml",
        )
    with pytest.raises(ConfigError, match="agent.tls_ca"):
        parse_config({"agent": {"tls_cert": "/c", "tls_key": "/k"}}, "f.toml")


def test_agents_and_clients_refuse_plain_text_to_another_host() -> None:
    with pytest.raises(TlsError, match="only to a loopback controller"):
        check_agent_transport("10.0.0.5:6818", "")
    check_agent_transport("127.0.0.1:6818", "")
    with pytest.raises(TlsError, match="no cluster CA"):
        client_channel("10.0.0.5:6817", {"GARRISON_CONTROLLER": "10.0.0.5:6817"})


def test_a_controller_configured_for_plain_text_off_loopback_will_not_start(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        f'[controller]\naddress = "0.0.0.0:0"\ndatabase = "sqlite:///{tmp_path}/c.db"\nstate_dir = "{tmp_path}/s"\n'
        f'credential_socket = "{tmp_path}/a.sock"\nlocal_socket = ""\nkey_file = "{tmp_path}/s/k"\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "garrison.controller.main", "--config", str(config)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "plain text is allowed only on loopback addresses" in proc.stderr


def test_clients_accept_only_the_controller_certificate(tmp_path: Path) -> None:
    """A server with another certificate of the same CA (a node's) cannot pass for the controller."""
    make_ca(tmp_path)
    node_files = TlsFiles(str(tmp_path / "agents" / "node1.crt"), str(tmp_path / "agents" / "node1.key"),
                          str(tmp_path / "ca.crt"))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_ControllerServicer_to_server(pb_grpc.ControllerServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", server_credentials(node_files, require_client_cert=False))
    server.start()
    try:
        channel = client_channel(f"127.0.0.1:{port}", {"GARRISON_TLS_CA": str(tmp_path / "ca.crt")})
        with channel, pytest.raises(grpc.RpcError) as refused:
            pb_grpc.ControllerStub(channel).Hello(pb.HelloRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)


# ---------------------------------------------------------------------- a real controller over TLS


def _inventory() -> pb.NodeInventory:
    return pb.NodeInventory(
        hostname="h",
        gpus=[pb.GpuInfo(index=0, uuid="GPU-0", name="NVIDIA A100", memory_mib=40960)],
        nvlink=[pb.IntRow(values=[0])],
        topo=[pb.LabelRow(values=["X"])],
        cpus=8,
        memory_mb=1024,
    )


def _register(channel: grpc.Channel, node: str, metadata: tuple[tuple[str, str], ...] = ()) -> pb.ControllerMessage:
    """Open an agent stream, send Register, and return the controller's first message (or raise)."""
    done = threading.Event()

    def messages() -> Iterator[pb.AgentMessage]:
        yield pb.AgentMessage(register=pb.Register(node_name=node, inventory=_inventory(), address="127.0.0.1"))
        done.wait(30)

    call = pb_grpc.AgentLinkStub(channel).Connect(messages(), metadata=metadata, timeout=20)
    try:
        return next(call)
    finally:
        call.cancel()
        done.set()


def _agent_channel(address: str, ca: Path, cert: Path | None = None, key: Path | None = None) -> grpc.Channel:
    credentials = channel_credentials(str(ca), str(cert or ""), str(key or ""))
    return grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)


@pytest.fixture(scope="module")
def tls_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # type: ignore[type-arg]
    root = tmp_path_factory.mktemp("tls")
    ca = make_ca(root / "ca", nodes=("node1", "node2"))
    make_ca(root / "other-ca", nodes=("node1",))  # a CA the cluster does not trust
    with running_controller(root / "controller", tls_dir=ca) as controller:
        yield controller


def test_agent_with_its_own_certificate_registers(tls_controller) -> None:  # type: ignore[no-untyped-def]
    ca = tls_controller.ca_dir
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", ca / "agents" / "node1.crt",
                        ca / "agents" / "node1.key") as channel:
        first = _register(channel, "node1")
    assert first.WhichOneof("kind") == "registered"


def test_the_revocation_list_reads_hex_serials_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    assert read_revoked(path) == frozenset()  # none yet: nothing revoked
    path.write_text("# revoked agent certificates\n1a2b  # node7, lost\n\nFF\n")
    assert read_revoked(path) == {0x1A2B, 0xFF}
    path.write_text("1a2b\nnode7\n")
    with pytest.raises(TlsError, match="revoked, line 2: 'node7' is not a hexadecimal certificate serial"):
        read_revoked(path)


def test_a_revoked_agent_certificate_is_refused_from_its_next_connection(tls_controller, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca = tls_controller.ca_dir
    spare_cert, spare_key = issue_agent(ca, "node1", out_dir=tmp_path)  # a second certificate for node1
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", spare_cert, spare_key) as channel:
        assert _register(channel, "node1").WhichOneof("kind") == "registered"
    gadmin = Path(sys.executable).parent / "gadmin"
    revoked = subprocess.run([str(gadmin), "cert", "revoke", str(spare_cert), "--dir", str(ca)],
                             capture_output=True, text=True, timeout=60)
    serial = describe(read_pem(spare_cert, "certificate")).serial
    assert revoked.returncode == 0 and revoked.stdout.strip() == f"revoked serial {serial:x} in {ca / 'revoked'}"
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", spare_cert, spare_key) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        _register(channel, "node1")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == f"the certificate of node 'node1' (serial {serial:x}) was revoked"
    # The node's other certificate is still good; a malformed serial is refused with one line.
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", ca / "agents" / "node1.crt",
                        ca / "agents" / "node1.key") as channel:
        assert _register(channel, "node1").WhichOneof("kind") == "registered"
    bad = subprocess.run([str(gadmin), "cert", "revoke", "not-a-serial", "--dir", str(ca)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stderr.strip() == (
        "gadmin: error: 'not-a-serial' is neither a certificate file nor a hexadecimal serial")


def test_agent_presenting_another_nodes_certificate_is_refused(tls_controller) -> None:  # type: ignore[no-untyped-def]
    ca = tls_controller.ca_dir
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", ca / "agents" / "node2.crt",
                        ca / "agents" / "node2.key") as channel, pytest.raises(grpc.RpcError) as refused:
        _register(channel, "node1")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate of node 'node2' may not register as 'node1'" in refused.value.details()
    assert "may not register as 'node1'" in tls_controller.log_text()  # refusals are logged with the reason


def test_agent_with_a_certificate_from_another_ca_is_refused(tls_controller) -> None:  # type: ignore[no-untyped-def]
    other = tls_controller.root.parent / "other-ca"
    ca = tls_controller.ca_dir
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt", other / "agents" / "node1.crt",
                        other / "agents" / "node1.key") as channel, pytest.raises(grpc.RpcError) as refused:
        _register(channel, "node1")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake itself fails


def test_agent_without_a_certificate_is_refused(tls_controller) -> None:  # type: ignore[no-untyped-def]
    ca = tls_controller.ca_dir
    with _agent_channel(tls_controller.agent_address, ca / "ca.crt") as channel, pytest.raises(grpc.RpcError) as refused:
        _register(channel, "node1")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # On the client port (no client certificates asked for) the controller itself refuses the stream,
    # even with a root credential that would do on a plain-text loopback cluster.
    with tls_controller.client_channel() as channel, pytest.raises(grpc.RpcError) as refused:
        _register(channel, "node1", (("x-garrison-credential", tls_controller.credential()),))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no client certificate" in refused.value.details()


def test_plain_text_client_on_the_tls_port_is_refused(tls_controller) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(tls_controller.address) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ControllerStub(channel).Hello(pb.HelloRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    # The CLI says so in one line and exits non-zero.
    env = dict(os.environ, GARRISON_CONTROLLER=tls_controller.address, XDG_CACHE_HOME=str(tls_controller.root / "c"))
    env.pop("GARRISON_TLS_CA", None)
    proc = subprocess.run([sys.executable, "-m", "garrison.cli.gqueue"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("gqueue: error: cannot reach the controller")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_tls_client_with_a_credential_is_served_and_nodes_are_only_the_certified_ones(tls_controller) -> None:  # type: ignore[no-untyped-def]
    with tls_controller.client_channel() as channel:
        nodes = pb_grpc.ControllerStub(channel).ListNodes(
            pb.ListNodesRequest(), metadata=(("x-garrison-credential", tls_controller.credential()),), timeout=10
        )
    assert [n.name for n in nodes.nodes] in ([], ["node1"])
