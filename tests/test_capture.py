"""The capture client: MQTT 3.1.1 frame codec; AckingSubscriber on a scripted server and on Mosquitto."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import struct
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adversary.capture import AckingSubscriber
from adversary.capture.mqtt_codec import (
    FrameReader,
    Publish,
    decode_connack,
    decode_publish,
    decode_remaining_length,
    decode_suback,
    encode_connect,
    encode_frame,
    encode_pubacks,
    encode_remaining_length,
    encode_subscribe,
)
from adversary.capture.subscriber import Delivery
from nlagg_node.errors import ConfigError, MqttProtocolError, NlaggError
from nlagg_node.runtime.brokers import free_port, mosquitto_binary, start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.transport import Subscriber, Transport

needs_mosquitto = pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto binary not installed")

CONNECT, PUBLISH, PUBACK, SUBSCRIBE, PINGREQ, DISCONNECT = 1, 3, 4, 8, 12, 14


def publish_frame(
    topic: str, payload: bytes, *, qos: int = 0, mid: int = 0, retain: bool = False, dup: bool = False
) -> bytes:
    raw = topic.encode()
    body = struct.pack(">H", len(raw)) + raw + (struct.pack(">H", mid) if qos else b"") + payload
    return encode_frame(0x30 | dup << 3 | qos << 1 | retain, body)


def decode_stream(chunks: list[bytes]) -> list[tuple[int, bytes]]:
    reader = FrameReader()
    frames = [frame for chunk in chunks for frame in reader.feed(chunk)]
    assert reader.pending() == 0
    return frames


STREAM_PUBLISHES = [
    Publish("nlagg/r/node/1/x", b'{"v":1,"x":0.5}', 1, False, False, 1),
    Publish("nlagg/r/config", b"c" * 200, 1, True, False, 65535),  # 2-byte remaining length
    Publish("nlagg/r/node/2/x", b"", 0, False, False, 0),
    Publish("nlagg/r/edge/1/2/z0", b"z" * 20_000, 1, False, True, 7),  # 3-byte remaining length
    Publish("nlagg/\u00e9t\u00e9/x", b"\x00\xff", 1, False, False, 300),
]
STREAM = b"".join(
    publish_frame(p.topic, p.payload, qos=p.qos, mid=p.packet_id, retain=p.retain, dup=p.dup)
    for p in STREAM_PUBLISHES
)
STREAM_WITH_CONTROL = b"\x90\x03\x00\x01\x01" + STREAM + b"\xd0\x00"  # a SUBACK before, a PINGRESP after


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[k : k + size] for k in range(0, len(data), size)]


@pytest.mark.parametrize(
    "size", [len(STREAM_WITH_CONTROL), 1, 2, 3, 5, 64, 4096], ids=["whole", "1", "2", "3", "5", "64", "4096"]
)
def test_publish_stream_decodes_the_same_in_any_chunking(size: int) -> None:
    frames = decode_stream(_chunks(STREAM_WITH_CONTROL, size))
    assert [first >> 4 for first, _ in frames] == [9, 3, 3, 3, 3, 3, 13]
    assert [decode_publish(first, body) for first, body in frames[1:-1]] == STREAM_PUBLISHES


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(STREAM_WITH_CONTROL)), max_size=40))
def test_publish_stream_decodes_the_same_at_any_cut_points(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM_WITH_CONTROL)]
    chunks = [STREAM_WITH_CONTROL[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_stream(chunks) == decode_stream([STREAM_WITH_CONTROL])


@pytest.mark.parametrize(
    ("length", "digits"),
    [(0, 1), (127, 1), (128, 2), (16383, 2), (16384, 3), (2_097_151, 3), (2_097_152, 4), (268_435_455, 4)],
    ids=["0", "127", "128", "16383", "16384", "2097151", "2097152", "max"],
)
def test_remaining_length_round_trips(length: int, digits: int) -> None:
    encoded = encode_remaining_length(length)
    assert len(encoded) == digits
    assert decode_remaining_length(b"\x30" + encoded, 1) == (length, 1 + digits)
    assert decode_remaining_length(b"\x30" + encoded[:-1], 1) is None  # incomplete: wait for more
    if length < 3_000_000:  # a whole frame of that length, read in chunks
        first, body = (0xD0, b"") if length == 0 else (0x30, b"\x00\x01t" + bytes(length - 3))
        frame = encode_frame(first, body)
        assert len(frame) == 1 + digits + length
        assert decode_stream(_chunks(frame, 4096)) == [(first, body)]


def test_remaining_length_over_the_limit_is_refused() -> None:
    with pytest.raises(MqttProtocolError, match="remaining length 268435456 outside"):
        encode_remaining_length(268_435_456)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"\x30\xff\xff\xff\xff\x01", "remaining length longer than 4 bytes"),
        (b"\x00\x00", "unknown packet type 0"),
        (b"\xf0\x00", "unknown packet type 15"),
        (b"\x91\x03\x00\x01\x01", "SUBACK with reserved flags"),
    ],
    ids=["length-5-bytes", "type-0", "type-15", "reserved-flags"],
)
def test_malformed_frame_headers_are_refused(frame: bytes, message: str) -> None:
    reader = FrameReader()
    with pytest.raises(MqttProtocolError, match=message):
        list(reader.feed(frame))


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (lambda: decode_publish(0x36, b"\x00\x01t\x00\x01"), "QoS 3"),
        (lambda: decode_publish(0x30, b"\x00"), "no topic length"),
        (lambda: decode_publish(0x32, b"\x00\x09topic"), "overrun"),
        (lambda: decode_publish(0x32, b"\x00\x01t\x00\x00x"), "packet id 0"),
        (lambda: decode_publish(0x30, b"\x00\x02\xff\xfe"), "not UTF-8"),
        (lambda: decode_connack(b"\x00"), "malformed CONNACK"),
        (lambda: decode_connack(b"\x02\x00"), "malformed CONNACK"),
        (lambda: decode_suback(b"\x00\x01\x03"), "return codes 03"),
    ],
    ids=[
        "qos-3",
        "no-topic",
        "topic-overrun",
        "packet-id-0",
        "topic-not-utf8",
        "connack-short",
        "connack-flags",
        "suback",
    ],
)
def test_malformed_bodies_are_refused(decode: Callable[[], object], message: str) -> None:
    with pytest.raises(MqttProtocolError, match=message):
        decode()


def test_encoders_write_the_3_1_1_bytes() -> None:
    assert encode_connect("c1", keepalive=30, username="u", password="pw") == (
        b"\x10\x15\x00\x04MQTT\x04\xc0\x00\x1e" + b"\x00\x02c1" + b"\x00\x01u" + b"\x00\x02pw"
    )
    assert (
        encode_connect("c1", keepalive=0, clean_session=True)
        == b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x00\x00\x02c1"
    )
    assert (
        encode_subscribe(5, [("a/#", 1), ("b", 0)])
        == b"\x82\x0c\x00\x05" + b"\x00\x03a/#\x01" + b"\x00\x01b\x00"
    )
    assert encode_pubacks([1, 258, 65535]) == b"\x40\x02\x00\x01" + b"\x40\x02\x01\x02" + b"\x40\x02\xff\xff"
    assert decode_connack(b"\x01\x00") == (True, 0)
    assert decode_suback(b"\x00\x05\x01\x80") == (5, [1, 0x80])


# A scripted server ---------------------------------------------------------------------------------
class FakeConnection:
    """One client connection to :class:`FakeBroker`: what it sent, and a way to answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames: list[tuple[int, bytes]] = []
        self._parser = FrameReader()
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


