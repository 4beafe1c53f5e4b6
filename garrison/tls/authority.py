"""How the cluster's certificate authority is made and signs: ``gadmin cert init`` (the CA and the
controller's certificate), ``gadmin cert issue-agent`` and ``issue-controller``, and what a certificate
says (``describe``).

Keys are ECDSA P-256: small, fast to generate, and supported by every TLS stack gRPC ships with. This
module needs the ``cryptography`` package and imports it lazily, inside each function, so that importing
garrison.tls for a channel does not pay for it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from garrison.tls.errors import TlsError
from garrison.tls.files import read_pem, write_file
from garrison.tls.names import (
    AGENT_UNIT,
    CONTROLLER_TLS_NAME,
    CONTROLLER_UNIT,
    ORGANISATION,
    check_node_name,
)

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CONTROLLER_CERT = "controller.crt"
CONTROLLER_KEY = "controller.key"
DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 365


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
