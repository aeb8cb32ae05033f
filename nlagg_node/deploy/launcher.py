"""Publish a plan's public run configuration as the retained ``P/R/config`` message (launcher user).

The eavesdropper learns n, the graph and the phase schedule from this message, and stops once
every node of it is done; in a testbed the launcher publishes it, in a deployment this does.
"""

from __future__ import annotations

from pathlib import Path

from ..config import load_config
from ..errors import ConfigError
from ..inputs import parse_document, read_input_text
from ..runtime.tls import TlsSettings
from .identities import run_identities

__all__ = ["publish_config", "run_network"]


def run_network(config: Path) -> tuple[str, str]:
    """``(prefix, run_id)`` from the ``[network]`` table of a plan's run.toml."""
    net = parse_document(read_input_text(config, "config"), "TOML", "config", config).get("network", {})
    run_id = net.get("run_id")
    if not isinstance(run_id, str):
        raise ConfigError(
            "network.run_id", run_id, f"missing in {config} (write plans with nlagg deploy plan)"
        )
    return str(net.get("prefix", "nlagg")), run_id


async def publish_config(
    config: Path,
    broker: str,
    *,
    username: str | None,
    password: str | None,
    within: float = 30.0,
    tls: TlsSettings | None = None,
) -> str:
    """Publish the retained config of ``config`` (a run.toml) and return its topic.

    Relative paths in the file (``graph_file``) are resolved against the current directory,
    which the caller sets to the plan directory.
    """
    import asyncio

    from ..runtime.mqtt import MqttTransport
    from ..runtime.public import build_config_msg, run_edges
    from ..runtime.wire import encode, topics

    prefix, run_id = run_network(config)
    cfg = load_config(config)
    msg = build_config_msg(cfg, run_id, run_edges(cfg), run_identities(config))
    topic = topics(prefix, run_id).config
    transport = MqttTransport(
        broker,
        client_id=f"nlagg-{run_id}-launcher",
        username=username,
        password=password,
        clean_session=True,
        tls=tls,
    )
    async with asyncio.timeout(within), transport:
        await transport.publish(topic, encode(msg), qos=1, retain=True)
    return topic
