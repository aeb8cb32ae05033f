"""The MQTT adapter over TLS (``mqtts://``) against a real Mosquitto TLS listener, with a throwaway CA."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError, NlaggError
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.node import Node, run_edges
from nlagg_node.runtime.tls import TlsSettings
from nlagg_node.sim import simulate


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    path.chmod(0o644)  # a throwaway key, readable by the broker's unprivileged user
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.chmod(0o644)
    return path


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        alt = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki() -> Iterator[Pki]:
    """A throwaway CA, a broker certificate for 127.0.0.1 and a client certificate.

    In a directory Mosquitto can read after dropping its privileges (pytest's are root-only).
    """
    d = Path(tempfile.mkdtemp(prefix="nlagg-pki-"))
    d.chmod(0o755)
    try:
        yield _make_pki(d)
    finally:
        shutil.rmtree(d)


def _make_pki(d: Path) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("nlagg test CA", ca_key, None, ca_key, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    return Pki(
        ca=_write_cert(ca, d / "ca.pem"),
        server_cert=_write_cert(
            _cert("broker", server_key, ca.subject, ca_key, server=True), d / "broker.pem"
        ),
        server_key=_write_key(server_key, d / "broker.key"),
        client_cert=_write_cert(_cert("node-0", client_key, ca.subject, ca_key), d / "node.pem"),
        client_key=_write_key(client_key, d / "node.key"),
        other_ca=_write_cert(_cert("other CA", other_key, None, other_key, ca=True), d / "other.pem"),
    )


@pytest.fixture(params=[False, True], ids=["server-auth", "client-cert"])
async def tls_broker(request: pytest.FixtureRequest, pki: Pki) -> AsyncIterator[tuple[str, bool]]:
    """``mqtts://127.0.0.1:PORT`` of a Mosquitto TLS listener; True if it requires a client certificate."""
    require: bool = request.param
    lines = [
        f"cafile {pki.ca}",
        f"certfile {pki.server_cert}",
        f"keyfile {pki.server_key}",
        f"require_certificate {'true' if require else 'false'}",
    ]
    async with start_mosquitto(extra_lines=lines) as broker:
        yield f"mqtts://{broker.host}:{broker.port}", require


@pytest.mark.mosquitto
async def test_nodes_over_tls_equal_the_simulator(tls_broker: tuple[str, bool], pki: Pki) -> None:
    url, _ = tls_broker
    cfg = RunConfig(op="median", n=6, trials=1, record="all", t_max=120, seed=9)
    sim = simulate(cfg)
    tls = TlsSettings(pki.ca, pki.client_cert, pki.client_key)
    async with MqttTransport(url, client_id="tls-host", tls=tls) as tr:
        nodes = [
            Node(cfg, i, sim.values[0][i], tr, run_id="tls", edges=run_edges(cfg), own_transport=False)
            for i in range(cfg.n)
        ]
        results = await host_nodes(nodes, tr, "nlagg", "tls")
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])


@pytest.mark.mosquitto
@pytest.mark.parametrize("case", ["wrong-ca", "plaintext", "no-client-cert"])
async def test_tls_refusals(tls_broker: tuple[str, bool], pki: Pki, case: str) -> None:
    url, require = tls_broker
    if case == "no-client-cert" and not require:
        pytest.skip("the listener accepts clients without a certificate")
    if case == "wrong-ca":
        tr = MqttTransport(url, client_id="c", tls=TlsSettings(pki.other_ca), reconnect_tries=2)
    elif case == "plaintext":
        tr = MqttTransport(url.replace("mqtts", "mqtt"), client_id="c", reconnect_tries=2, connect_timeout=2)
    else:
        tr = MqttTransport(url, client_id="c", tls=TlsSettings(pki.ca), reconnect_tries=2, connect_timeout=2)
    # A certificate that does not verify is final at the first try; the others are retried.
    expected = "its certificate does not verify" if case == "wrong-ca" else "cannot connect to broker"
    with pytest.raises(NlaggError, match=expected):
        await asyncio.wait_for(roundtrip(tr), 60)


async def roundtrip(tr: MqttTransport) -> None:
    async with tr:
        await tr.subscribe("x/#")
        await tr.publish("x/1", b"1")  # a refused client certificate may only show here


def test_tls_settings_need_an_mqtts_url(pki: Pki) -> None:
    with pytest.raises(ConfigError) as info:
        MqttTransport("mqtt://127.0.0.1:1883", client_id="c", tls=TlsSettings(pki.ca))
    assert info.value.field == "broker"
