"""The MQTT adapter: everything the runtime knows about paho lives here, behind :class:`MqttTransport`.

paho's client is driven by the asyncio loop directly (paho's documented external-loop mode: its
socket callbacks register the socket with the loop, no thread, no task per message). What this
module owns:

* **Connection.** ``mqtt://host[:port]`` (1883) or ``mqtts://host[:port]`` (8883, TLS with
  :class:`TlsSettings`: a CA file and optionally a client certificate and key). TCP_NODELAY on
  the socket: without it a QoS 1 round trip costs 44 ms (Nagle on one side) or 88 ms (both) instead
  of 0.7 ms (measured with Mosquitto 2.0.11). The blocking TCP/TLS connect runs in a worker thread.
* **Refusals** are read from the CONNACK return code: bad credentials, not authorized, an
  invalid client id or an unsupported protocol fail at once with :class:`BrokerRefusedError`
  (retrying cannot help); a broker that is down or unavailable is retried.
* **Reconnection** with jittered exponential backoff, ``uniform(0, min(max, base 2^k))``, which
  spreads many clients' reconnections after a broker restart. The session is persistent
  (``clean_session=False``, stable client id): the broker keeps subscriptions and queued QoS 1
  messages, and paho resends the QoS 1 messages not yet acknowledged. When the broker has lost
  the session (it crashed without persistence), the adapter subscribes again and tells its
  listeners (:meth:`MqttTransport.on_reconnect`), so the node can republish what its neighbours
  may have missed. After ``reconnect_tries`` failed attempts in a row it gives up with
  :class:`BrokerUnreachableError`, naming the broker and the last attempt's failure.
* paho allows 20 in-flight QoS 1 messages by default; a node publishing every iteration needs more,
  and a host of n nodes publishes n a round. The window is unlimited (0): with any limit paho scans
  every in-flight message on each PUBACK (``_update_inflight``), quadratic in the publishes of a round
  (12% of the in-process testbed's time at n = 200). The protocol bounds what is in flight (a node
  runs at most one iteration ahead of its neighbours).
* **Manual acknowledgement** (``manual_ack=True``, the eavesdropper's capture): a QoS 1 message
  reaches the reader as a :class:`Delivery` and is acknowledged (PUBACK) only when the caller
  says so, after its transcript has committed it (:meth:`MqttTransport.ack`). With the persistent
  session the broker keeps every message not acknowledged, so a capture killed with SIGKILL loses
  nothing. Acknowledgements are bound to the connection a delivery came from: after a
  reconnection the broker resends what was not acknowledged (same packet ids, DUP set), and an
  older connection's ack could name another message of the new one, so it is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from ..errors import BrokerRefusedError, BrokerUnreachableError, ConfigError, NlaggError
from ..rng import rng_for
from .mqtt_settings import FATAL_CONNACK, NOT_AUTHORIZED, jittered_backoff, parse_broker_url
from .tls import TlsSettings, broker_endpoint
from .transport import Inbox, Message, Transport, Will, valid_filter

__all__ = [
    "BrokerRefusedError",
    "Delivery",
    "MqttTransport",
    "TlsSettings",
    "accepts_anonymous",
    "jittered_backoff",
    "parse_broker_url",
]

log = logging.getLogger("nlagg.mqtt")

MAX_INFLIGHT = 0  # paho's in-flight window for QoS > 0: unlimited, no per-ack scan (module docstring)
# Seconds close() waits for its DISCONNECT to go out (on a loaded machine it can take seconds); a
# connection that ends without it makes the broker publish the will.
CLOSE_TIMEOUT = 30.0
DROP_TIMEOUT = 2.0  # seconds a failed attempt's DISCONNECT may take to go out before its socket is dropped
READ_BURST = 64  # packets read per readiness event while each one read was a message (one poll for many)


@dataclass(frozen=True)
class Delivery(Message):
    """A message received with ``manual_ack``: what its acknowledgement needs (packet id, QoS,
    the number of the connection it came on)."""

    mid: int = 0
    qos: int = 0
    connection: int = 0


class MqttTransport(Transport):
    """A :class:`~nlagg_node.runtime.transport.Transport` over paho, MQTT 3.1.1, QoS 1.

    Parameters
    ----------
    url : ``mqtt://host:port`` or ``mqtts://host:port``.
    client_id : stable identifier (the persistent session is keyed by it).
    will : last will, set at every (re)connection.
    username, password : broker credentials.
    clean_session : False (default) keeps subscriptions and queued QoS 1 messages across reconnects.
    reconnect_tries : consecutive failed attempts before giving up with :class:`BrokerUnreachableError`.
    backoff_base, backoff_max : the jittered exponential backoff, ``uniform(0, min(max, base 2^k))``.
    keepalive : seconds of silence before a ping; no answer within as long again drops the connection.
    tls : CA file and client certificate for ``mqtts://`` (None: the system's CAs).
    connect_timeout : seconds for one attempt's TCP/TLS connect and CONNACK.
    connect_within : seconds the first connection may take, all its attempts together (None:
        ``reconnect_tries`` alone bound it).
    manual_ack : QoS 1 messages arrive as :class:`Delivery` and are acknowledged by :meth:`ack`
        only (the capture's ack-after-commit).
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
        reconnect_tries: int = 10,
        backoff_base: float = 0.05,
        backoff_max: float = 5.0,
        keepalive: int = 30,
        tls: TlsSettings | None = None,
        connect_timeout: float = 10.0,
        connect_within: float | None = None,
        manual_ack: bool = False,
    ) -> None:
        where = broker_endpoint(url)
        if tls is not None and not where.tls:
            raise ConfigError("broker", url, "TLS settings (a CA file) need an mqtts:// broker URL")
        if not clean_session and not client_id:
            raise ConfigError("client_id", client_id, "a persistent session needs a non-empty client id")
        self.url = url
        self.host, self.port = where.host, where.port
        self.client_id = client_id
        self.reconnect_tries = reconnect_tries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.connect_within = connect_within
        self.manual_ack = manual_ack
        self._reconnects = 0
        self.session_losses = 0
        self.acked = 0  # PUBACKs sent by :meth:`ack`
        self.attempts = 0  # connection attempts of the current (re)connection
        self.last_failure = ""  # why the latest attempt failed
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=paho.MQTTv311,
            manual_ack=manual_ack,
        )
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.max_queued_messages_set(0)
        if username is not None:
            client.username_pw_set(username, password)
        if will is not None:
            client.will_set(will.topic, will.payload, will.qos, will.retain)
        if where.tls:
            client.tls_set_context((tls or TlsSettings()).context())
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_subscribe = self._on_subscribe
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_socket_register_write
        client.on_socket_unregister_write = self._on_socket_unregister_write
        self._paho = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._inbox: Inbox[Message] = Inbox()
        self._received = 0  # messages handed to the inbox (a read that adds none ends a burst)
        # A Delivery carries the number of its connection; it changes at every CONNACK and every loss,
        # so that an ack of a lost connection is never written into the next one.
        self._connection = 0
        self._filters: list[tuple[str, int]] = []
        self._acks: dict[int, asyncio.Future[None]] = {}  # mid -> PUBACK/SUBACK waiter
        self._subscribing: dict[int, list[tuple[str, int]]] = {}  # SUBSCRIBE mid -> its filters
        self._connack: asyncio.Future[tuple[int, bool]] | None = None
        self._up = asyncio.Event()
        self._lost = asyncio.Event()
        self._sock_gone = asyncio.Event()  # set when paho closes a socket (a failed attempt's, too)
        self._supervisor: asyncio.Task[None] | None = None
        self._misc: asyncio.Task[None] | None = None
        self._fatal: NlaggError | None = None
        self._closing = False
        self._listeners: list[Callable[[bool], None]] = []
        self._jitter = rng_for(None)  # OS entropy: backoff jitter is not part of any run's numbers

    # paho's callbacks (the loop thread, except the socket opening: the connect thread) ---------------
    def _in_loop(self, fn: Callable[..., object], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _on_socket_open(self, client: paho.Client, _ud: object, sock: Any) -> None:
        self._in_loop(self._add_reader, sock)

    def _add_reader(self, sock: Any) -> None:
        assert self._loop is not None
        if sock.fileno() >= 0:
            self._loop.add_reader(sock, self._readable, sock)

    def _readable(self, sock: Any) -> None:
        client = self._paho
        # paho reads one packet per call: go on while each call yields a message (a control packet
        # or an empty socket ends the burst), instead of one poll of the event loop per message.
        for _ in range(READ_BURST):
            before = self._received
            client.loop_read()
            if self._received == before or client.socket() is not sock:
                break
        # An SSL socket may hold decrypted bytes the file descriptor no longer signals.
        pending = getattr(sock, "pending", None)
        while pending is not None and client.socket() is sock and pending() > 0:
            client.loop_read()

    # paho closes a socket right after telling us, and a reconnection does so in the connect thread:
    # the loop, running the unregistration later, would find the socket closed (fileno -1), fail,
    # and keep a stale entry for its descriptor, so that the next socket given the same number
    # would never be read (its CONNACK lost, the attempt timed out). Hence by descriptor, read now.
    def _on_socket_close(self, client: paho.Client, _ud: object, sock: Any) -> None:
        fd = sock.fileno()
        if fd >= 0:
            self._in_loop(self._forget, fd)
            self._in_loop(self._sock_gone.set)

    def _forget(self, fd: int) -> None:
        assert self._loop is not None
        self._loop.remove_reader(fd)
        self._loop.remove_writer(fd)

    def _on_socket_register_write(self, client: paho.Client, _ud: object, sock: Any) -> None:
        self._in_loop(self._add_writer, sock)

    def _add_writer(self, sock: Any) -> None:
        assert self._loop is not None
        if sock.fileno() >= 0:  # not closed meanwhile
            self._loop.add_writer(sock, self._paho.loop_write)

    def _on_socket_unregister_write(self, client: paho.Client, _ud: object, sock: Any) -> None:
        fd = sock.fileno()
        if fd >= 0 and self._loop is not None:
            self._in_loop(self._loop.remove_writer, fd)

    def _on_connect(
        self, client: paho.Client, _ud: object, flags: Any, code: ReasonCode, _props: object
    ) -> None:
        if code.value == 0:
            self._connection += 1  # before any message this read holds after the CONNACK
        fut = self._connack
        if fut is not None and not fut.done():
            fut.set_result((code.value, bool(flags.session_present)))

    def _on_disconnect(
        self, client: paho.Client, _ud: object, _flags: object, code: ReasonCode, _props: object
    ) -> None:
        self._up.clear()
        self._lost.set()
        self._connection += 1  # acks of the lost connection are dropped from now on
        fut = self._connack
        if fut is not None and not fut.done():
            fut.set_result((-1, False))  # closed before the CONNACK
        self._inbox.wake()

    def _on_message(self, client: paho.Client, _ud: object, msg: paho.MQTTMessage) -> None:
        payload = msg.payload
        data = payload if type(payload) is bytes else bytes(payload)
        self._received += 1
        if self.manual_ack:
            self._inbox.put(Delivery(msg.topic, data, msg.retain, msg.mid, msg.qos, self._connection))
        else:
            self._inbox.put(Message(msg.topic, data, msg.retain))

    def _on_publish(self, client: paho.Client, _ud: object, mid: int, _code: object, _props: object) -> None:
        fut = self._acks.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _on_subscribe(
        self, client: paho.Client, _ud: object, mid: int, codes: list[ReasonCode], _props: object
    ) -> None:
        filters = self._subscribing.pop(mid, [])
        fut = self._acks.pop(mid, None)
        if fut is None or fut.done():
            return
        failures = [c for c in codes if c.is_failure]
        if not failures:
            fut.set_result(None)
            return
        refused = [pattern for (pattern, _), c in zip(filters, codes, strict=False) if c.is_failure]
        what = (
            "the subscription to " + ", ".join(map(repr, refused))
            if refused
            else f"a subscription ({failures[0]})"
        )
        fut.set_exception(BrokerRefusedError(self.url, self.client_id, failures[0].value, what))

    # connection management ----------------------------------------------------------------------------
    async def _attempt(self, first: bool) -> tuple[int, bool] | str:
        """One connect: the CONNACK's (code, session present), or why it did not get that far."""
        loop = asyncio.get_running_loop()
        self._connack = loop.create_future()
        try:
            if first:
                await asyncio.to_thread(self._paho.connect, self.host, self.port, self.keepalive)
            else:
                await asyncio.to_thread(self._paho.reconnect)
        except ssl.SSLCertVerificationError as exc:  # retrying cannot help
            raise NlaggError(
                f"broker {self.url}: its certificate does not verify ({exc.verify_message})"
            ) from None
        except (OSError, ValueError) as exc:  # refused, unreachable, TLS handshake (ssl.SSLError)
            return str(exc) or type(exc).__name__
        sock = self._paho.socket()
        if isinstance(sock, socket.socket):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(self.connect_timeout):
                return await self._connack
        except TimeoutError:
            return f"no CONNACK within {self.connect_timeout:g} s"

    async def _connect(self, first: bool) -> bool:
        """Connect, retrying with backoff; the session-present flag. Raises after ``reconnect_tries``."""
        last = self.last_failure = ""
        for attempt in range(self.reconnect_tries):
            self.attempts = attempt + 1
            if attempt:
                await asyncio.sleep(
                    jittered_backoff(attempt, self.backoff_base, self.backoff_max, self._jitter)
                )
            if self._closing:
                raise NlaggError(f"transport {self.client_id!r} is closed")
            outcome = await self._attempt(first and attempt == 0)
            if isinstance(outcome, str):
                last = self.last_failure = outcome
            else:
                code, session_present = outcome
                # paho may have read the close right after the CONNACK (the session taken over) in
                # the same read: up only if still connected, or the loss it signalled goes unseen.
                if code == 0 and self._paho.is_connected():
                    self._up.set()
                    return session_present
                if code in FATAL_CONNACK:
                    raise BrokerRefusedError(self.url, self.client_id, code, FATAL_CONNACK[code])
                last = self.last_failure = (
                    "connection closed right after the CONNACK"
                    if code == 0
                    else f"CONNACK code {code}"
                    if code > 0
                    else "connection closed before the CONNACK"
                )
            await self._drop_attempt()
            log.info("connect to %s failed (%s); retrying", self.url, last)
        raise BrokerUnreachableError(self.url, self.reconnect_tries, last)

    async def _drop_attempt(self) -> None:
        """End a failed attempt's connection before the next attempt starts.

        paho writes the DISCONNECT and closes the socket in this loop, within a moment; a socket
        still open after :data:`DROP_TIMEOUT` is unregistered here (the next attempt closes it).
        Either way nothing of this attempt reaches the next one: its close, seen later, would fail
        the next attempt's wait for its CONNACK.
        """
        sock = self._paho.socket()
        self._sock_gone.clear()
        self._paho.disconnect()
        if sock is None or sock.fileno() < 0:
            return
        try:
            async with asyncio.timeout(DROP_TIMEOUT):
                await self._sock_gone.wait()
        except TimeoutError:
            if sock.fileno() >= 0:
                self._forget(sock.fileno())

    async def _supervise(self) -> None:
        """Keep the connection up: reconnect after every loss, resubscribe if the session is gone."""
        try:
            while True:
                await self._lost.wait()
                self._lost.clear()
                if self._closing:
                    return
                if self._up.is_set():
                    continue  # the loss signalled by an earlier failed attempt
                self._reconnects += 1
                log.warning("connection to %s lost; reconnecting (%d)", self.url, self._reconnects)
                session_present = await self._connect(first=False)
                if not session_present:
                    self.session_losses += 1
                    log.warning("broker %s had lost the session of %r", self.url, self.client_id)
                await self._subscribe_all(self._filters)  # also those a lost connection never sent
                for listener in self._listeners:
                    listener(session_present)
        except NlaggError as exc:
            self._fail(exc)

    def _fail(self, exc: NlaggError) -> None:
        self._fatal = exc
        for fut in self._acks.values():
            if not fut.done():
                fut.set_exception(exc)
        self._acks.clear()
        self._inbox.fail(exc)

    async def _tick(self) -> None:
        """paho's keepalive: pings, and a dropped connection when they go unanswered."""
        while True:
            await asyncio.sleep(1.0)
            self._paho.loop_misc()

    async def connect(self) -> None:
        """Connect (retrying with backoff); :class:`BrokerUnreachableError` names the broker if it stays
        unreachable, :class:`BrokerRefusedError` the return code if it refuses this client."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._closing = False
        try:
            async with asyncio.timeout(self.connect_within):
                await self._connect(first=True)
        except (NlaggError, TimeoutError) as exc:
            self._closing = True
            self._paho.disconnect()
            if isinstance(exc, NlaggError):
                raise
            last = f"{self.last_failure}; " if self.last_failure else ""
            raise BrokerUnreachableError(
                self.url, self.attempts, f"{last}no connection within {self.connect_within:g} s"
            ) from None
        self._supervisor = self._loop.create_task(self._supervise(), name=f"mqtt-{self.client_id}")
        self._misc = self._loop.create_task(self._tick())

    def on_reconnect(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(session_present)`` after every reconnection (subscriptions restored)."""
        self._listeners.append(listener)

    @property
    def reconnects(self) -> int:
        """Connections lost so far (counted before reconnecting)."""
        return self._reconnects

    def _check(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._loop is None or self._closing:
            raise NlaggError(f"transport {self.client_id!r} is not connected")

    def _ack_future(self, mid: int) -> asyncio.Future[None]:
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._acks[mid] = fut
        return fut

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Publish and wait until the broker has it (PUBACK at QoS 1; paho resends across reconnects)."""
        self._check()
        info = self._paho.publish(topic, payload, qos, retain)
        queued = qos > 0 and info.rc == paho.MQTT_ERR_NO_CONN  # sent on reconnection, then acknowledged
        if info.rc != paho.MQTT_ERR_SUCCESS and not queued:
            raise NlaggError(f"publish on {topic} to {self.url} failed: {paho.error_string(info.rc)}")
        if not queued and info.is_published():  # paho's is_published raises while not connected
            return
        fut = self._ack_future(info.mid)
        if not queued and info.is_published():  # acknowledged in between (only possible from another thread)
            self._acks.pop(info.mid, None)
            return
        await fut

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Hand a message to paho without waiting for the acknowledgement.

        QoS 1 delivery is paho's job: it retransmits until PUBACK, after reconnections too, and
        keeps this connection's order.
        """
        self._check()
        info = self._paho.publish(topic, payload, qos, retain)
        if info.rc != paho.MQTT_ERR_SUCCESS and not (qos > 0 and info.rc == paho.MQTT_ERR_NO_CONN):
            raise NlaggError(f"publish on {topic} to {self.url} failed: {paho.error_string(info.rc)}")

    async def _subscribe_all(self, filters: list[tuple[str, int]]) -> None:
        if not filters:
            return
        rc, mid = self._paho.subscribe(filters)
        if rc == paho.MQTT_ERR_NO_CONN or mid is None:
            return  # down: the reconnection subscribes them all again
        if rc != paho.MQTT_ERR_SUCCESS:
            raise NlaggError(f"subscribe to {self.url} failed: {paho.error_string(rc)}")
        self._subscribing[mid] = filters
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._ack_future(mid)
        except TimeoutError:
            self._acks.pop(mid, None)
            self._subscribing.pop(mid, None)
            if self._up.is_set():
                raise NlaggError(f"broker {self.url} did not acknowledge a subscription") from None

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        """Subscribe and wait for the SUBACK (again after every reconnection); a refusal names the filter."""
        for pattern in filters:
            if not valid_filter(pattern):
                raise ConfigError("topic_filter", pattern, "not a valid MQTT topic filter")
        if qos not in (0, 1):
            raise ConfigError("qos", qos, "this client subscribes at QoS 0 or 1")
        self._check()
        added = [(pattern, qos) for pattern in filters]
        self._filters += added
        try:
            await self._subscribe_all(added)
        except BrokerRefusedError:
            self._filters = [f for f in self._filters if f not in added]
            raise

    def ack(self, deliveries: Iterable[Message]) -> None:
        """Acknowledge QoS 1 deliveries (``manual_ack``), once they are committed; those of an
        earlier connection are dropped (the broker resends them on this one)."""
        number = self._connection
        client = self._paho
        for d in deliveries:
            if isinstance(d, Delivery) and d.qos > 0 and d.connection == number:
                client.ack(d.mid, d.qos)
                self.acked += 1

    def backlog(self) -> int:
        """Messages received but not yet taken by :meth:`messages`."""
        return len(self._inbox)

    def lost_sessions(self) -> int:
        """Reconnections that found no session (a broker crash): what it had queued is gone."""
        return self.session_losses

    def messages(self) -> AsyncIterator[Message]:
        """Every received message; survives reconnections; ends when the transport is closed."""
        return self._inbox.drain(lambda: self._closing)

    async def _stop_tasks(self) -> None:
        tasks = [t for t in (self._supervisor, self._misc) if t is not None]
        self._supervisor = self._misc = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Clean disconnect (the broker discards the will), after paho has written what is queued."""
        if self._loop is None or self._closing:
            return
        self._closing = True
        await self._stop_tasks()
        if self._up.is_set():
            self._lost.clear()
            self._paho.disconnect()  # queued after what is not written yet; paho closes once it is
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self._lost.wait()
            except TimeoutError:
                log.warning(
                    "disconnect from %s: no clean close within %g s; the broker will publish the last will",
                    self.url,
                    CLOSE_TIMEOUT,
                )
        self._up.clear()
        self._inbox.wake()

    async def abort(self) -> None:
        """Drop the TCP connection without DISCONNECT, as a crash would (the broker publishes the will)."""
        if self._loop is None or self._closing:
            return
        self._closing = True
        await self._stop_tasks()
        sock = self._paho.socket()
        if sock is not None:
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
            sock.close()
        self._inbox.wake()


async def accepts_anonymous(url: str, *, tls: TlsSettings | None = None, within: float = 5.0) -> bool | None:
    """Whether the broker lets a client in without a user name (None: it could not be asked).

    One clean-session CONNECT without credentials, then DISCONNECT. A broker that says yes has no
    per-user ACL for that client: anyone reaching it can publish as any node.
    """
    probe = MqttTransport(
        url,
        client_id=f"nlagg-probe-{rng_for(None).integers(1 << 62):x}",
        clean_session=True,
        reconnect_tries=1,
        tls=tls if broker_endpoint(url).tls else None,
        connect_timeout=within,
        connect_within=within,
    )
    try:
        await probe.connect()
    except BrokerRefusedError as exc:
        return False if exc.code in NOT_AUTHORIZED else None
    except NlaggError:
        return None
    await probe.close()
    return True
