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

Keys are ECDSA P-256: small, fast to generate, and supported by every TLS stack gRPC ships with. The
certificate-making half of this module needs the ``cryptography`` package and imports it lazily; the
channel helpers only read PEM files, so the CLI does not pay for it.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

CONTROLLER_TLS_NAME = "garrison-controller"
ORGANISATION = "garrison"
AGENT_UNIT = "agent"
CONTROLLER_UNIT = "controller"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CONTROLLER_CERT = "controller.crt"
CONTROLLER_KEY = "controller.key"
DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 365
# Node names end up in certificates, file names and log lines: keep them to host-name characters.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# What every client and agent channel sets so that only the controller's certificate verifies.
CHANNEL_OPTIONS: tuple[tuple[str, str], ...] = (("grpc.ssl_target_name_override", CONTROLLER_TLS_NAME),)
MAX_PEM_BYTES = 64 * 1024

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


class TlsError(Exception):
    """A certificate or key problem, with the file and the reason in one line."""


# ------------------------------------------------------------------------------------ address policy


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` names a loopback host, the only place plain text is allowed."""
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_node_name(name: str) -> str:
    if not NODE_NAME.match(name):
        raise TlsError(f"invalid node name {name[:80]!r}: 1-63 letters, digits, '.', '_' or '-'")
    if name == CONTROLLER_TLS_NAME:
        raise TlsError(f"{CONTROLLER_TLS_NAME!r} is reserved for the controller's certificate")
    return name


# ------------------------------------------------------------------------------------------- files


def read_pem(path: str | os.PathLike[str], what: str, *, private: bool = False) -> bytes:
    """The bytes of a PEM file, refusing a private key that others can read (as ssh does)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise TlsError(f"cannot read {what} {os.fspath(path)}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as pem_file:
        info = os.fstat(pem_file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TlsError(f"{what} {os.fspath(path)} is not a regular file")
        if private and info.st_mode & 0o077:
            raise TlsError(
                f"{what} {os.fspath(path)} is readable by others (mode {info.st_mode & 0o777:04o}); want 0600"
            )
        data = pem_file.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES or b"-----BEGIN " not in data:
        raise TlsError(f"{what} {os.fspath(path)} is not a PEM file")
    return data


def write_file(path: Path, data: bytes, mode: int, *, overwrite: bool = False) -> None:
    """Write ``data`` to ``path`` with ``mode``, atomically (temporary file + rename), never through a link."""
    path = Path(path)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise TlsError(f"{path} already exists; remove it first or pick another directory")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed it; never widened
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise TlsError(f"cannot write {path}: {error.strerror}") from None


# ---------------------------------------------------------------------------------- making certs


@dataclass(frozen=True)
class CertificateInfo:
    subject: str
    common_name: str
    unit: str
    dns_names: tuple[str, ...]
    serial: int
    not_before: datetime.datetime
    not_after: datetime.datetime
    fingerprint_sha256: str
    is_ca: bool


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, unit: str, cluster: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name if common_name else cluster),
        ]
    )


def _general_names(names: Iterable[str]) -> list[x509.GeneralName]:
    from cryptography import x509

    out: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # unique, in order
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_pem = read_pem(ca_dir / CA_CERT, "CA certificate")
    key_pem = read_pem(ca_dir / CA_KEY, "CA key", private=True)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as error:
        raise TlsError(f"cannot load the CA in {ca_dir}: {error}") from None
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise TlsError(f"{ca_dir / CA_KEY} is not the key of {ca_dir / CA_CERT}")
    return cert, key


def _issue(
    ca_cert: x509.Certificate,
    ca_key: Any,
    *,
    common_name: str,
    unit: str,
    sans: Sequence[str],
    server: bool,
    days: int,
) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if days <= 0:
        raise TlsError(f"validity must be at least one day, got {days}")
    now = _now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    key = _new_key()
    usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, unit, ""))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew between hosts
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .add_extension(x509.SubjectAlternativeName(_general_names(sans)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def init_ca(
    ca_dir: str | os.PathLike[str],
    *,
    cluster: str = "garrison",
    days: int = DEFAULT_CA_DAYS,
    controller_names: Sequence[str] = (),
    controller_days: int = DEFAULT_CERT_DAYS,
) -> list[Path]:
    """Create a new CA (``ca.crt``, ``ca.key`` 0600) and the controller's certificate in ``ca_dir``.

    Refuses to touch an existing CA: replacing it would lock out every agent (see docs/security.md for
    rotation). Returns the files written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    directory = Path(ca_dir)
    if (directory / CA_KEY).exists() or (directory / CA_CERT).exists():
        raise TlsError(f"a CA already exists in {directory}; to rotate it, create the new one elsewhere")
    if days <= 0:
        raise TlsError(f"validity must be at least one day, got {days}")
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as error:
        raise TlsError(f"cannot create {directory}: {error.strerror}") from None
    now = _now()
    key = _new_key()
    subject = _name(f"{cluster} cluster CA", "ca", cluster)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        # path_length=0: this CA signs leaf certificates only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_file(directory / CA_KEY, _key_pem(key), 0o600)
    write_file(directory / CA_CERT, _cert_pem(cert), 0o644)
    written = [directory / CA_CERT, directory / CA_KEY]
    written += issue_controller(directory, names=controller_names, days=controller_days)
    return written


def controller_names_default() -> list[str]:
    import socket

    names = [socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"]
    return [n for n in dict.fromkeys(names) if n]


def issue_controller(
    ca_dir: str | os.PathLike[str],
    *,
    names: Sequence[str] = (),
    days: int = DEFAULT_CERT_DAYS,
    out_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """The controller's certificate and key (``controller.crt``, ``controller.key`` 0600)."""
    directory = Path(ca_dir)
    target = Path(out_dir) if out_dir is not None else directory
    ca_cert, ca_key = _load_ca(directory)
    sans = [CONTROLLER_TLS_NAME, *(names or controller_names_default())]
    cert_pem, key_pem = _issue(
        ca_cert, ca_key, common_name=CONTROLLER_TLS_NAME, unit=CONTROLLER_UNIT, sans=sans, server=True, days=days
    )
    write_file(target / CONTROLLER_KEY, key_pem, 0o600, overwrite=overwrite)
    write_file(target / CONTROLLER_CERT, cert_pem, 0o644, overwrite=overwrite)
    return [target / CONTROLLER_CERT, target / CONTROLLER_KEY]


def issue_agent(
    ca_dir: str | os.PathLike[str],
    node: str,
    *,
    out_dir: str | os.PathLike[str] | None = None,
    days: int = DEFAULT_CERT_DAYS,
    overwrite: bool = False,
) -> tuple[Path, Path]:
    """``NODE.crt`` and ``NODE.key`` (0600) for a node agent, in ``out_dir`` (default ``ca_dir/agents``)."""
    check_node_name(node)
    directory = Path(ca_dir)
    target = Path(out_dir) if out_dir is not None else directory / "agents"
    ca_cert, ca_key = _load_ca(directory)
    cert_pem, key_pem = _issue(
        ca_cert, ca_key, common_name=node, unit=AGENT_UNIT, sans=[node], server=False, days=days
    )
    try:
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as error:
        raise TlsError(f"cannot create {target}: {error.strerror}") from None
    write_file(target / f"{node}.key", key_pem, 0o600, overwrite=overwrite)
    write_file(target / f"{node}.crt", cert_pem, 0o644, overwrite=overwrite)
    return target / f"{node}.crt", target / f"{node}.key"


def describe(cert_pem: bytes) -> CertificateInfo:
    """What a PEM certificate says: for ``gadmin cert show`` and for checking an agent's identity."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as error:
        raise TlsError(f"not a certificate: {error}") from None

    def first(oid: x509.ObjectIdentifier) -> str:
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    return CertificateInfo(
        subject=cert.subject.rfc4514_string(),
        common_name=first(NameOID.COMMON_NAME),
        unit=first(NameOID.ORGANIZATIONAL_UNIT_NAME),
        dns_names=dns_names,
        serial=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        fingerprint_sha256=cert.fingerprint(hashes.SHA256()).hex(":"),
        is_ca=is_ca,
    )


# ------------------------------------------------------------------------------ agent identity


def agent_certificate(auth_context: Mapping[str, Sequence[bytes]]) -> CertificateInfo:
    """The verified peer certificate, read once, if it was made for a node agent; else TlsError saying why.

    The TLS handshake has already checked the chain against the cluster CA (the agent port requires and
    verifies client certificates); this checks that the certificate was made for an agent and names a node.
    """
    if auth_context.get("transport_security_type") != [b"ssl"]:
        raise TlsError("not a TLS connection: agents must connect to the controller's agent_address")
    pem = auth_context.get("x509_pem_cert")
    if not pem:
        raise TlsError("no client certificate: agents must present their node certificate")
    info = describe(pem[0])
    if info.unit != AGENT_UNIT or info.is_ca:
        raise TlsError(f"certificate {info.subject!r} is not a node agent certificate")
    if not NODE_NAME.match(info.common_name) or info.common_name == CONTROLLER_TLS_NAME:
        raise TlsError(f"certificate {info.subject!r} does not name a node")
    return info



REVOKED_FILE = "revoked"  # in the CA directory, next to ca.crt: serials of agent certificates no longer valid


def read_revoked(path: str | os.PathLike[str]) -> frozenset[int]:
    """The serials listed in a revocation file: one hexadecimal serial per line (as ``gadmin cert show``
    prints it), ``#`` starts a comment. A missing file revokes nothing; an unreadable or malformed one is a
    TlsError, so the controller refuses agents rather than let a revoked one in."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise TlsError(f"cannot read the revocation list {path}: {exc.strerror}") from None
    serials = set()
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            serials.add(int(entry, 16))
        except ValueError:
            raise TlsError(f"{path}, line {number}: {entry!r} is not a hexadecimal certificate serial") from None
    return frozenset(serials)


def revoke_serial(ca_dir: str | os.PathLike[str], serial: int, note: str) -> Path:
    """Add ``serial`` to the CA directory's revocation list (readable by all: serials are not secret)."""
    path = Path(ca_dir) / REVOKED_FILE
    if not (Path(ca_dir) / "ca.crt").exists():
        raise TlsError(f"{ca_dir} holds no cluster CA (ca.crt); gadmin cert init creates one")
    if serial in read_revoked(path):
        return path
    with open(path, "a") as handle:
        handle.write(f"{serial:x}  # {note}\n")
    os.chmod(path, 0o644)
    return path


def certificate_names_node(info: CertificateInfo, node: str) -> bool:
    """Whether an agent certificate (agent_certificate's answer) was issued for ``node``: its common name or
    a DNS SAN."""
    return info.common_name == node or node in info.dns_names


# ------------------------------------------------------------------------------ gRPC credentials


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
