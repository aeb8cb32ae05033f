"""A lab Mosquitto with a plain and a TLS listener, its server certificate from a fresh private CA.

Anonymous clients are admitted (a lab broker, as the testbed's private one); the TLS listener
(TLS 1.2+) presents a certificate for ``localhost`` and ``127.0.0.1`` signed by a CA made as
``nlagg deploy plan --tls`` makes it. Used by ``tests/integration/test_tls.py`` and
``benchmarks/bench_testbed.py --tls``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nlagg_node.deploy.tls import new_ca
from nlagg_node.runtime.brokers import free_port, start_mosquitto

__all__ = ["TlsLabBroker", "tls_lab_broker"]


@dataclass(frozen=True)
class TlsLabBroker:
    plain_url: str  # mqtt://127.0.0.1:port
    tls_url: str  # mqtts://localhost:port
    ca_file: Path


@contextlib.asynccontextmanager
async def tls_lab_broker() -> AsyncIterator[TlsLabBroker]:
    with tempfile.TemporaryDirectory(prefix="nlagg-tls-broker-") as tmp:
        root = Path(tmp)
        ca = new_ca("lab")
        server = ca.server(["localhost", "127.0.0.1"])
        (root / "ca.pem").write_bytes(ca.pair.cert_pem)
        (root / "server.pem").write_bytes(server.cert_pem)
        key = root / "server.key"
        key.write_bytes(server.key_pem)
        key.chmod(0o600)
        port = free_port()
        lines = [f"listener {port} 127.0.0.1", f"cafile {root / 'ca.pem'}", f"certfile {root / 'server.pem'}"]
        lines += [f"keyfile {key}", "tls_version tlsv1.2"]
        lines += ["user root"] if os.geteuid() == 0 else []  # else it drops to a user who cannot read them
        async with start_mosquitto(extra_lines=lines, workdir=root) as broker:
            yield TlsLabBroker(broker.url, f"mqtts://localhost:{port}", root / "ca.pem")
