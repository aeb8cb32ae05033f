"""CONNACK refusals, the reconnection backoff and plain broker URLs of the MQTT adapter.

Kept apart from :mod:`~nlagg_node.runtime.mqtt` (the adapter itself): the settings need no paho.
URLs and TLS settings are :mod:`~nlagg_node.runtime.tls`'s.
"""

from __future__ import annotations

import numpy as np

from ..errors import BrokerRefusedError, ConfigError
from .tls import broker_endpoint

__all__ = ["FATAL_CONNACK", "NOT_AUTHORIZED", "BrokerRefusedError", "jittered_backoff", "parse_broker_url"]

# CONNACK refusals that no retry can fix (MQTT 3.1.1 return codes 1, 2, 4, 5 as paho's reason codes).
FATAL_CONNACK = {
    132: "unsupported protocol version",
    133: "client identifier not valid",
    134: "bad user name or password",
    135: "not authorized",
}
NOT_AUTHORIZED = (134, 135)  # the refusals of a client without (valid) credentials


def jittered_backoff(attempt: int, base: float, maximum: float, rng: np.random.Generator) -> float:
    """Seconds to wait before reconnection attempt ``attempt`` (0, 1, ...).

    Full jitter, ``uniform(0, min(maximum, base 2^attempt))``, spreads the reconnections of
    many clients after a broker restart.
    """
    return float(rng.uniform(0.0, min(maximum, base * 2 ** min(attempt, 30))))


def parse_broker_url(url: str) -> tuple[str, int]:
    """``(host, port)`` of a plain ``mqtt://host[:port]`` URL, for clients without TLS."""
    where = broker_endpoint(url)
    if where.tls:
        raise ConfigError("broker", url, "this client speaks plain MQTT only: expected mqtt://host[:port]")
    return where.host, where.port
