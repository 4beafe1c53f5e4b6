"""Which node an agent's connection speaks for: the verified peer certificate read as an agent's, and the
cluster's list of revoked agent certificates (``gadmin cert revoke``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from garrison.tls.authority import CertificateInfo, describe
from garrison.tls.errors import TlsError
from garrison.tls.names import AGENT_UNIT, CONTROLLER_TLS_NAME, NODE_NAME


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
