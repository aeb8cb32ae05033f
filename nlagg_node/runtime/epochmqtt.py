"""The MQTT connection of one epoch (:mod:`nlagg_node.runtime.epochdriver`): a fresh broker session each time.

A node keeps its client id from epoch to epoch (a plan's Mosquitto even names every session after
its user), and its connections keep their session across reconnects (``clean_session=False``). The
session of the epoch before would then carry its subscriptions, and the QoS 1 messages queued for
them, into the next epoch, and grow by one epoch's filters every period. So each epoch starts with
one clean connect that ends the old session, then connects for the epoch on a persistent one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .mqtt import MqttTransport
from .node import node_will
from .outputs import epoch_run_id
from .tls import TlsSettings

if TYPE_CHECKING:
    from ..protocol.identity import Identity

__all__ = ["epoch_mqtt"]


async def epoch_mqtt(
    url: str,
    client_id: str,
    deployment: tuple[str, str],
    node: int,
    epoch: int,
    *,
    username: str | None = None,
    password: str | None = None,
    tls: TlsSettings | None = None,
    run: str | None = None,
    identity: Identity | None = None,
) -> MqttTransport:
    """Node ``node``'s connection for ``epoch`` (its last will on the status topic every epoch shares,
    naming that epoch's run, or ``run``: the epoch's cold rerun ``e{k}r``; signed with ``identity`` in
    a run with identities), after the broker forgot the session before."""
    async with MqttTransport(
        url, client_id=client_id, clean_session=True, username=username, password=password, tls=tls
    ):
        pass
    prefix, run_id = deployment
    run = epoch_run_id(epoch) if run is None else run
    will = node_will(f"{prefix}/{run_id}", run, node, identity, shared=True)
    return MqttTransport(url, client_id=client_id, will=will, username=username, password=password, tls=tls)
