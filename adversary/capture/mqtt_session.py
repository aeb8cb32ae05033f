"""One connection of the capture client (:class:`adversary.capture.subscriber.AckingSubscriber`).

A :class:`Session` is the asyncio protocol of one TCP (or TLS) connection: it parses every complete
frame of a read in the callback, appends each PUBLISH to the owner's inbox as a :class:`Delivery`
(with the packet id and connection number its acknowledgement needs), hands CONNACK and SUBACK to
the owner, and keeps the connection alive with PINGREQs. The owner reconnects when it is lost.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Protocol

from nlagg_node.runtime.transport import Inbox, Message

from .mqtt_codec import (
    CONNACK,
    PACKET_NAMES,
    PINGREQ_FRAME,
    PINGRESP,
    PUBLISH,
    SUBACK,
    FrameReader,
    MqttProtocolError,
    decode_connack,
    decode_publish,
    decode_suback,
)

__all__ = ["Delivery", "Session", "SessionOwner"]

log = logging.getLogger("nlagg.capture")


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
