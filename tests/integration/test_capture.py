"""The capture's client (the MQTT adapter with ``manual_ack``: ack after commit, acks bound to their
connection, persistent session, refusals, keepalive) on a scripted server and on Mosquitto."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import pytest

from nlagg_node.errors import ConfigError, NlaggError
from nlagg_node.runtime.brokers import free_port, start_mosquitto
from nlagg_node.runtime.mqtt import Delivery, MqttTransport
from nlagg_node.runtime.transport import Subscriber
from tests.harness.mqtt_frames import (
    CONNECT,
    DISCONNECT,
    PINGREQ,
    SUBSCRIBE,
    FrameSplitter,
    encode_frame,
    publish_frame,
)


# A scripted server ---------------------------------------------------------------------------------
class FakeConnection:
    """One client connection to :class:`FakeBroker`: what it sent, and a way to answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames: list[tuple[int, bytes]] = []
        self._parser = FrameSplitter()
        self._unread: list[tuple[int, bytes]] = []

    async def next_frame(self) -> tuple[int, bytes] | None:
        while not self._unread:
            try:
                data = await self.reader.read(65536)
            except ConnectionError:  # the client aborted (what it does with a malformed stream)
                return None
            if not data:
                return None
            self._unread.extend(self._parser.feed(data))
        frame = self._unread.pop(0)
        self.frames.append(frame)
        return frame

    async def expect(self, kind: int) -> bytes:
        frame = await self.next_frame()
        assert frame is not None, f"connection closed while packet type {kind} was expected"
        assert frame[0] >> 4 == kind, f"expected packet type {kind}, got {frame!r}"
        return frame[1]

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def accept(self, *, present: bool = False, code: int = 0) -> None:
        await self.expect(CONNECT)
        self.send(bytes((0x20, 2, int(present), code)))

    async def grant(self, *codes: int) -> None:
        body = await self.expect(SUBSCRIBE)
        self.send(encode_frame(0x90, body[:2] + bytes(codes or (1,))))

    async def until_closed(self, *, answer_pings: bool = True) -> None:
        """Read until the client closes or sends DISCONNECT (then close, as a broker does)."""
        while (frame := await self.next_frame()) is not None and frame[0] >> 4 != DISCONNECT:
            if frame[0] >> 4 == PINGREQ and answer_pings:
                self.send(b"\xd0\x00")

    def kinds(self) -> list[int]:
        return [first >> 4 for first, _ in self.frames]


Script = Callable[[FakeConnection], Awaitable[None]]


class FakeBroker:
    """An MQTT server on loopback whose k-th connection runs ``scripts[k]`` (the last one repeats)."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = scripts
        self.connections: list[FakeConnection] = []
        self.url = ""

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"mqtt://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.close()
        for conn in self.connections:
            conn.writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FakeConnection(reader, writer)
        self.connections.append(conn)
        await self.scripts[min(len(self.connections), len(self.scripts)) - 1](conn)
        writer.close()


async def take(sub: MqttTransport, count: int, within: float = 10.0) -> list[Delivery]:
    got: list[Delivery] = []
    async with asyncio.timeout(within):
        async for msg in sub.messages():
            assert isinstance(msg, Delivery)
            got.append(msg)
            if len(got) == count:
                return got
    return got


async def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    for _ in range(int(within / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"not true within {within} s")


def spy(url: str, **kwargs: Any) -> MqttTransport:
    """The capture's client as ``CaptureSession.subscriber`` makes it, with a short backoff."""
    return MqttTransport(url, client_id="spy", manual_ack=True, backoff_base=0.01, backoff_max=0.05, **kwargs)


@pytest.mark.parametrize(
    "malformed", [b"\x30\xff\xff\xff\xff\x01", b"\x00\x00"], ids=["length-5-bytes", "unknown-type"]
)
async def test_malformed_frame_drops_the_connection_and_acks_stay_with_their_connection(
    malformed: bytes,
) -> None:
    async def first(conn: FakeConnection) -> None:
        await conn.accept()
        await conn.grant(1)
        conn.send(publish_frame("a/1", b"one", qos=1, mid=1) + malformed)
        await conn.until_closed()

    async def second(conn: FakeConnection) -> None:
        await conn.accept(present=True)
        conn.send(publish_frame("a/1", b"one", qos=1, mid=1, dup=True))  # redelivered before the SUBACK
        await conn.grant(1)
        conn.send(publish_frame("a/2", b"two", qos=1, mid=2) + publish_frame("a/q0", b"q0"))
        await conn.until_closed()

    async with FakeBroker(first, second) as broker:
        async with spy(broker.url) as sub:
            await sub.subscribe("a/#")
            got = await take(sub, 4)
            sub.ack(got)  # the first is from the dropped connection: not sent into the new one
            assert sub.reconnects == 1
        await eventually(lambda: DISCONNECT in broker.connections[1].kinds())
    assert [(d.topic, d.payload, d.qos, d.mid) for d in got] == [
        ("a/1", b"one", 1, 1),
        ("a/1", b"one", 1, 1),
        ("a/2", b"two", 1, 2),
        ("a/q0", b"q0", 0, 0),
    ]
    old, new = got[0].connection, got[1].connection
    assert old != new
    assert [d.connection for d in got[1:]] == [new] * 3
    assert sub.acked == 2
    assert broker.connections[0].kinds() == [CONNECT, SUBSCRIBE]
    assert broker.connections[1].frames[2:] == [(0x40, b"\x00\x01"), (0x40, b"\x00\x02"), (0xE0, b"")]


