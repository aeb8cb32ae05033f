"""The MQTT transport: aiomqtt with TCP_NODELAY, persistent sessions, QoS 1 and jittered reconnection.

Measured on this machine (``/work/shared/MQTT-NOTES.md``): without TCP_NODELAY a QoS 1 round trip
costs 40-90 ms instead of 0.7 ms, so the client sets it on its socket (and the private Mosquitto
sets ``set_tcp_nodelay true``). paho allows 20 in-flight QoS 1 messages by default; a node
publishing every iteration needs more. The session is persistent (``clean_session=False`` with a
stable client id), so after a reconnection the broker still holds the subscriptions and the
QoS 1 messages that arrived meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self, cast
from urllib.parse import urlsplit

import aiomqtt
import numpy as np
import paho.mqtt.client as paho_mqtt

from ..errors import ConfigError, NlaggError
from ..rng import rng_for
from .transport import Message, Will, valid_filter

__all__ = ["MqttTransport", "jittered_backoff", "parse_broker_url"]

log = logging.getLogger("nlagg.mqtt")
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


def jittered_backoff(attempt: int, base: float, maximum: float, rng: np.random.Generator) -> float:
    """Seconds to wait before reconnection attempt ``attempt`` (0, 1, ...).

    Full jitter, ``uniform(0, min(maximum, base 2^attempt))``, spreads the reconnections of
    many clients after a broker restart.
    """
    return float(rng.uniform(0.0, min(maximum, base * 2 ** min(attempt, 30))))


def parse_broker_url(url: str) -> tuple[str, int]:
    """``mqtt://host[:port]`` (or ``tcp://``) to ``(host, port)``; port 1883 by default."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
        raise ConfigError("broker", url, "expected mqtt://host[:port]")
    try:
        port = parts.port or 1883
    except ValueError:
        raise ConfigError("broker", url, "port must be an integer in 1..65535") from None
    return parts.hostname, port


