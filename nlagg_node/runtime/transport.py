"""The small interface a node talks through, and MQTT topic-filter matching.

Two implementations: :class:`~nlagg_node.runtime.mqtt.MqttTransport` (aiomqtt, any MQTT 3.1.1/5
broker) and :class:`~nlagg_node.runtime.memory.MemoryTransport` (an in-process broker for tests).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

__all__ = ["Message", "Transport", "Will", "topic_matches", "valid_filter"]


@dataclass(frozen=True)
class Message:
    """One received message."""

    topic: str
    payload: bytes
    retain: bool = False


@dataclass(frozen=True)
class Will:
    """A last will: published by the broker if the connection is lost without a clean disconnect."""

    topic: str
    payload: bytes
    retain: bool = True
    qos: int = 1


@runtime_checkable
class Transport(Protocol):
    """Publish/subscribe over one broker connection.

    Used as ``async with transport: ...`` (connect on enter, clean close on exit).
    ``messages()`` yields every message of the subscriptions, in arrival order; there is one
    consumer (a single reader task dispatches).
    """

    async def connect(self) -> None: ...

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Send a message and wait until the broker has it (PUBACK at QoS 1)."""

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Queue a message for sending without waiting for the broker (order is kept)."""

    async def subscribe(self, *filters: str, qos: int = 1) -> None: ...

    def messages(self) -> AsyncIterator[Message]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def valid_filter(pattern: str) -> bool:
    """MQTT topic-filter rules: ``#`` only as the whole last level, ``+`` only as a whole level."""
    if not pattern:
        return False
    levels = pattern.split("/")
    for k, level in enumerate(levels):
        if "#" in level and (level != "#" or k != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def topic_matches(pattern: str, topic: str) -> bool:
    """Does the topic filter ``pattern`` (with ``+`` and ``#``) match ``topic``?

    ``#`` also matches the parent level (``a/#`` matches ``a``), as in MQTT 3.1.1 sec. 4.7.1.2;
    wildcards at the first level do not match topics starting with ``$``.
    """
    if topic.startswith("$") and pattern[:1] in ("+", "#"):
        return False
    p_levels = pattern.split("/")
    t_levels = topic.split("/")
    for k, p in enumerate(p_levels):
        if p == "#":
            return True
        if k >= len(t_levels):
            return False
        if p != "+" and p != t_levels[k]:
            return False
    return len(p_levels) == len(t_levels)
