"""A private certificate authority for one deployment (``nlagg deploy plan --tls``), with ``cryptography``.

The plan's CA signs one server certificate for the broker (its host names and addresses as subject
alternative names, so clients verify the host they dial) and, when client certificates are asked
for (``--require-certificate``), one client certificate per broker user (common name = user name).
Keys are ECDSA P-256; certificates are valid for ``days`` days from now. Private keys are written
0600 by the plan; the CA certificate is public (every client needs it to verify the broker).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertPair", "PlanCA", "new_ca"]


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes = b""


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nlagg deployment"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h for h in hosts if h):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


class PlanCA:
    """The CA of one plan: signs the broker's server certificate and the users' client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, days: int) -> None:
        self.key = key
        self.cert = cert
        self.days = days

    @property
    def pair(self) -> CertPair:
        return CertPair(self.cert.public_bytes(serialization.Encoding.PEM), _key_pem(self.key))

    def _issue(self, common_name: str, extensions: list[tuple[x509.ExtensionType, bool]]) -> CertPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        for ext, critical in extensions:
            builder = builder.add_extension(ext, critical=critical)
        cert = builder.sign(self.key, hashes.SHA256())
        return CertPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def server(self, hosts: Iterable[str]) -> CertPair:
        """The broker's certificate, valid for every host name and address in ``hosts``."""
        hosts = list(hosts)
        return self._issue(
            hosts[0] if hosts else "broker",
            [(_san(hosts), False), (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)],
        )

    def client(self, user: str) -> CertPair:
        """A client certificate whose common name is the broker user ``user``."""
        return self._issue(user, [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)])


def new_ca(run_id: str, *, days: int = 825) -> PlanCA:
    """A fresh self-signed CA named after the run (ECDSA P-256, ``days`` days)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = _name(f"nlagg CA of run {run_id}")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return PlanCA(key, cert, days)
