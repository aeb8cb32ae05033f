"""MQTT 3.1.1 frames written byte by byte, for clients and servers that misbehave on purpose.

Test tooling only: the nodes and the capture speak MQTT through paho (nlagg_node/runtime/mqtt.py).
Scripted brokers split what a client sends with :class:`FrameSplitter`; hostile clients write their
frames with the encoders. Nothing here validates: a frame is whatever its bytes say.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

__all__ = [
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "DISCONNECT_FRAME",
    "PINGREQ",
    "PUBACK",
    "PUBLISH",
    "SUBSCRIBE",
    "FrameSplitter",
    "Publish",
    "connack_code",
    "connect_frame",
    "decode_publish",
    "encode_frame",
    "puback_frame",
    "publish_frame",
    "remaining_length",
]

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, PINGREQ, DISCONNECT = 1, 2, 3, 4, 8, 12, 14
DISCONNECT_FRAME = b"\xe0\x00"


class Publish(NamedTuple):
    """A PUBLISH as a scripted broker reads it (``packet_id`` 0 at QoS 0)."""

    topic: str
    payload: bytes
    qos: int
    packet_id: int


def remaining_length(n: int) -> bytes:
    """MQTT's variable-length encoding (1 to 4 digits) of a packet's remaining length ``n``."""
    digits = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        digits.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(digits)


def encode_frame(first_byte: int, body: bytes) -> bytes:
    """A whole control packet: first byte, remaining length, body."""
    return bytes((first_byte,)) + remaining_length(len(body)) + body


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def connect_frame(
    client_id: str,
    *,
    keepalive: int = 0,
    username: str | None = None,
    password: str | None = None,
    clean: bool = False,
) -> bytes:
    """CONNECT, protocol level 4, persistent session unless ``clean`` (the password only with a user
    name)."""
    flags, payload = 0x02 if clean else 0, _string(client_id)
    if username is not None:
        flags |= 0x80
        payload += _string(username)
        if password is not None:
            flags |= 0x40
            payload += _string(password)
    return encode_frame(CONNECT << 4, _string("MQTT") + struct.pack(">BBH", 4, flags, keepalive) + payload)


def connack_code(body: bytes) -> int:
    """The return code of a CONNACK body (0: accepted)."""
    return body[1]


def publish_frame(
    topic: str, payload: bytes, *, qos: int = 0, mid: int = 0, retain: bool = False, dup: bool = False
) -> bytes:
    """A PUBLISH frame; QoS 0 (the default) has no packet id and nothing to acknowledge."""
    raw = topic.encode()
    body = struct.pack(">H", len(raw)) + raw + (struct.pack(">H", mid) if qos else b"") + payload
    return encode_frame(0x30 | dup << 3 | qos << 1 | retain, body)


def decode_publish(first_byte: int, body: bytes) -> Publish:
    """Topic, payload, QoS and packet id of a PUBLISH a client sent."""
    qos = (first_byte >> 1) & 3
    start = 2 + (body[0] << 8 | body[1])
    packet_id = body[start] << 8 | body[start + 1] if qos else 0
    return Publish(body[2:start].decode("utf-8"), body[start + 2 if qos else start :], qos, packet_id)


def puback_frame(packet_id: int) -> bytes:
    """The PUBACK of ``packet_id``."""
    return struct.pack(">BBH", PUBACK << 4, 2, packet_id)


class FrameSplitter:
    """Splits a byte stream into ``(first byte, body)`` frames, across arbitrary read boundaries."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """Every frame completed by ``data``, in stream order."""
        buf = self._buffer + data
        pos = 0
        while pos + 2 <= len(buf):
            length, shift, at = 0, 0, pos + 1
            while at < len(buf) and buf[at] & 0x80:
                length |= (buf[at] & 0x7F) << shift
                shift, at = shift + 7, at + 1
            if at >= len(buf):
                break
            length |= buf[at] << shift
            end = at + 1 + length
            if end > len(buf):
                break
            yield buf[pos], buf[at + 1 : end]
            pos = end
        self._buffer = buf[pos:]
