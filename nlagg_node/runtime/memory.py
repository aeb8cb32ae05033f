"""An in-process MQTT-like broker and its transport, for fast tests and in-process runs.

Semantics kept from MQTT: topic filters with ``+``/``#``, retained messages (an empty retained
payload clears), per-publisher ordering, last wills on an unclean close, one delivery per client
even with overlapping subscriptions (Mosquitto's behaviour).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from ..errors import ConfigError, NlaggError
from .transport import Inbox, Message, Transport, Will, topic_matches, valid_filter

__all__ = ["MemoryBroker", "MemoryTransport"]

_WANTED_CACHE = 4096  # topics a client remembers the match of (a run uses a few per node)


class MemoryBroker:
    """Routes messages between :class:`MemoryTransport` clients of one event loop."""

    def __init__(self) -> None:
        self.retained: dict[str, bytes] = {}
        self._clients: dict[str, MemoryTransport] = {}
        self.published = 0

    def attach(self, client: MemoryTransport) -> None:
        old = self._clients.get(client.client_id)
        if old is not None and old is not client:
            old._drop(publish_will=False)
        self._clients[client.client_id] = client

    def take_over(self, client_id: str) -> None:
        """Another connection with ``client_id``'s credentials took its session, and the client came
        back at once: the broker published its will, the client kept its session (nothing queued
        is lost) and is told, as after any reconnection (:meth:`MemoryTransport.on_reconnect`)."""
        self._clients[client_id]._taken_over()

    def detach(self, client: MemoryTransport) -> None:
        if self._clients.get(client.client_id) is client:
            del self._clients[client.client_id]

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        self.published += 1
        if retain:
            if payload:
                self.retained[topic] = payload
            else:
                self.retained.pop(topic, None)
        for client in list(self._clients.values()):
            if client.wants(topic):
                client._deliver(Message(topic, payload, False))

    def retained_for(self, pattern: str) -> list[Message]:
        return [Message(t, p, True) for t, p in self.retained.items() if topic_matches(pattern, t)]


class MemoryTransport(Transport):
    """A :class:`~nlagg_node.runtime.transport.Transport` on a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker, client_id: str, *, will: Will | None = None) -> None:
        self.broker = broker
        self.client_id = client_id
        self.will = will
        self._filters: list[str] = []
        self._wanted: dict[str, bool] = {}  # topic -> whether a filter matches (cleared on subscribe)
        self._inbox: Inbox[Message] = Inbox()
        self._connected = False
        self._dropped = False  # since the last connect: messages() ends once it has read the rest
        self._reconnects = 0
        self._listeners: list[Callable[[bool], None]] = []

    async def connect(self) -> None:
        self.broker.attach(self)
        self._connected = True
        self._dropped = False

    def _require(self) -> None:
        if not self._connected:
            raise NlaggError(f"memory transport {self.client_id!r} is not connected")

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self.publish_nowait(topic, payload, qos=qos, retain=retain)

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self._require()
        if not topic or "+" in topic or "#" in topic:
            raise ConfigError("topic", topic, "a publish topic must be non-empty without wildcards")
        self.broker.route(topic, payload, retain)

    def on_reconnect(self, listener: Callable[[bool], None]) -> None:
        """Called after each session takeover (:meth:`MemoryBroker.take_over`), with the session kept."""
        self._listeners.append(listener)

    @property
    def reconnects(self) -> int:
        return self._reconnects

    def _taken_over(self) -> None:
        self._reconnects += 1
        self._publish_will()
        for listener in self._listeners:
            listener(True)

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        self._require()
        for pattern in filters:
            if not valid_filter(pattern):
                raise ConfigError("topic_filter", pattern, "not a valid MQTT topic filter")
            if pattern not in self._filters:
                self._filters.append(pattern)
                self._wanted.clear()
            for msg in self.broker.retained_for(pattern):
                self._deliver(msg)

    def wants(self, topic: str) -> bool:
        wanted = self._wanted.get(topic)
        if wanted is None:
            if len(self._wanted) >= _WANTED_CACHE:
                self._wanted.clear()
            wanted = self._wanted[topic] = any(topic_matches(p, topic) for p in self._filters)
        return wanted

    def _deliver(self, msg: Message) -> None:
        self._inbox.put(msg)

    def messages(self) -> AsyncIterator[Message]:
        return self._inbox.drain(lambda: self._dropped)

    def _drop(self, publish_will: bool) -> None:
        if not self._connected:
            return
        self._connected = False
        self.broker.detach(self)
        self._dropped = True
        self._inbox.wake()
        if publish_will:
            self._publish_will()

    def _publish_will(self) -> None:
        if self.will is not None:
            self.broker.route(self.will.topic, self.will.payload, self.will.retain)

    async def close(self) -> None:
        """Clean disconnect: the will is discarded."""
        self._drop(publish_will=False)

    def abort(self) -> None:
        """Unclean loss of the connection: the broker publishes the will."""
        self._drop(publish_will=True)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """A clean close, or the will when the block ends with an error (as a crash would)."""
        if exc_type is None or exc_type is asyncio.CancelledError:
            await self.close()
        else:
            self.abort()
