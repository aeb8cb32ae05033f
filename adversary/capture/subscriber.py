"""A subscriber that acknowledges a message to the broker only once the transcript has committed it.

Scope: subscribe-only (it has no publish at all: it is a
:class:`~nlagg_node.runtime.transport.Subscriber`, not a ``Transport``), MQTT 3.1.1, QoS <= 1,
TCP or TLS (``mqtts://``). Everything a node needs from MQTT goes through the adapter
(:mod:`nlagg_node.runtime.mqtt`); this client exists because the capture sees every message of a
run, and its own codec was measured to be worth it (see below).

A small single-threaded asyncio MQTT 3.1.1 client (frames in :mod:`adversary.capture.mqtt_codec`):
deliveries reach the reader as :class:`Delivery` objects carrying their packet id, and
:meth:`AckingSubscriber.ack` sends the PUBACKs after :meth:`adversary.transcript.writer.Transcript.commit`.
With a persistent session (``clean_session=False``, stable client id) the broker keeps every QoS 1
message that was not acknowledged, and everything that arrives while the eavesdropper is down, and
delivers it again after a restart: killing the eavesdropper with SIGKILL loses nothing, and the
transcript's dedup key keeps each message once.

Acknowledgements are bound to the connection they came from: after a reconnection the broker
resends what was unacknowledged (same packet ids, DUP set), so acks of an older connection are
dropped instead of being sent into a session where the packet id may name another message.

Each TCP (or TLS) connection is a :class:`Session`, the asyncio protocol that parses every
complete frame of a read in the callback, appends each PUBLISH to the client's inbox as a
:class:`Delivery` (with the packet id and connection number its acknowledgement needs), hands
CONNACK and SUBACK to the client, and keeps the connection alive with PINGREQs; the client
reconnects when it is lost. The capture sees every message of a run, so the per-message cost is
kept small: a batch of acks is one write, and the reader sleeps on a single future only when its
inbox is empty (no thread, no task per message).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

from nlagg_node.errors import BrokerRefusedError, BrokerUnreachableError, ConfigError, NlaggError
from nlagg_node.rng import rng_for
from nlagg_node.runtime.mqtt_settings import jittered_backoff
from nlagg_node.runtime.tls import TlsSettings, broker_endpoint
from nlagg_node.runtime.transport import Inbox, Message, Subscriber, valid_filter

from .mqtt_codec import (
    CONNACK,
    CONNACK_REFUSALS,
    DISCONNECT_FRAME,
    PACKET_NAMES,
    PINGREQ_FRAME,
    PINGRESP,
    PUBLISH,
    SUBACK,
    SUBACK_FAILURE,
    FrameReader,
    MqttProtocolError,
    decode_connack,
    decode_publish,
    decode_suback,
    encode_connect,
    encode_pubacks,
    encode_subscribe,
)

__all__ = ["AckingSubscriber", "Delivery", "Session", "SessionOwner", "accepts_anonymous"]

log = logging.getLogger("nlagg.capture")

HANDSHAKE_TIMEOUT = 10.0  # seconds for one attempt's TCP connect and CONNACK
FATAL_REFUSALS = (4, 5)  # bad user name or password, not authorized: retrying cannot help


class SessionOwner(Protocol):
    """What a :class:`Session` reports to: the client that opened it."""

    url: str

    def session_accepted(self, session: Session, session_present: bool) -> None:
        """The broker accepted the CONNECT (``session_present``: it kept the persistent session)."""

    def session_lost(self, session: Session) -> None:
        """The connection is gone."""

    def suback(self, packet_id: int, codes: list[int]) -> None:
        """A SUBACK arrived."""


@dataclass(frozen=True)
class Delivery(Message):
    """A received message and what acknowledging it needs (packet id, QoS, connection number)."""

    mid: int = 0
    qos: int = 0
    connection: int = 0


class Session(asyncio.Protocol):
    """One TCP connection: parses what arrives into the owner's inbox, keeps the connection alive."""

    def __init__(self, owner: SessionOwner, inbox: Inbox[Delivery]) -> None:
        self.owner = owner
        self.inbox = inbox
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reader = FrameReader()
        self.connack: asyncio.Future[tuple[bool, int]] = self.loop.create_future()
        self.closed = asyncio.Event()
        self.reason = "closed by the broker"
        self.number = 0  # the connection number, from the moment the broker accepted it
        self.wrote = False  # anything written since the last keepalive tick
        self.ping_ticks = 0  # keepalive ticks since an unanswered PINGREQ (0: none outstanding)
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        inbox = self.inbox.items
        number = self.number
        try:
            for first, body in self.reader.feed(data):
                if first >> 4 == PUBLISH and number:
                    topic, payload, qos, retain, _dup, mid = decode_publish(first, body)
                    if qos > 1:
                        raise MqttProtocolError(f"QoS {qos} PUBLISH on {topic}; subscribed at QoS <= 1")
                    inbox.append(Delivery(topic, payload, retain, mid, qos, number))
                else:
                    self._control(first, body)
                    number = self.number  # a CONNACK accepts the session in the middle of a read
        except MqttProtocolError as exc:
            self.drop(str(exc))
        if inbox:
            self.inbox.wake()

    def _control(self, first: int, body: bytes) -> None:
        kind = first >> 4
        if kind == CONNACK and not self.connack.done():
            present, code = decode_connack(body)
            if code == 0:
                self.owner.session_accepted(self, present)
            self.connack.set_result((present, code))
        elif not self.number:
            raise MqttProtocolError(f"{PACKET_NAMES[kind]} from the broker before an accepting CONNACK")
        elif kind == SUBACK:
            self.owner.suback(*decode_suback(body))
        elif kind == PINGRESP and not body:
            self.ping_ticks = 0
        else:
            raise MqttProtocolError(
                f"unexpected {PACKET_NAMES[kind]} ({len(body)}-byte body) from the broker"
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if exc is not None and self.reason == "closed by the broker":
            self.reason = str(exc) or type(exc).__name__
        self.owner.session_lost(self)
        if not self.connack.done():
            self.connack.set_exception(ConnectionError(f"connection closed before CONNACK: {self.reason}"))
        self.closed.set()

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.wrote = True
        self.transport.write(data)

    def drop(self, reason: str) -> None:
        """Abort the connection (the owner reconnects)."""
        self.reason = reason
        log.warning("dropping the connection to %s: %s", self.owner.url, reason)
        if self.transport is not None:
            self.transport.abort()

    def abandon(self) -> None:
        """Abort a connection that never became a session."""
        if not self.connack.done():
            self.connack.cancel()
        elif not self.connack.cancelled():
            self.connack.exception()  # retrieved: no "never retrieved" warning
        if self.transport is not None:
            self.transport.abort()

    def start_keepalive(self, keepalive: int) -> None:
        """PINGREQ after ``keepalive / 2`` s without a write; drop if no PINGRESP within ``keepalive``."""
        if keepalive > 0:
            self.timer = self.loop.call_later(keepalive / 2, self._tick, keepalive)

    def _tick(self, keepalive: int) -> None:
        if self.ping_ticks >= 2:
            self.drop(f"no PINGRESP within the {keepalive} s keepalive")
            return
        if self.ping_ticks:
            self.ping_ticks += 1
        elif not self.wrote:
            self.write(PINGREQ_FRAME)
            self.ping_ticks = 1
        self.wrote = False
        self.timer = self.loop.call_later(keepalive / 2, self._tick, keepalive)


class AckingSubscriber(Subscriber):
    """Subscribe-only MQTT 3.1.1 client (QoS <= 1): manual acks, persistent session, jittered reconnects.

    Parameters
    ----------
    url : ``mqtt://host:port``, or ``mqtts://host:port`` for MQTT over TLS (asyncio's ``ssl``).
    tls : the CA that verifies the broker and an optional client certificate (``mqtts://`` only;
        without it the system's trust store verifies the broker).
    client_id : stable id: the broker keeps the session (subscriptions, unacknowledged and queued
        QoS 1 messages) under it.
    username, password : broker credentials (the password is sent only with a user name).
    reconnect_tries : consecutive failed attempts before giving up with :class:`NlaggError`.
    backoff_base, backoff_max : jittered exponential backoff ``uniform(0, min(max, base 2^k))``.
    connect_timeout : seconds for the first connection (and for a subscription to be acknowledged).
    keepalive : seconds; a PINGREQ goes out when the client has been silent, and a connection whose
        PINGRESP does not come back within ``keepalive`` is dropped and reconnected (0: off).
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
        tls: TlsSettings | None = None,
    ) -> None:
        endpoint = broker_endpoint(url)
        self.host, self.port = endpoint.host, endpoint.port
        if tls is not None and not endpoint.tls:
            raise ConfigError("broker", url, "TLS files were given: use mqtts://")
        self._ssl: ssl.SSLContext | None = (tls or TlsSettings()).context() if endpoint.tls else None
        if not client_id or len(client_id.encode("utf-8")) > 0xFFFF:
            raise ConfigError(
                "client_id", client_id, "a persistent session needs a non-empty id of <= 65535 bytes"
            )
        if not 0 <= keepalive <= 0xFFFF:
            raise ConfigError("keepalive", keepalive, "must be 0..65535 seconds")
        self.url = url
        self.client_id = client_id
        self.reconnect_tries = reconnect_tries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.reconnects = 0
        self.last_failure = ""  # why the latest connection attempt failed, for the error message
        self.sessions_lost = 0  # reconnections that found no session: what was queued is gone
        self.acked = 0
        self._connect_frame = encode_connect(
            client_id, keepalive=keepalive, username=username, password=password
        )
        self._filters: list[tuple[str, int]] = []
        self._inbox: Inbox[Delivery] = Inbox()
        self._session: Session | None = None  # the accepted connection, None while down
        self._connection = 0
        self._packet_id = 0
        # SUBSCRIBE packet id -> (its filters, subscribe() calls waiting, is it a resubscription)
        self._subacks: dict[int, tuple[list[tuple[str, int]], list[asyncio.Future[None]], bool]] = {}
        self._orphans: list[asyncio.Future[None]] = []  # waiting across a reconnection
        self._task: asyncio.Task[None] | None = None
        self._first: asyncio.Future[None] | None = None
        self._closed = False
        self._fatal: NlaggError | None = None
        self._jitter = rng_for(None)  # OS entropy: not part of any run's numbers

    # connection management ----------------------------------------------------------------------
    async def _run(self) -> None:
        """Connect, wait for the loss, reconnect (jittered backoff after a failed attempt) until closed."""
        failures = 0
        try:
            while not self._closed:
                session = await self._open()
                if session is None:
                    failures += 1
                    if failures >= self.reconnect_tries:
                        raise BrokerUnreachableError(self.url, failures, self.last_failure)
                    await asyncio.sleep(
                        jittered_backoff(failures, self.backoff_base, self.backoff_max, self._jitter)
                    )
                    continue
                failures = 0
                if self._first is not None and not self._first.done():
                    self._first.set_result(None)
                await session.closed.wait()
                if self._closed:
                    return
                self.reconnects += 1
                log.warning("connection to %s lost (%s); reconnecting", self.url, session.reason)
        except NlaggError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: fail loudly through messages(), never leave the reader hanging
            log.exception("capture client for %s failed", self.url)
            self._fail(NlaggError(f"capture client for {self.url} failed: {exc!r}"))

    async def _open(self) -> Session | None:
        """One attempt: TCP connect, CONNECT, CONNACK. None on a failure worth retrying."""
        loop = asyncio.get_running_loop()
        session: Session | None = None
        try:
            async with asyncio.timeout(min(self.connect_timeout, HANDSHAKE_TIMEOUT)):
                _, session = await loop.create_connection(
                    lambda: Session(self, self._inbox),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl is not None else None,
                )
                session.write(self._connect_frame)
                _, code = await session.connack
        except ssl.SSLCertVerificationError as exc:  # retrying cannot help
            if session is not None:
                session.abandon()
            raise NlaggError(
                f"broker {self.url}: its certificate does not verify ({exc.verify_message})"
            ) from None
        except (OSError, TimeoutError) as exc:
            self.last_failure = str(exc) or type(exc).__name__
            log.info("connect to %s failed: %s", self.url, self.last_failure)
            if session is not None:
                session.abandon()
            return None
        except asyncio.CancelledError:
            if session is not None:
                session.abandon()
            raise
        if code == 0:
            return session
        session.abandon()
        reason = CONNACK_REFUSALS.get(code, f"return code {code}")
        if code in FATAL_REFUSALS:
            raise BrokerRefusedError(self.url, self.client_id, code, reason)
        log.warning("broker %s refused client %r: %s; retrying", self.url, self.client_id, reason)
        return None

    def session_accepted(self, session: Session, session_present: bool) -> None:
        """The broker accepted ``session``: number it, resubscribe, start the keepalive."""
        self._connection += 1
        session.number = self._connection
        self._session = session
        session.start_keepalive(self.keepalive)
        if self._filters:
            pid = self._next_packet_id()
            self._subacks[pid] = (list(self._filters), self._orphans, True)
            self._orphans = []
            session.write(encode_subscribe(pid, self._filters))
        if self._connection > 1 and not session_present:
            self.sessions_lost += 1
            log.warning(
                "broker %s kept no session for %r: messages queued meanwhile are lost",
                self.url,
                self.client_id,
            )
        log.info("connected to %s (session present: %s)", self.url, session_present)

    def session_lost(self, session: Session) -> None:
        if self._session is session:
            self._session = None
        for _, waiters, _ in self._subacks.values():  # the resubscription will answer them
            self._orphans.extend(waiters)
        self._subacks.clear()

    def suback(self, packet_id: int, codes: list[int]) -> None:
        entry = self._subacks.pop(packet_id, None)
        if entry is None:
            raise MqttProtocolError(f"SUBACK for packet id {packet_id}, which no SUBSCRIBE used")
        filters, waiters, resubscribed = entry
        if len(codes) != len(filters):
            raise MqttProtocolError(f"SUBACK with {len(codes)} return codes for {len(filters)} filters")
        refused = [
            pattern for (pattern, _), code in zip(filters, codes, strict=True) if code == SUBACK_FAILURE
        ]
        if not refused:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            return
        self._filters = [f for f in self._filters if f[0] not in refused]
        what = "the subscription to " + ", ".join(repr(p) for p in refused)
        error = BrokerRefusedError(self.url, self.client_id, SUBACK_FAILURE, what)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
        if resubscribed:
            self._fail(error)

    def _next_packet_id(self) -> int:
        self._packet_id = self._packet_id % 0xFFFF + 1
        return self._packet_id

    def _fail(self, error: NlaggError) -> None:
        if self._fatal is None:
            self._fatal = error
        waiters = [w for _, ws, _ in self._subacks.values() for w in ws] + self._orphans
        if self._first is not None:
            waiters.append(self._first)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self._subacks.clear()
        self._orphans = []
        self._inbox.fail(error)

    # public interface -----------------------------------------------------------------------------
    async def connect(self) -> None:
        """Start the client and wait for the first connection (or a refusal)."""
        if self._task is not None:
            raise NlaggError(f"{self.client_id}: already connected to {self.url}")
        loop = asyncio.get_running_loop()
        self._closed = False
        self._first = loop.create_future()
        self._task = loop.create_task(self._run(), name=f"mqtt-{self.client_id}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._first
        except TimeoutError:
            await self._stop()
            cause = f" (last attempt: {self.last_failure})" if self.last_failure else ""
            raise NlaggError(
                f"no connection to broker {self.url} within {self.connect_timeout:g} s{cause}"
            ) from None
        except NlaggError:
            await self._stop()
            raise

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        """Subscribe and wait for the SUBACK (again after every reconnection; the session keeps them)."""
        for pattern in filters:
            if not valid_filter(pattern):
                raise ConfigError("topic_filter", pattern, "not a valid MQTT topic filter")
        if qos not in (0, 1):
            raise ConfigError("qos", qos, "the capture client subscribes at QoS 0 or 1")
        if self._fatal is not None:
            raise self._fatal
        added = [(pattern, qos) for pattern in filters]
        self._filters.extend(added)
        if not added or self._task is None:
            return  # not connected yet: connect() subscribes them
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session = self._session
        if session is None:
            self._orphans.append(waiter)  # reconnecting: the resubscription answers
        else:
            pid = self._next_packet_id()
            self._subacks[pid] = (added, [waiter], False)
            session.write(encode_subscribe(pid, added))
        try:
            async with asyncio.timeout(self.connect_timeout):
                await waiter
        except TimeoutError:
            raise NlaggError(
                f"broker {self.url} did not acknowledge the subscription to {list(filters)} "
                f"within {self.connect_timeout:g} s"
            ) from None

    def lost_sessions(self) -> int:
        """Reconnections that found no session (a broker crash): what it had queued is gone."""
        return self.sessions_lost

    def backlog(self) -> int:
        """Messages received but not yet taken by :meth:`messages`."""
        return len(self._inbox)

    def ack(self, deliveries: Iterable[Message]) -> None:
        """Acknowledge deliveries (QoS 1) to the broker, in one write; call only once they are committed."""
        number = self._connection
        mids = [d.mid for d in deliveries if isinstance(d, Delivery) and d.qos > 0 and d.connection == number]
        session = self._session
        if mids and session is not None:
            session.write(encode_pubacks(mids))
            self.acked += len(mids)

    def messages(self) -> AsyncIterator[Message]:
        """Every delivery, in arrival order, across reconnections; raises if the client gave up."""
        return self._inbox.drain(lambda: self._closed)

    async def close(self) -> None:
        """Disconnect cleanly after the acks already written (the session stays on the broker)."""
        if self._task is None:
            return
        session, self._session = self._session, None
        if session is not None and session.transport is not None:
            self._closed = True
            session.write(DISCONNECT_FRAME)
            # The broker closes the connection once it has read the DISCONNECT, so every ack written
            # before it has been taken too (closing first could race a new connection of the same
            # client id, which makes the broker drop what it had not read yet).
            try:
                async with asyncio.timeout(5.0):
                    await session.closed.wait()
            except TimeoutError:
                session.transport.close()
        await self._stop()

    async def _stop(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
        for waiter in [w for _, ws, _ in self._subacks.values() for w in ws] + self._orphans:
            waiter.cancel()
        self._subacks.clear()
        self._orphans = []
        self._inbox.wake()


async def accepts_anonymous(url: str, *, tls: TlsSettings | None = None, within: float = 5.0) -> bool | None:
    """Whether the broker lets a client in without a user name (None: it could not be asked).

    One clean-session CONNECT without credentials, then DISCONNECT. A broker that says yes has no
    per-user ACL for that client: anyone reaching it can publish as any node.
    """
    endpoint = broker_endpoint(url)
    ctx = (tls or TlsSettings()).context() if endpoint.tls else None
    client_id = f"nlagg-probe-{rng_for(None).integers(1 << 62):x}"
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_connection(
                endpoint.host, endpoint.port, ssl=ctx, server_hostname=endpoint.host if ctx else None
            )
            try:
                writer.write(encode_connect(client_id, keepalive=0, clean_session=True))
                head = await reader.readexactly(2)
                body = await reader.readexactly(head[1])
                if head[0] >> 4 != CONNACK:
                    return None
                accepted = decode_connack(body)[1] == 0
                if accepted:
                    writer.write(DISCONNECT_FRAME)
                    await writer.drain()
                return accepted
            finally:
                writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, MqttProtocolError):
        return None
