"""A subscriber that acknowledges a message to the broker only once the transcript has committed it.

paho-mqtt 2.x with ``manual_ack=True`` runs in its own thread; deliveries reach the asyncio side as
:class:`Delivery` objects carrying their packet id, and :meth:`AckingSubscriber.ack` sends the
PUBACKs after :meth:`adversary.transcript.Transcript.commit`. With a persistent session
(``clean_session=False``, stable client id) the broker keeps every QoS 1 message that was not
acknowledged, and everything that arrives while the eavesdropper is down, and delivers it again
after a restart: killing the eavesdropper with SIGKILL loses nothing, and the transcript's dedup
key keeps each message once.

Acknowledgements are bound to the connection they came from: after a reconnection the broker
resends what was unacknowledged (same packet ids, DUP set), so acks of an older connection are
dropped instead of being sent into a session where the packet id may name another message.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from nlagg_node.errors import ConfigError, NlaggError
from nlagg_node.rng import rng_for
from nlagg_node.runtime.mqtt import jittered_backoff, parse_broker_url
from nlagg_node.runtime.transport import Message, valid_filter

__all__ = ["AckingSubscriber", "Delivery"]

log = logging.getLogger("nlagg.capture")


@dataclass(frozen=True)
class Delivery(Message):
    """A received message and what acknowledging it needs (packet id, QoS, connection number)."""

    mid: int = 0
    qos: int = 0
    connection: int = 0


class AckingSubscriber:
    """Subscribe-only MQTT client with manual acknowledgements, persistent session and jittered reconnection.

    Parameters
    ----------
    url : ``mqtt://host:port``.
    client_id : stable id: the broker keeps the session (subscriptions, unacknowledged and queued
        QoS 1 messages) under it.
    username, password : broker credentials.
    reconnect_tries : consecutive failed attempts before giving up with :class:`NlaggError`.
    backoff_base, backoff_max : jittered exponential backoff ``uniform(0, min(max, base 2^k))``.
    connect_timeout : seconds for the first connection.
    """

    def __init__(
        self,
        url: str,
        *,
        client_id: str,
        username: str | None = None,
        password: str | None = None,
        reconnect_tries: int = 40,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        connect_timeout: float = 30.0,
        keepalive: int = 30,
    ) -> None:
        self.host, self.port = parse_broker_url(url)
        self.url = url
        self.client_id = client_id
        self.reconnect_tries = reconnect_tries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.reconnects = 0
        self.acked = 0
        self._filters: list[tuple[str, int]] = []
        self._inbox: deque[Delivery] = deque()
        self._acks: deque[tuple[int, int, int]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection = 0
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._fatal: NlaggError | None = None
        self._thread: threading.Thread | None = None
        self._jitter = rng_for(None)  # OS entropy: not part of any run's numbers
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=False,
            protocol=paho.MQTTv311,
            reconnect_on_failure=False,
            manual_ack=True,
        )
        if username is not None:
            self._client.username_pw_set(username, password)
        self._client.on_connect = self._on_connect
        self._client.on_message = self._on_message
        self._client.on_socket_open = self._on_socket_open

    # paho thread ------------------------------------------------------------------------------
    @staticmethod
    def _on_socket_open(_client: paho.Client, _userdata: Any, sock: Any) -> None:
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _on_connect(self, client: paho.Client, _u: Any, flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self._fail(NlaggError(f"broker {self.url} refused client {self.client_id!r}: {reason}"))
            return
        self._connection += 1
        for pattern, qos in self._filters:
            client.subscribe(pattern, qos)
        log.info("connected to %s (session present: %s)", self.url, flags.session_present)
        self._connected.set()
        self._wake()

    def _on_message(self, _client: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        item = Delivery(msg.topic, bytes(msg.payload), bool(msg.retain), msg.mid, msg.qos, self._connection)
        self._inbox.append(item)
        if self._waiter is not None:  # the reader sets its waiter before it looks at the inbox
            self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_in_loop)

    def _wake_in_loop(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: NlaggError) -> None:
        self._fatal = error
        self._stop.set()
        self._wake()

    def _open(self, first: bool) -> bool:
        try:
            if first:
                self._client.connect(self.host, self.port, keepalive=self.keepalive)
            else:
                self._client.reconnect()
        except OSError as exc:
            log.info("connect to %s failed: %s", self.url, exc)
            return False
        return True

    def _run(self) -> None:
        """Connect, loop, send pending acks, reconnect with jittered backoff on any loss."""
        up, first, failures = False, True, 0
        while not self._stop.is_set():
            if not up:
                if self._open(first):
                    up, first = True, False
                else:
                    failures += 1
                    if failures >= self.reconnect_tries:
                        self._fail(NlaggError(f"cannot connect to broker {self.url} after {failures} tries"))
                        return
                    self._stop.wait(
                        jittered_backoff(failures, self.backoff_base, self.backoff_max, self._jitter)
                    )
                    continue
            rc = self._client.loop(timeout=0.02)
            if self._connected.is_set():
                failures = 0
            self._send_acks()
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not self._stop.is_set():
                up = False
                self._connected.clear()
                self.reconnects += 1
                log.warning("connection to %s lost (%s); reconnecting", self.url, rc)
        self._send_acks()

    def _send_acks(self) -> None:
        while self._acks:
            mid, qos, connection = self._acks.popleft()
            if connection == self._connection and self._connected.is_set():
                self._client.ack(mid, qos)
                self.acked += 1

    # asyncio side -----------------------------------------------------------------------------
    async def connect(self) -> None:
        """Start the client thread and wait for the first connection (or a refusal)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"mqtt-{self.client_id}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.connect_timeout
        while not self._connected.is_set():
            if self._fatal is not None:
                raise self._fatal
            if time.monotonic() > deadline:
                self._stop.set()
                raise NlaggError(f"no connection to broker {self.url} within {self.connect_timeout:g} s")
            await asyncio.sleep(0.01)

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        """Subscribe (again after every reconnection; the persistent session keeps them anyway)."""
        for pattern in filters:
            if not valid_filter(pattern):
                raise ConfigError("topic_filter", pattern, "not a valid MQTT topic filter")
        for pattern in filters:
            self._filters.append((pattern, qos))
            self._client.subscribe(pattern, qos)

    def backlog(self) -> int:
        """Messages received but not yet taken by :meth:`messages`."""
        return len(self._inbox)

    def ack(self, deliveries: Iterable[Message]) -> None:
        """Acknowledge deliveries (QoS 1) to the broker; call only once they are committed."""
        for d in deliveries:
            if isinstance(d, Delivery) and d.qos > 0:
                self._acks.append((d.mid, d.qos, d.connection))

    async def messages(self) -> AsyncIterator[Message]:
        """Every delivery, in arrival order, across reconnections; raises if the client gave up."""
        loop = asyncio.get_running_loop()
        while True:
            while self._inbox:
                yield self._inbox.popleft()
            if self._fatal is not None:
                raise self._fatal
            if self._stop.is_set():
                return
            self._waiter = loop.create_future()
            try:
                if not self._inbox and self._fatal is None:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
                    # coincides with the wake-up, and the reader would never stop.
                    async with asyncio.timeout(0.5):
                        await self._waiter
            except TimeoutError:
                pass
            finally:
                self._waiter = None

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        raise NlaggError(f"{self.client_id}: the capture client only subscribes (not {topic})")

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        raise NlaggError(f"{self.client_id}: the capture client only subscribes (not {topic})")

    async def close(self) -> None:
        """Send the pending acks, disconnect cleanly (the session stays on the broker), stop the thread."""
        if self._thread is None:
            return
        self._stop.set()
        thread, self._thread = self._thread, None
        await asyncio.to_thread(thread.join, 5.0)
        if self._connected.is_set():
            self._client.disconnect()
            self._client.loop(timeout=0.1)
        self._connected.clear()

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
