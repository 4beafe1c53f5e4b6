"""The TLS settings of every gRPC connection: the controller's two server ports, the agent's mutual-TLS
channel, and the CLI's channel checked against the cluster CA; plain text only to loopback addresses.

These helpers only read PEM files (grpc is imported inside them), so the CLI does not pay for the
``cryptography`` package or for grpc until it dials.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from garrison.tls.errors import TlsError
from garrison.tls.files import read_pem
from garrison.tls.names import CONTROLLER_TLS_NAME, is_loopback

if TYPE_CHECKING:
    import grpc

# What every client and agent channel sets so that only the controller's certificate verifies.
CHANNEL_OPTIONS: tuple[tuple[str, str], ...] = (("grpc.ssl_target_name_override", CONTROLLER_TLS_NAME),)


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    ca: str

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)


def server_credentials(files: TlsFiles, *, require_client_cert: bool) -> grpc.ServerCredentials:
    import grpc

    cert = read_pem(files.cert, "certificate")
    key = read_pem(files.key, "private key", private=True)
    ca = read_pem(files.ca, "CA certificate")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=require_client_cert)


def channel_credentials(ca_file: str, cert_file: str = "", key_file: str = "") -> grpc.ChannelCredentials:
    import grpc

    ca = read_pem(ca_file, "CA certificate")
    if cert_file or key_file:
        cert = read_pem(cert_file, "certificate")
        key = read_pem(key_file, "private key", private=True)
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    return grpc.ssl_channel_credentials(root_certificates=ca)


def check_agent_transport(controller: str, tls_cert: str) -> None:
    """Refuse (TlsError) an agent configured to reach a non-loopback controller in plain text."""
    if not tls_cert and not is_loopback(controller):
        raise TlsError(
            f"plain text is allowed only to a loopback controller, not {controller}; "
            "set tls_cert, tls_key and tls_ca (see docs/security.md)"
        )


def agent_channel(controller: str, tls_cert: str, tls_key: str, tls_ca: str) -> grpc.aio.Channel:
    """The agent's channel to the controller: mutual TLS with its node certificate, or loopback plain text.

    The files are read on every (re)connection, so renewed certificates take effect without a restart.
    """
    import grpc

    check_agent_transport(controller, tls_cert)
    if tls_cert:
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        return grpc.aio.secure_channel(controller, credentials, options=CHANNEL_OPTIONS)
    return grpc.aio.insecure_channel(controller)


def client_ca_file(address: str, environ: Mapping[str, str] = os.environ) -> str:
    """The cluster CA the CLI trusts for ``address``: $GARRISON_TLS_CA, else the config's controller.tls_ca.

    With GARRISON_CONTROLLER pointing at a loopback address (``garrison up``) the config file is not
    consulted, so a local plain-text cluster works beside a TLS cluster's /etc/garrison/garrison.toml.
    """
    explicit = environ.get("GARRISON_TLS_CA")
    if explicit:
        return explicit
    if environ.get("GARRISON_CONTROLLER") and is_loopback(address):
        return ""
    from garrison.config import ConfigError, config_path_from_env, load_config

    try:
        return load_config(config_path_from_env(environ)).controller.tls_ca
    except ConfigError:
        return ""


def client_channel(address: str, environ: Mapping[str, str] = os.environ) -> grpc.Channel:
    """The CLI's channel: TLS against the cluster CA, or plain text to a loopback controller only."""
    import grpc

    ca_file = client_ca_file(address, environ)
    if ca_file:
        return grpc.secure_channel(address, channel_credentials(ca_file), options=CHANNEL_OPTIONS)
    if not is_loopback(address):
        raise TlsError(
            f"no cluster CA to check the controller at {address} with: set GARRISON_TLS_CA or "
            "controller.tls_ca in the configuration (plain text is only for loopback)"
        )
    return grpc.insecure_channel(address)
