"""The cluster's certificate authority, node certificates, and the TLS settings of every gRPC connection.

Trust model: one private CA per cluster (``gadmin cert init``). It signs

- the controller's certificate, whose subject alternative names include the fixed name
  ``garrison-controller``. Clients and agents always check the controller's certificate against that name
  (``grpc.ssl_target_name_override``), whatever host or address they dialled, so no other certificate of
  the CA (a node's, say) can pass for the controller, and nobody has to keep host names in step with SANs.
- one certificate per node agent (``gadmin cert issue-agent NODE``): common name and only DNS SAN are the
  node name, organisational unit ``agent``, extended key usage client authentication. The controller
  accepts an agent's Register only for the node named in its certificate.

The controller listens on two ports: ``address`` for clients (TLS with the controller's certificate;
clients authenticate inside it with a local credential or a token) and ``agent_address`` for agents, which
must present a certificate from the cluster CA (mutual TLS, checked by the TLS handshake itself). gRPC's
Python server can either require client certificates on a port or not ask for them at all, hence two
ports. Plain text remains only for loopback addresses (``garrison up``).

One question a module; import from here, not from the modules:

| module        | question                                                                      |
|---------------|-------------------------------------------------------------------------------|
| ``errors``    | what a certificate or key problem looks like                                  |
| ``names``     | which names certificates carry; which addresses may be reached in plain text  |
| ``files``     | how PEM files are read and written (private keys 0600, atomically)            |
| ``authority`` | how the CA is made and signs, and what a certificate says (needs cryptography)|
| ``identity``  | which node an agent's connection speaks for; which certificates are revoked   |
| ``channels``  | the TLS settings of the controller's ports, the agent's and the CLI's channels |

The certificate-making half needs the ``cryptography`` package and imports it lazily; the channel helpers
only read PEM files, so the CLI does not pay for it.
"""

from __future__ import annotations

from garrison.tls.authority import (
    CA_CERT,
    CA_KEY,
    CONTROLLER_CERT,
    CONTROLLER_KEY,
    DEFAULT_CA_DAYS,
    DEFAULT_CERT_DAYS,
    CertificateInfo,
    controller_names_default,
    describe,
    init_ca,
    issue_agent,
    issue_controller,
)
from garrison.tls.channels import (
    CHANNEL_OPTIONS,
    TlsFiles,
    agent_channel,
    channel_credentials,
    check_agent_transport,
    client_ca_file,
    client_channel,
    server_credentials,
)
from garrison.tls.errors import TlsError
from garrison.tls.files import MAX_PEM_BYTES, read_pem, write_file
from garrison.tls.identity import (
    REVOKED_FILE,
    agent_certificate,
    certificate_names_node,
    read_revoked,
    revoke_serial,
)
from garrison.tls.names import (
    AGENT_UNIT,
    CONTROLLER_TLS_NAME,
    CONTROLLER_UNIT,
    LOOPBACK_NAMES,
    NODE_NAME,
    ORGANISATION,
    check_node_name,
    is_loopback,
)

# The public names of the single module this package replaced, so no importer had to change.
__all__ = [
    "AGENT_UNIT",
    "CA_CERT",
    "CA_KEY",
    "CHANNEL_OPTIONS",
    "CONTROLLER_CERT",
    "CONTROLLER_KEY",
    "CONTROLLER_TLS_NAME",
    "CONTROLLER_UNIT",
    "DEFAULT_CA_DAYS",
    "DEFAULT_CERT_DAYS",
    "LOOPBACK_NAMES",
    "MAX_PEM_BYTES",
    "NODE_NAME",
    "ORGANISATION",
    "REVOKED_FILE",
    "CertificateInfo",
    "TlsError",
    "TlsFiles",
    "agent_certificate",
    "agent_channel",
    "certificate_names_node",
    "channel_credentials",
    "check_agent_transport",
    "check_node_name",
    "client_ca_file",
    "client_channel",
    "controller_names_default",
    "describe",
    "init_ca",
    "is_loopback",
    "issue_agent",
    "issue_controller",
    "read_pem",
    "read_revoked",
    "revoke_serial",
    "server_credentials",
    "write_file",
]