async def test_an_unavailable_server_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    async def refuse(conn: FakeConnection) -> None:
        await conn.accept(code=3)

    async def accept(conn: FakeConnection) -> None:
        await conn.accept()
        await conn.until_closed()

    caplog.set_level(logging.INFO, logger="nlagg.mqtt")
    async with FakeBroker(refuse, refuse, accept) as broker, spy(broker.url) as sub:
        assert len(broker.connections) == 3
        assert sub.reconnects == 0
    assert caplog.text.count("failed (CONNACK code 136); retrying") == 2  # 3.1.1's 3 as paho's reason code


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (1, "unsupported protocol version"),
        (2, "client identifier not valid"),
        (4, "bad user name or password"),
        (5, "not authorized"),
    ],
    ids=["protocol-version", "identifier-rejected", "bad-credentials", "not-authorized"],
)
async def test_refusals_no_retry_can_fix_are_fatal_at_connect_and_later(code: int, reason: str) -> None:
    async def refuse(conn: FakeConnection) -> None:
        await conn.accept(code=code)

    async def accept_then_close(conn: FakeConnection) -> None:
        await conn.accept()

    async with FakeBroker(refuse) as broker:
        expected = re.escape(f"broker {broker.url} refused client 'spy': {reason}")
        with pytest.raises(NlaggError, match=expected):
            await spy(broker.url).connect()
        retried = int(code == 1)  # refused the protocol version, paho tries MQTT 3.1 once (and only once)
        assert len(broker.connections) == 1 + retried
    async with FakeBroker(accept_then_close, refuse) as broker:
        async with spy(broker.url) as sub:
            with pytest.raises(
                NlaggError, match=re.escape(f"broker {broker.url} refused client 'spy': {reason}")
            ):
                await take(sub, 1)
        assert len(broker.connections) == 2 + retried


async def test_missing_pingresp_drops_and_reconnects() -> None:
    async def deaf(conn: FakeConnection) -> None:
        await conn.accept()
        await conn.until_closed(answer_pings=False)

    async def answering(conn: FakeConnection) -> None:
        await conn.accept(present=True)
        await conn.until_closed()

    async with FakeBroker(deaf, answering) as broker, spy(broker.url, keepalive=1) as sub:
        await eventually(lambda: sub.reconnects == 1, within=5.0)
        assert broker.connections[0].kinds() == [CONNECT, PINGREQ]
        # the reconnection is counted when it starts: its connection may not have reached the broker yet
        await eventually(
            lambda: len(broker.connections) > 1 and PINGREQ in broker.connections[1].kinds(), within=3.0
        )
        await asyncio.sleep(1.2)  # past the answered ping's deadline
        assert sub.reconnects == 1


async def test_refused_subscription_names_the_filter() -> None:
    async def partial(conn: FakeConnection) -> None:
        await conn.accept()
        await conn.grant(1)
        await conn.grant(0x80)
        await conn.until_closed()

    async with FakeBroker(partial) as broker, spy(broker.url) as sub:
        await sub.subscribe("allowed/#")
        with pytest.raises(NlaggError, match=r"refused client 'spy': the subscription to 'secret/#'"):
            await sub.subscribe("secret/#")


async def test_gives_up_after_reconnect_tries() -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    with pytest.raises(NlaggError, match=re.escape(f"cannot connect to broker {url} after 3 tries")):
        await spy(url, reconnect_tries=3).connect()


async def test_bad_use_is_refused_with_the_field_named() -> None:
    sub = spy("mqtt://127.0.0.1:1")
    with pytest.raises(ConfigError, match="topic_filter='a/#/b'"):
        await sub.subscribe("a/#/b")
    with pytest.raises(ConfigError, match="qos=2"):
        await sub.subscribe("a/#", qos=2)
    assert isinstance(sub, Subscriber)
    with pytest.raises(ConfigError, match="client_id=''"):
        MqttTransport("mqtt://127.0.0.1:1", client_id="", manual_ack=True)


# Against Mosquitto -----------------------------------------------------------------------------------
@pytest.mark.mosquitto
async def test_persistent_session_redelivers_exactly_what_was_not_acknowledged(mosquitto_url: str) -> None:
    async with MqttTransport(mosquitto_url, client_id="publisher") as pub:
        async with spy(mosquitto_url) as sub:
            await sub.subscribe("cap/#")
            for k in range(10):
                await pub.publish(f"cap/{k}", b"%d" % k, qos=1)
            first = await take(sub, 10)
            sub.ack(first[:6])
            assert sub.acked == 6
        for k in range(10, 15):  # while the capture is away: queued for its session
            await pub.publish(f"cap/{k}", b"%d" % k, qos=1)
        async with spy(mosquitto_url) as sub:  # same client id, no subscribe: the session has it
            again = await take(sub, 9)
            sub.ack(again)
        async with spy(mosquitto_url) as sub:
            await sub.subscribe("cap/#")
            await pub.publish("cap/marker", b"marker", qos=1)
            last = await take(sub, 1)
    assert [d.payload for d in first] == [b"%d" % k for k in range(10)]
    assert sorted(int(d.payload) for d in again) == list(range(6, 15))
    assert [d.payload for d in last] == [b"marker"]  # everything acknowledged stayed acknowledged


@pytest.mark.mosquitto
async def test_mosquitto_refuses_an_anonymous_capture() -> None:
    async with start_mosquitto(allow_anonymous=False) as broker:
        with pytest.raises(
            NlaggError, match=re.escape(f"broker {broker.url} refused client 'spy': not authorized")
        ):
            await spy(broker.url).connect()
