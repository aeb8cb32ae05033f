"""Publish a plan's public run configuration as the retained ``P/R/config`` message (launcher user).

The eavesdropper learns n, the graph and the phase schedule from this message, and stops once
every node of it is done; in a testbed the launcher publishes it, in a deployment this does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import load_config
from ..errors import ConfigError
from ..inputs import parse_document, read_input_text
from ..protocol.identity import Identity
from ..runtime.tls import TlsSettings
from .identities import identity_file, load_identity, run_identities, run_launcher
from .mosquitto_auth import LAUNCHER_USER

__all__ = ["launcher_identity", "publish_config", "run_network"]


def run_network(config: Path) -> tuple[str, str]:
    """``(prefix, run_id)`` from the ``[network]`` table of a plan's run.toml."""
    net = parse_document(read_input_text(config, "config"), "TOML", "config", config).get("network", {})
    run_id = net.get("run_id")
    if not isinstance(run_id, str):
        raise ConfigError(
            "network.run_id", run_id, f"missing in {config} (write plans with nlagg deploy plan)"
        )
    return str(net.get("prefix", "nlagg")), run_id


def launcher_identity(config: Path, signing_key: Path | None) -> Identity | None:
    """The launcher's signing key when ``config`` lists one (``[identities] launcher``): from
    ``signing_key`` or the plan's ``secrets/launcher.identity.pem``; refused when it is not that key."""
    public = run_launcher(config)
    if public is None:
        if signing_key is not None:
            raise ConfigError("signing_key", str(signing_key), f"{config} lists no launcher key")
        return None
    identity = load_identity(signing_key or Path(identity_file(LAUNCHER_USER)))
    if identity.public != public:
        raise ConfigError("signing_key", identity.public, f"is not the launcher key {public} of {config}")
    return identity


async def publish_config(
    config: Path,
    broker: str | Sequence[str],
    *,
    username: str | None,
    password: str | None,
    within: float = 30.0,
    tls: TlsSettings | None = None,
    signing_key: Path | None = None,
) -> str:
    """Publish the retained config of ``config`` (a run.toml) and return its topic.

    In a plan with a launcher key (``[identities] launcher``) the config carries a fresh run
    instance and is signed with that key (``signing_key``; :mod:`nlagg_node.protocol.instance`).
    Relative paths in the file (``graph_file``) are resolved against the current directory,
    which the caller sets to the plan directory. Several brokers (a plan's site brokers) each get
    the same document, one instance.
    """
    import asyncio

    from ..protocol.instance import new_instance
    from ..runtime.mqtt import MqttTransport
    from ..runtime.public import build_config_msg, run_edges
    from ..runtime.wire import encode, topics

    prefix, run_id = run_network(config)
    cfg = load_config(config)
    launcher = launcher_identity(config, signing_key)
    msg = build_config_msg(
        cfg,
        run_id,
        run_edges(cfg),
        run_identities(config),
        instance=None if launcher is None else new_instance(),
        launcher=None if launcher is None else launcher.public,
    )
    topic = topics(prefix, run_id).config
    payload = encode(msg) if launcher is None else launcher.sign(topic, encode(msg))
    for url in [broker] if isinstance(broker, str) else broker:
        transport = MqttTransport(
            url,
            client_id=f"nlagg-{run_id}-launcher",
            username=username,
            password=password,
            clean_session=True,
            tls=tls,
        )
        async with asyncio.timeout(within), transport:
            await transport.publish(topic, payload, qos=1, retain=True)
    return topic