class _Inbox:
    """aiomqtt's message queue, replaced: a deque and one waiter.

    aiomqtt's own iterator starts a task and an ``asyncio.wait`` per message; at a few
    thousand messages per second per process that is a large share of a node's CPU. paho's
    on_message callback (through aiomqtt) appends here, and :meth:`MqttTransport.messages`
    drains it, sleeping on a single future only when it is empty.
    """

    def __init__(self) -> None:
        self.items: deque[aiomqtt.Message] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: aiomqtt.Message) -> None:
        self.items.append(item)
        self.wake()

    def qsize(self) -> int:
        return len(self.items)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class MqttTransport:
    """A :class:`~nlagg_node.runtime.transport.Transport` over aiomqtt.

    Parameters
    ----------
    url : ``mqtt://host:port``.
    client_id : stable identifier (the persistent session is keyed by it).
    will : last will, set at every (re)connection.
    username, password : broker credentials.
    clean_session : False (default) keeps subscriptions and queued QoS 1 messages across reconnects.
    max_inflight : paho's in-flight window for QoS > 0.
    reconnect_tries : attempts per loss of connection before giving up with :class:`NlaggError`.
    backoff_base, backoff_max : the jittered exponential backoff, ``uniform(0, min(max, base 2^k))``.
    """

    def __init__(
        self,
        url: str,
        *,
        client_id: str,
        will: Will | None = None,
        username: str | None = None,
        password: str | None = None,
        clean_session: bool = False,
        max_inflight: int = 1000,
        reconnect_tries: int = 10,
        backoff_base: float = 0.05,
        backoff_max: float = 5.0,
        keepalive: int = 30,
    ) -> None:
        self.host, self.port = parse_broker_url(url)
        self.url = url
        self.client_id = client_id
        self.will = will
        self.username = username
        self.password = password
        self.clean_session = clean_session
        self.max_inflight = max_inflight
        self.reconnect_tries = reconnect_tries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.keepalive = keepalive
        self._client: aiomqtt.Client | None = None
        self._filters: list[tuple[str, int]] = []
        self._lock = asyncio.Lock()
        self._generation = 0
        self._closing = False
        self.reconnects = 0
        self._inbox = _Inbox()
        self._background: set[asyncio.Task[None]] = set()
        # Publishes handed over while a reconnection is in progress: sent, in order, once it is up.
        self._held: deque[tuple[str, bytes, int, bool]] = deque()
        self._up = asyncio.Event()
        self._jitter = rng_for(None)  # OS entropy: backoff jitter is not part of any run's numbers

    def _new_client(self) -> aiomqtt.Client:
        will = None
        if self.will is not None:
            will = aiomqtt.Will(self.will.topic, self.will.payload, self.will.qos, self.will.retain)
        client = aiomqtt.Client(
            self.host,
            self.port,
            identifier=self.client_id,
            username=self.username,
            password=self.password,
            will=will,
            clean_session=self.clean_session,
            protocol=aiomqtt.ProtocolVersion.V311,
            keepalive=self.keepalive,
            max_inflight_messages=self.max_inflight,
            max_queued_outgoing_messages=0,
            socket_options=NODELAY,
            timeout=10.0,
            queue_type=cast("type[asyncio.Queue[aiomqtt.Message]]", lambda maxsize=0: self._inbox),
        )
        client.pending_calls_threshold = 1_000_000  # many concurrent QoS 1 publishes are the normal case
        return client

    async def connect(self) -> None:
        """Connect, retrying with backoff; :class:`NlaggError` names the broker if it stays unreachable."""
        async with self._lock:
            await self._connect_locked()

    async def _connect_locked(self, reuse: aiomqtt.Client | None = None) -> None:
        """Connect a new client, or reconnect ``reuse``: the same paho client keeps its unacknowledged
        QoS 1 messages and resends them once the broker confirms the persistent session."""
        last = ""
        for attempt in range(self.reconnect_tries):
            client = reuse if reuse is not None else self._new_client()
            try:
                await client.__aenter__()
            except aiomqtt.MqttError as exc:
                last = str(exc)
                if "authori" in last.lower() or "bad user" in last.lower():
                    raise NlaggError(f"broker {self.url} refused client {self.client_id!r}: {last}") from None
                delay = jittered_backoff(attempt, self.backoff_base, self.backoff_max, self._jitter)
                log.info("connect to %s failed (%s); retrying in %.2f s", self.url, last, delay)
                await asyncio.sleep(delay)
                continue
            self._client = client
            self._generation += 1
            # Wake the reader when the connection drops (aiomqtt's only signal is this future).
            client._disconnected.add_done_callback(self._on_lost)
            for pattern, qos in self._filters:
                await client.subscribe(pattern, qos=qos)
            while self._held:
                topic, payload, qos, retain = self._held.popleft()
                client._client.publish(topic, payload, qos, retain)
            self._up.set()
            return
        raise NlaggError(f"cannot connect to broker {self.url} after {self.reconnect_tries} tries: {last}")

    def _on_lost(self, fut: asyncio.Future[None]) -> None:
        """The connection dropped: wake the reader (it reconnects). The loss is expected and
        handled, so its exception is retrieved here instead of being logged as never retrieved."""
        if not fut.cancelled():
            fut.exception()
        self._inbox.wake()

    async def _reconnect(self, seen_generation: int) -> None:
        async with self._lock:
            if self._closing:
                raise NlaggError(f"transport {self.client_id!r} is closed")
            if self._generation != seen_generation:
                return  # someone else already reconnected
            old = self._client
            self._client = None
            self._up.clear()
            if old is not None:
                try:
                    await old.__aexit__(None, None, None)
                except aiomqtt.MqttError as exc:
                    log.debug("closing the lost connection: %s", exc)
            self.reconnects += 1
            log.warning("connection to %s lost; reconnecting (%d)", self.url, self.reconnects)
            await self._connect_locked(reuse=old)

    def _require(self) -> tuple[aiomqtt.Client, int]:
        if self._client is None:
            raise NlaggError(f"transport {self.client_id!r} is not connected")
        return self._client, self._generation

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Publish and wait for the broker's acknowledgement (QoS 1); reconnect and resend once if lost."""
        for _attempt in range(2):
            if self._client is None and not self._closing:
                await self._up.wait()  # a reconnection is in progress
            client, gen = self._require()
            try:
                await client.publish(topic, payload, qos=qos, retain=retain)
                return
            except aiomqtt.MqttError as exc:
                log.warning("publish on %s failed: %s", topic, exc)
                await self._reconnect(gen)
        raise NlaggError(f"publish on {topic} failed twice on {self.url}")

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Hand a message to paho without waiting for the acknowledgement.

        QoS 1 delivery is paho's job (it retransmits until PUBACK); per-connection ordering is
        kept. If the connection is down, the message is resent by :meth:`publish` after the
        reconnection, in the background.
        """
        if self._client is None and not self._closing and self._generation > 0:
            self._held.append((topic, payload, qos, retain))  # reconnecting: sent once connected
            return
        client, _gen = self._require()
        info = client._client.publish(topic, payload, qos, retain)  # paho client: no task, no wait
        if info.rc == 0 or (qos > 0 and info.rc == paho_mqtt.MQTT_ERR_NO_CONN):
            return  # sent, or kept by paho and resent after the reconnection (persistent session)
        task = asyncio.get_running_loop().create_task(self.publish(topic, payload, qos=qos, retain=retain))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        for pattern in filters:
            if not valid_filter(pattern):
                raise ConfigError("topic_filter", pattern, "not a valid MQTT topic filter")
        client, _ = self._require()
        for pattern in filters:
            self._filters.append((pattern, qos))
            await client.subscribe(pattern, qos=qos)

    async def messages(self) -> AsyncIterator[Message]:
        """Every received message; survives reconnections; ends when the transport is closed."""
        inbox = self._inbox
        loop = asyncio.get_running_loop()
        while not self._closing:
            client, gen = self._require()
            while inbox.items:
                msg = inbox.items.popleft()
                payload = msg.payload if isinstance(msg.payload, bytes) else str(msg.payload).encode()
                yield Message(msg.topic.value, payload, bool(msg.retain))
            if self._closing:
                return
            lost = client._disconnected
            if lost.done():
                log.warning("connection to %s lost while receiving", self.url)
                await self._reconnect(gen)
                continue
            inbox.waiter = loop.create_future()
            try:
                await inbox.waiter
            finally:
                inbox.waiter = None

    async def close(self) -> None:
        """Clean disconnect (the broker discards the will)."""
        self._closing = True
        self._inbox.wake()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        async with self._lock:
            client, self._client = self._client, None
            if client is not None:
                try:
                    await client.__aexit__(None, None, None)
                except aiomqtt.MqttError as exc:
                    log.debug("disconnect from %s: %s", self.url, exc)

    async def abort(self) -> None:
        """Drop the TCP connection without DISCONNECT, as a crash would (the broker publishes the will)."""
        self._closing = True
        client = self._client
        if client is not None:
            sock = client._client.socket()  # paho's socket: no public way to drop it
            if sock is not None:
                sock.close()
            await asyncio.sleep(0)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
