"""The small interfaces a node and a capture talk through, the inbox of their readers, MQTT topic filters.

:class:`Subscriber` receives (all the eavesdropper's capture reads through); :class:`Transport`
also publishes. Two transports: :class:`~nlagg_node.runtime.mqtt.MqttTransport` (the MQTT adapter, paho,
any MQTT 3.1.1 broker) and :class:`~nlagg_node.runtime.memory.MemoryTransport` (an in-process
broker for tests). Every reader hands its messages to its one consumer through an :class:`Inbox`.
Topic matching is paho's :func:`~paho.mqtt.client.topic_matches_sub`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar, runtime_checkable

from paho.mqtt.client import topic_matches_sub

__all__ = ["Inbox", "Message", "Subscriber", "Transport", "Will", "topic_matches", "valid_filter"]

M = TypeVar("M")

#: ``topic_matches(filter, topic)``: MQTT 3.1.1 sec. 4.7 (``a/#`` matches ``a``; wildcards at the
#: first level do not match ``$`` topics).
topic_matches = topic_matches_sub


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
class Subscriber(Protocol):
    """Receive over one broker connection.

    Used as ``async with subscriber: ...`` (connect on enter, clean close on exit; a class that
    names this protocol as a base inherits both). ``messages()`` yields every message of the
    subscriptions, in arrival order; there is one consumer (a single reader task dispatches).
    """

    async def connect(self) -> None: ...

    async def subscribe(self, *filters: str, qos: int = 1) -> None: ...

    def messages(self) -> AsyncIterator[Message]: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


@runtime_checkable
class Transport(Subscriber, Protocol):
    """Publish and subscribe over one broker connection (see :class:`Subscriber`)."""

    async def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Send a message and wait until the broker has it (PUBACK at QoS 1)."""

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        """Queue a message for sending without waiting for the broker (order is kept)."""

    def on_reconnect(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(session_present)`` after every reconnection, once subscribed again
        (False: the broker had lost the session, and with it what it had queued for us)."""

    @property
    def reconnects(self) -> int:
        """Connections lost so far, counted as each loss is seen: before anything the next
        connection delivers (the broker published our last will with each)."""
        return 0


class Inbox(Generic[M]):
    """What a connection's callbacks received, waiting for the one consumer that reads it.

    The callbacks :meth:`put` (or append a batch to :attr:`items` and :meth:`wake` once); the
    consumer iterates :meth:`drain`, which sleeps on a single future only while the inbox is empty
    (no task and no lock per message). A connection that gives up says why with :meth:`fail`.
    """

    def __init__(self) -> None:
        self.items: deque[M] = deque()
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: M) -> None:
        self.items.append(item)
        self.wake()

    def wake(self) -> None:
        """Wake the consumer: items arrived, or its ``finished`` check may have changed."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: BaseException) -> None:
        """End :meth:`drain` with ``error`` once what came before it is read (the first error wins)."""
        if self.error is None:
            self.error = error
        self.wake()

    async def drain(self, finished: Callable[[], bool]) -> AsyncIterator[M]:
        """Every item, in arrival order. Once the inbox is empty, it raises the error given to
        :meth:`fail`, if any; else ``finished()`` decides: True ends the iteration (an exception it
        raises ends it with that error), False waits for :meth:`wake`."""
        loop = asyncio.get_running_loop()
        items = self.items
        while True:
            while items:
                yield items.popleft()
            if self.error is not None:
                raise self.error
            if finished():
                return
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


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
