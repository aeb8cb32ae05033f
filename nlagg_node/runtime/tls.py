"""Client-side TLS for broker connections: ``mqtts://`` URLs, a CA file, an optional client certificate.

``mqtt://host[:port]`` is plain MQTT (port 1883 by default), ``mqtts://host[:port]`` MQTT over TLS
(port 8883 by default). The server certificate is always verified, against ``ca_file`` when given
(a plan's private CA, ``nlagg deploy plan --tls``) or the system's trust store otherwise, and its
host name must match the URL's host.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..inputs import not_a_file

__all__ = ["BrokerEndpoint", "TlsSettings", "broker_endpoint"]


@dataclass(frozen=True)
class TlsSettings:
    """What a client needs for ``mqtts://``: the CA to verify the broker, optionally its own cert/key."""

    ca_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None

    def __post_init__(self) -> None:
        for field in ("ca_file", "certfile", "keyfile"):
            path = getattr(self, field)
            why = None if path is None else not_a_file(Path(path))
            if why is not None:
                raise ConfigError(field, str(path), why)
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigError(
                "certfile", str(self.certfile), "give a client certificate and its key together"
            )

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2+, the server verified against ``ca_file`` (host name included)."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except ssl.SSLError as exc:
            raise ConfigError("ca_file", str(self.ca_file), f"not a usable CA certificate ({exc})") from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.certfile is not None:
            try:
                ctx.load_cert_chain(self.certfile, self.keyfile)
            except ssl.SSLError as exc:
                raise ConfigError(
                    "certfile", str(self.certfile), f"not a usable certificate/key ({exc})"
                ) from None
        return ctx


@dataclass(frozen=True)
class BrokerEndpoint:
    host: str
    port: int
    tls: bool


def broker_endpoint(url: str) -> BrokerEndpoint:
    """``mqtt://host[:port]`` (or ``tcp://``) and ``mqtts://host[:port]`` to host, port and TLS flag."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "tcp", "mqtts") or not parts.hostname:
        raise ConfigError("broker", url, "expected mqtt://host[:port] or mqtts://host[:port]")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ConfigError("broker", url, "port must be an integer in 1..65535") from None
    return BrokerEndpoint(parts.hostname, port, tls)
