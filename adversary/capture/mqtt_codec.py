"""The MQTT 3.1.1 frames a QoS 1 subscriber needs, as pure functions and one incremental frame reader.

Encoders: CONNECT, SUBSCRIBE, a batch of PUBACKs, PINGREQ, DISCONNECT. Decoders: the fixed header
(:class:`FrameReader` splits a byte stream, in whatever chunks it arrives, into ``(first byte, body)``
frames), CONNACK, SUBACK and PUBLISH. Anything the 3.1.1 specification calls malformed raises
:class:`MqttProtocolError`; the connection that carried it is then beyond repair and must be closed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from nlagg_node.errors import MqttProtocolError

__all__ = [
    "CONNACK",
    "CONNACK_REFUSALS",
    "DISCONNECT_FRAME",
    "MAX_REMAINING_LENGTH",
    "PACKET_NAMES",
    "PINGREQ_FRAME",
    "PINGRESP",
    "PUBLISH",
    "SUBACK",
    "SUBACK_FAILURE",
    "FrameReader",
    "MqttProtocolError",
    "Publish",
    "decode_connack",
    "decode_publish",
    "decode_remaining_length",
    "decode_suback",
    "encode_connect",
    "encode_frame",
    "encode_pubacks",
    "encode_remaining_length",
    "encode_subscribe",
]

# Control packet types (high nibble of the first byte).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
PACKET_NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
}
# The fixed-header flags 3.1.1 prescribes for every type but PUBLISH (section 2.2.2).
_FLAGS = {t: (0b0010 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0) for t in PACKET_NAMES if t != PUBLISH}

MAX_REMAINING_LENGTH = 268_435_455  # four 7-bit digits
PINGREQ_FRAME = b"\xc0\x00"
DISCONNECT_FRAME = b"\xe0\x00"
SUBACK_FAILURE = 0x80
CONNACK_REFUSALS = {
    1: "unacceptable protocol version",
    2: "identifier rejected",
    3: "server unavailable",
    4: "bad user name or password",
    5: "not authorized",
}


class Publish(NamedTuple):
    """A decoded PUBLISH (``packet_id`` is 0 at QoS 0)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int


# Encoding ---------------------------------------------------------------------------------------
def encode_remaining_length(n: int) -> bytes:
    """The variable-length "remaining length" of a fixed header (1 to 4 bytes)."""
    if not 0 <= n <= MAX_REMAINING_LENGTH:
        raise MqttProtocolError(f"remaining length {n} outside 0..{MAX_REMAINING_LENGTH}")
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def encode_frame(first_byte: int, body: bytes) -> bytes:
    """A whole control packet: first byte, remaining length, body."""
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


def _string(value: str | bytes, what: str) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > 0xFFFF:
        raise MqttProtocolError(f"{what} is {len(raw)} bytes, MQTT allows at most 65535")
    return struct.pack(">H", len(raw)) + raw


def encode_connect(
    client_id: str,
    *,
    keepalive: int,
    username: str | None = None,
    password: str | None = None,
    clean_session: bool = False,
) -> bytes:
    """CONNECT, protocol level 4 (3.1.1); the password is sent only with a user name, as 3.1.1 requires."""
    if not 0 <= keepalive <= 0xFFFF:
        raise MqttProtocolError(f"keepalive {keepalive} outside 0..65535 s")
    flags = 0x02 if clean_session else 0
    payload = _string(client_id, "client id")
    if username is not None:
        flags |= 0x80
        payload += _string(username, "user name")
        if password is not None:
            flags |= 0x40
            payload += _string(password.encode("utf-8"), "password")
    variable = _string("MQTT", "protocol name") + struct.pack(">BBH", 4, flags, keepalive)
    return encode_frame(CONNECT << 4, variable + payload)


def encode_subscribe(packet_id: int, filters: Sequence[tuple[str, int]]) -> bytes:
    """One SUBSCRIBE for every ``(topic filter, maximum QoS)``."""
    if not filters:
        raise MqttProtocolError("a SUBSCRIBE needs at least one topic filter")
    body = struct.pack(">H", packet_id)
    for pattern, qos in filters:
        body += _string(pattern, "topic filter") + bytes((qos,))
    return encode_frame(SUBSCRIBE << 4 | 0b0010, body)


def encode_pubacks(packet_ids: Sequence[int]) -> bytes:
    """The PUBACKs of ``packet_ids`` back to back (``40 02 id_hi id_lo`` each), ready for one write."""
    return struct.pack(f">{len(packet_ids)}I", *[0x4002_0000 | mid for mid in packet_ids])


