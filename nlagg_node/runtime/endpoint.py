"""Reaching a broker, for every client: its ``mqtt://`` or ``mqtts://`` URL and the backoff between attempts.

Free of any MQTT library, so the eavesdropper's own MQTT 3.1.1 client (:mod:`adversary.capture`)
and ``nlagg deploy plan`` share it with the nodes' aiomqtt transport without importing aiomqtt.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from ..errors import ConfigError

__all__ = ["BrokerEndpoint", "broker_endpoint", "jittered_backoff"]


def jittered_backoff(attempt: int, base: float, maximum: float, rng: np.random.Generator) -> float:
    """Seconds to wait before reconnection attempt ``attempt`` (0, 1, ...).

    Full jitter, ``uniform(0, min(maximum, base 2^attempt))``, spreads the reconnections of
    many clients after a broker restart.
    """
    return float(rng.uniform(0.0, min(maximum, base * 2 ** min(attempt, 30))))


@dataclass(frozen=True)
class BrokerEndpoint:
    """Where a broker listens, and whether the connection is TLS (``mqtts://``)."""

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
