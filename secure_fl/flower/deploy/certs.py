"""Certificates and node keys for a TLS federation with node authentication.

``deploy local --tls`` makes, with :mod:`cryptography`, what an operator makes once per
federation (docs/deployment.md):

* a CA (EC P-384, self-signed, ``basicConstraints CA:true``) whose certificate every party gets
  and whose key signs the SuperLink's certificate and nothing else;
* the SuperLink's server certificate, for the names and addresses the nodes dial (by default
  ``127.0.0.1`` and ``localhost``), with its private key;
* one EC P-384 key pair per SuperNode in OpenSSH format: the private half stays with the node
  (``flower-supernode --auth-supernode-private-key``), the public half is registered with the
  SuperLink (``flwr supernode register``), which then refuses nodes it does not know
  (``flower-superlink --enable-supernode-auth``).

Every private key is written mode 0600. Keys come from the OS generator (``cryptography``
draws from ``os.urandom``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateError", "NodeKey", "ServerCertificates", "make_node_key", "make_server_certificates"]

CURVE = ec.SECP384R1()
VALIDITY = datetime.timedelta(days=30)
"""A generated federation's certificates expire after a month; make new ones for a longer one."""


class CertificateError(ValueError):
    """Certificates cannot be made for what was asked (an empty or malformed host name)."""


@dataclass(frozen=True, kw_only=True)
class ServerCertificates:
    """Paths of the CA certificate (every party), the SuperLink's certificate and its key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True, kw_only=True)
class NodeKey:
    """One SuperNode's authentication key pair (OpenSSH format)."""

    private_key: Path
    public_key: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _subject_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        if not host or any(c.isspace() for c in host):
            raise CertificateError(f"bad host name for the SuperLink certificate: {host!r}")
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_server_certificates(directory: Path, *, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
                             now: datetime.datetime | None = None) -> ServerCertificates:
    """A CA and the SuperLink's certificate for ``hosts`` (IP addresses or DNS names), in ``directory``."""
    if not hosts:
        raise CertificateError("the SuperLink certificate needs at least one host name or address")
    alt_names = _subject_names(hosts)
    directory.mkdir(parents=True, exist_ok=True)
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(CURVE)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure-fl federation CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(CURVE)
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(start + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    out = ServerCertificates(ca_cert=directory / "ca.crt", server_cert=directory / "server.pem",
                             server_key=directory / "server.key")
    out.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    out.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(out.server_key, server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    # The CA key signed the one certificate this federation needs; it is not kept.
    return out


def make_node_key(directory: Path, name: str) -> NodeKey:
    """A SuperNode's EC P-384 key pair as ``NAME`` / ``NAME.pub`` (OpenSSH) in ``directory``."""
    if not name or "/" in name or name.startswith("."):
        raise CertificateError(f"bad node key name: {name!r}")
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(CURVE)
    out = NodeKey(private_key=directory / name, public_key=directory / f"{name}.pub")
    _write_private(out.private_key, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    out.public_key.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return out
