"""One capture over several brokers: the site brokers of a plan with sites, bridged together.

:class:`MergedSubscriber` holds one acknowledging :class:`~nlagg_node.runtime.mqtt.MqttTransport` per
broker and yields their deliveries as one stream (each broker's in its own order), tagged with the broker
they came from, so that :meth:`MergedSubscriber.ack` sends each acknowledgement back to its own
broker once the transcript has committed it: the zero-loss rule of a single capture holds for
every site. A message bridged from one site to another arrives once per site that has it; the
transcript stores it once (its dedup key is topic + payload, and a bridge forwards both as they
were published).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nlagg_node.errors import ConfigError
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.transport import Inbox, Message, Subscriber
from nlagg_node.runtime.wire import (
    WireError,
    WireMessage,
    XMsg,
    decode,
)

from ..transcript.writer import Transcript

__all__ = ["Acknowledging", "CausalOrder", "MergedSubscriber", "SiteDelivery"]


@runtime_checkable
class Acknowledging(Protocol):
    """A subscriber whose QoS 1 deliveries are acknowledged by the caller, after its commit."""

    def ack(self, deliveries: Iterable[Message]) -> None: ...

    def backlog(self) -> int: ...

    def lost_sessions(self) -> int:
        """Reconnections that found no session (a broker crash): what it had queued is gone."""
        ...


@dataclass(frozen=True)
class SiteDelivery(Message):
    """A message delivered by broker number ``site``, with that broker's own delivery (what its
    acknowledgement needs)."""

    site: int = 0
    delivery: Message | None = None


class MergedSubscriber(Subscriber):
    """Several acking subscribers read as one (see the module docstring).

    Parameters
    ----------
    subscribers : one per broker, each with its own URL and credentials (and the same client id:
        every broker keeps the capture's persistent session under it).
    """

    def __init__(self, subscribers: Sequence[MqttTransport]) -> None:
        if not subscribers:
            raise ConfigError("broker", [], "give at least one broker")
        self.subscribers = list(subscribers)
        self._inbox: Inbox[SiteDelivery] = Inbox()
        self._pumps: list[asyncio.Task[None]] = []

    async def connect(self) -> None:
        """Connect to every broker (all of them, or none: a failure closes those already open)."""
        opened: list[MqttTransport] = []
        try:
            for sub in self.subscribers:
                await sub.connect()
                opened.append(sub)
        except BaseException:
            for sub in opened:
                with contextlib.suppress(Exception):
                    await sub.close()
            raise

    async def subscribe(self, *filters: str, qos: int = 1) -> None:
        """Subscribe to ``filters`` at every broker."""
        for sub in self.subscribers:
            await sub.subscribe(*filters, qos=qos)

    def backlog(self) -> int:
        """Deliveries received from any broker and not yet taken by :meth:`messages`."""
        return len(self._inbox) + sum(sub.backlog() for sub in self.subscribers)

    def lost_sessions(self) -> int:
        """Sessions lost at any broker (each a crash that took what it had queued)."""
        return sum(sub.lost_sessions() for sub in self.subscribers)

    def ack(self, deliveries: Iterable[Message]) -> None:
        """Acknowledge committed deliveries, each to the broker it came from (one write per broker)."""
        by_site: dict[int, list[Message]] = {}
        for d in deliveries:
            if isinstance(d, SiteDelivery) and d.delivery is not None:
                by_site.setdefault(d.site, []).append(d.delivery)
        for site, batch in by_site.items():
            self.subscribers[site].ack(batch)

    async def _pump(self, site: int, sub: MqttTransport) -> None:
        try:
            async for m in sub.messages():
                self._inbox.put(SiteDelivery(m.topic, m.payload, m.retain, site=site, delivery=m))
        finally:
            self._inbox.wake()

    def _finished(self) -> bool:
        for pump in self._pumps:
            error = pump.exception() if pump.done() and not pump.cancelled() else None
            if error is not None:
                raise error
        return all(pump.done() for pump in self._pumps)

    async def messages(self) -> AsyncIterator[SiteDelivery]:
        """Every delivery of every broker; raises as soon as one broker's subscriber gives up."""
        self._pumps = [
            asyncio.create_task(self._pump(k, sub), name=f"capture-site-{k}")
            for k, sub in enumerate(self.subscribers)
        ]
        try:
            async for delivery in self._inbox.drain(self._finished):
                yield delivery
        finally:
            for pump in self._pumps:
                pump.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)

    async def close(self) -> None:
        """Disconnect from every broker (the sessions stay on the brokers)."""
        for pump in self._pumps:
            pump.cancel()
        for sub in self.subscribers:
            await sub.close()


class CausalOrder:
    """Holds back an x captured before the x's it was computed from (a capture over several brokers).

    From one broker, x_j^(t) always comes after every neighbour's x^(t-1) (j needed them), and the
    transcript's window rule (:meth:`adversary.rules.RunRules.waits`) rejects anything else for
    good. Over bridged brokers, x_j^(t) may overtake them: it crossed one bridge while they are still
    in another broker's stream. Such an x waits here (unacknowledged, so nothing is lost) until
    they are stored, then goes to the transcript; after ``grace`` seconds it goes anyway, to be
    judged (a forged x far ahead of the run waits that long, then is rejected as from one broker).
    """

    def __init__(self, transcript: Transcript, grace: float = 5.0) -> None:
        self.transcript = transcript
        self.grace = grace
        self._parked: dict[int, list[tuple[Message, float]]] = {}  # by the iteration it waits for

    def __len__(self) -> int:
        return sum(len(v) for v in self._parked.values())

    def offer(self, raw: Message) -> bool:
        """Park ``raw`` if it is an x whose predecessors are not stored yet; True when parked."""
        rules = self.transcript.rules
        if rules is None or not raw.topic.endswith("/x"):
            return False
        try:
            _, msg = decode(raw.topic, raw.payload, self.transcript.prefix, self.transcript.run_id)
        except WireError:
            return False
        if not isinstance(msg, XMsg) or not rules.waits(msg):
            return False
        self._parked.setdefault(msg.t - 1, []).append((raw, time.monotonic()))
        return True

    def released(self, stored: WireMessage | None) -> list[Message]:
        """What waited for ``stored`` (the message just handled) to be offered again."""
        if not isinstance(stored, XMsg):
            return []
        return [raw for raw, _ in self._parked.pop(stored.t, [])]

    def expired(self, grace: float | None = None) -> list[Message]:
        """What has waited longer than ``grace`` seconds (None: the order's own; 0: everything
        still waiting), to be judged now, oldest iterations first."""
        limit = time.monotonic() - (self.grace if grace is None else grace)
        out: list[Message] = []
        for t in sorted(self._parked):
            old = [raw for raw, since in self._parked[t] if since <= limit]
            if old:
                kept = [(raw, since) for raw, since in self._parked[t] if since > limit]
                out += old
                if kept:
                    self._parked[t] = kept
                else:
                    del self._parked[t]
        return out
