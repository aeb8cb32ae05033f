"""MQTT 3.1.1 frames written byte by byte, for clients and servers that misbehave on purpose."""

from __future__ import annotations

import struct

from adversary.capture.mqtt_codec import encode_frame

__all__ = ["publish_frame"]


def publish_frame(
    topic: str, payload: bytes, *, qos: int = 0, mid: int = 0, retain: bool = False, dup: bool = False
) -> bytes:
    """A PUBLISH frame; QoS 0 (the default) has no packet id and nothing to acknowledge."""
    raw = topic.encode()
    body = struct.pack(">H", len(raw)) + raw + (struct.pack(">H", mid) if qos else b"") + payload
    return encode_frame(0x30 | dup << 3 | qos << 1 | retain, body)