async def take(sub: AckingSubscriber, count: int, within: float = 10.0) -> list[Delivery]:
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


def spy(url: str, **kwargs: Any) -> AckingSubscriber:
    return AckingSubscriber(url, client_id="spy", backoff_base=0.01, backoff_max=0.05, **kwargs)


@pytest.mark.parametrize(
    "malformed",
    [
        b"\x30\xff\xff\xff\xff\x01",
        b"\x00\x00",
        publish_frame("a/3", b"three", qos=2, mid=3),
        b"\x62\x02\x00\x01",
        b"\x20\x02\x00\x00",
    ],
    ids=["length-5-bytes", "unknown-type", "qos-2-publish", "unexpected-pubrel", "second-connack"],
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
    assert [(d.topic, d.payload, d.qos, d.mid, d.connection) for d in got] == [
        ("a/1", b"one", 1, 1, 1),
        ("a/1", b"one", 1, 1, 2),
        ("a/2", b"two", 1, 2, 2),
        ("a/q0", b"q0", 0, 0, 2),
    ]
    assert sub.acked == 2
    assert broker.connections[0].kinds() == [CONNECT, SUBSCRIBE]
    assert broker.connections[1].frames[2:] == [(0x40, b"\x00\x01"), (0x40, b"\x00\x02"), (0xE0, b"")]


@pytest.mark.parametrize(
    ("code", "reason"),
    [(1, "unacceptable protocol version"), (2, "identifier rejected"), (3, "server unavailable")],
    ids=["protocol-version", "identifier-rejected", "server-unavailable"],
)
async def test_transient_connack_refusals_are_retried(
    code: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def refuse(conn: FakeConnection) -> None:
        await conn.accept(code=code)

    async def accept(conn: FakeConnection) -> None:
        await conn.accept()
        await conn.until_closed()

    caplog.set_level(logging.WARNING, logger="nlagg.capture")
    async with FakeBroker(refuse, refuse, accept) as broker, spy(broker.url) as sub:
        assert len(broker.connections) == 3
        assert sub.reconnects == 0
    assert caplog.text.count(f"refused client 'spy': {reason}; retrying") == 2


@pytest.mark.parametrize(
    ("code", "reason"),
    [(4, "bad user name or password"), (5, "not authorized")],
    ids=["bad-credentials", "not-authorized"],
)
async def test_credential_refusals_are_fatal_at_connect_and_later(code: int, reason: str) -> None:
    async def refuse(conn: FakeConnection) -> None:
        await conn.accept(code=code)

    async def accept_then_close(conn: FakeConnection) -> None:
        await conn.accept()

    async with FakeBroker(refuse) as broker:
        expected = re.escape(f"broker {broker.url} refused client 'spy': {reason}")
        with pytest.raises(NlaggError, match=expected):
            await spy(broker.url).connect()
        assert len(broker.connections) == 1
    async with FakeBroker(accept_then_close, refuse) as broker:
        async with spy(broker.url) as sub:
            with pytest.raises(
                NlaggError, match=re.escape(f"broker {broker.url} refused client 'spy': {reason}")
            ):
                await take(sub, 1)
        assert len(broker.connections) == 2


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
    assert not isinstance(sub, Transport)  # subscribe-only: it has no publish at all
    with pytest.raises(ConfigError, match="client_id=''"):
        AckingSubscriber("mqtt://127.0.0.1:1", client_id="")


# Against Mosquitto -----------------------------------------------------------------------------------
@needs_mosquitto
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


@needs_mosquitto
async def test_mosquitto_refuses_an_anonymous_capture() -> None:
    async with start_mosquitto(allow_anonymous=False) as broker:
        with pytest.raises(
            NlaggError, match=re.escape(f"broker {broker.url} refused client 'spy': not authorized")
        ):
            await spy(broker.url).connect()