# Decoding ---------------------------------------------------------------------------------------
def decode_remaining_length(data: bytes, pos: int) -> tuple[int, int] | None:
    """``(remaining length, offset of the body)`` from the length digits at ``data[pos:]``.

    None while the digits are incomplete; :class:`MqttProtocolError` past four digits.
    """
    length = 0
    shift = 0
    end = len(data)
    while pos < end:
        digit = data[pos]
        pos += 1
        length |= (digit & 0x7F) << shift
        if not digit & 0x80:
            return length, pos
        shift += 7
        if shift == 28:
            raise MqttProtocolError("malformed frame: remaining length longer than 4 bytes")
    return None


class FrameReader:
    """Splits an MQTT byte stream into ``(first byte, body)`` frames, across arbitrary read boundaries.

    Feed every chunk read from the connection to :meth:`feed` and exhaust what it yields. Bytes of
    an incomplete frame wait (in their chunks, joined once when the frame is complete). After a
    :class:`MqttProtocolError` the stream has lost its framing: drop the connection and the reader.
    """

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0  # bytes held in _chunks
        self._need = 0  # bytes that must be held before the next frame can be complete

    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return self._size

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """Yield every frame completed by ``data``, in stream order."""
        if self._chunks:
            self._chunks.append(data)
            self._size += len(data)
            if self._size < self._need:
                return
            data = b"".join(self._chunks)
            self._chunks, self._size = [], 0
        pos, end = 0, len(data)
        while pos < end:
            first = data[pos]
            kind = first >> 4
            flags = _FLAGS.get(kind)
            if flags is None and kind != PUBLISH:
                raise MqttProtocolError(
                    f"malformed frame: unknown packet type {kind} (first byte {first:#04x})"
                )
            if flags is not None and first & 0x0F != flags:
                raise MqttProtocolError(
                    f"malformed frame: {PACKET_NAMES[kind]} with reserved flags {first & 0x0F:#06b}"
                )
            header = decode_remaining_length(data, pos + 1)
            if header is None:
                self._hold(data[pos:], end - pos + 1)
                return
            length, start = header
            stop = start + length
            if stop > end:
                self._hold(data[pos:], stop - pos)
                return
            yield first, data[start:stop]
            pos = stop

    def _hold(self, rest: bytes, need: int) -> None:
        self._chunks = [rest]
        self._size = len(rest)
        self._need = need


def decode_connack(body: bytes) -> tuple[bool, int]:
    """``(session present, return code)`` of a CONNACK body."""
    if len(body) != 2 or body[0] & 0xFE:
        raise MqttProtocolError(f"malformed CONNACK {body.hex()}")
    return bool(body[0] & 1), body[1]


def decode_suback(body: bytes) -> tuple[int, list[int]]:
    """``(packet id, return code per filter)`` of a SUBACK body (0, 1, 2 granted QoS; 0x80 failure)."""
    if len(body) < 3:
        raise MqttProtocolError(f"malformed SUBACK {body.hex()}")
    codes = list(body[2:])
    if any(code not in (0, 1, 2, SUBACK_FAILURE) for code in codes):
        raise MqttProtocolError(f"malformed SUBACK: return codes {body[2:].hex()}")
    return body[0] << 8 | body[1], codes


def decode_publish(first_byte: int, body: bytes) -> Publish:
    """Topic, payload, QoS, retain, DUP and packet id of a PUBLISH."""
    qos = (first_byte >> 1) & 3
    if qos == 3:
        raise MqttProtocolError("malformed PUBLISH: QoS 3")
    if len(body) < 2:
        raise MqttProtocolError("malformed PUBLISH: no topic length")
    start = 2 + (body[0] << 8 | body[1])
    pos = start + 2 if qos else start
    if pos > len(body):
        raise MqttProtocolError(f"malformed PUBLISH: topic and packet id overrun the {len(body)}-byte body")
    try:
        topic = body[2:start].decode("utf-8")
    except UnicodeDecodeError:
        raise MqttProtocolError(f"malformed PUBLISH: topic {body[2:start]!r} is not UTF-8") from None
    packet_id = 0
    if qos:
        packet_id = body[start] << 8 | body[start + 1]
        if packet_id == 0:
            raise MqttProtocolError(f"malformed PUBLISH: QoS {qos} with packet id 0 on {topic}")
    return Publish(topic, body[pos:], qos, bool(first_byte & 1), bool(first_byte & 8), packet_id)
