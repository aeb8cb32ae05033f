"""A node's side of signed messages: what it publishes is signed, what it reads is checked.

The rule and the primitives are the protocol's (:mod:`nlagg_node.protocol.identity`); this module
only puts them on a connection. :class:`SignedTransport` signs every payload a node's outbox
publishes with the node's identity (its statuses, z^(0), key, a corrupted node's states and its
x's, which also carry a key-chain element, :mod:`nlagg_node.protocol.chain`;
what it sends again after a broker crash is signed again, to the same bytes: Ed25519 is
deterministic); :func:`signed_will` signs the last will the broker publishes for it. The router
checks every message it decodes with :func:`~nlagg_node.protocol.identity.signature_error`, as the
eavesdropper's transcript does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Self

from ..protocol.identity import Identity
from .transport import Message, Transport, Will

__all__ = ["SignedTransport", "signed_will"]


class SignedTransport(Transport):
    """``inner`` with every published payload signed by ``identity`` (for the run ``instance``) but
    those on ``unsigned`` (a topic left unsigned; none in a node: its x's are signed as well)."""

    def __init__(
        self, inner: Transport, identity: Identity, unsigned: str = "", instance: str | None = None
    ) -> None:
        self.inner = inner
        self.identity = identity
        self.unsigned = unsigned
        self.instance = instance  # the run instance every signature binds (None: a run without one)

    def signed(self, topic: str, payload: bytes) -> bytes:
        """``payload`` as this transport publishes it on ``topic`` (a host coalescing x's signs each so)."""
        return payload if topic == self.unsigned else self.identity.sign(topic, payload, self.instance)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        await self.inner.publish(topic, self.signed(topic, payload), qos=qos, retain=retain)

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self.inner.publish_nowait(topic, self.signed(topic, payload), qos=qos, retain=retain)

    async def connect(self) -> None:
        await self.inner.connect()

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        await self.inner.subscribe(*filters, qos=qos)

    def messages(self) -> AsyncIterator[Message]:
        return self.inner.messages()

    async def close(self) -> None:
        await self.inner.close()

    def on_reconnect(self, listener: Callable[[bool], None]) -> None:
        self.inner.on_reconnect(listener)

    @property
    def reconnects(self) -> int:
        return self.inner.reconnects

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)


def signed_will(will: Will, identity: Identity | None, instance: str | None = None) -> Will:
    """``will`` with its payload signed by ``identity`` for the run ``instance`` (unchanged without one)."""
    if identity is None:
        return will
    payload = identity.sign(will.topic, will.payload, instance)
    return Will(will.topic, payload, retain=will.retain, qos=will.qos)
