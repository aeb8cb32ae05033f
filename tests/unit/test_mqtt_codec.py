"""The capture client's MQTT 3.1.1 frame codec (the client itself on a scripted server and on Mosquitto:
tests/integration/test_capture.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from nlagg_node.errors import MqttProtocolError
from tests.harness.mqtt_frames import publish_frame


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
