"""A second start of a deployed plan, and an impostor that plays node j in it from the first start's
transcript with node j's broker password only (issue 43, breaks 2 and 4).

The impostor replays node j's signed messages of the first start verbatim (its statuses, z^(0) and
X25519 key: each verified before run instances existed, as they depend only on identity, prefix
and run id) and sends node j's x's with a value of its own, each with the key-chain element node j
published for that iteration in the first start (the chain was a function of identity and run id
alone). It paces its x's with the neighbours' (each x^(t) once every neighbour's x^(t-1) came), as
node j would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.wire import encode_x, topics

__all__ = ["FirstStart", "Impostor"]


@dataclass(frozen=True)
class FirstStart:
    """Node j's messages of the first start, as its transcript captured them (valid ones)."""

    statuses: list[bytes]  # in capture order
    z0: dict[str, bytes]  # topic -> payload
    keys: list[bytes]
    chain: dict[int, str]  # t -> key-chain element of x_j^(t)

    @classmethod
    def of(cls, db: Path, prefix: str, run_id: str, node: int) -> FirstStart:
        tp = topics(prefix, run_id)
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            rows = con.execute("SELECT topic, payload FROM messages WHERE valid = 1 ORDER BY id").fetchall()
        statuses, keys, z0, chain = [], [], {}, {}
        for topic, raw in rows:
            payload = bytes(raw)
            if topic == tp.status(node):
                statuses.append(payload)
            elif topic == tp.key(node):
                keys.append(payload)
            elif topic.startswith(f"{tp.base}/edge/{node}/"):
                z0[topic] = payload
            elif topic == tp.x(node):
                doc = json.loads(payload)
                chain[int(doc["t"])] = str(doc["k"])
        return cls(statuses, z0, keys, chain)


@dataclass
class Impostor:
    """Node ``node`` in a second start, from ``first`` (:class:`FirstStart`), sending x = ``value``."""

    url: str
    prefix: str
    run_id: str
    node: int
    neighbours: list[int]
    password: str
    first: FirstStart
    value: float
    phase_at: dict[int, str]
    sent: int = 0
    seen: dict[int, set[int]] = field(default_factory=dict)  # t -> neighbours whose x^(t) came
    up: set[int] = field(default_factory=set)  # neighbours seen online or running

    async def play(self) -> None:
        """Replay, then pace the x's until the chain of the first start is used up (or cancelled):
        the z^(0) once every neighbour is online, each x^(t) again every second until every
        neighbour's x^(t) came (what was sent before a neighbour subscribed is lost)."""
        tp = topics(self.prefix, self.run_id)
        transport = MqttTransport(
            self.url,
            client_id=f"nlagg-{self.run_id}-node-{self.node}",
            username=f"node{self.node}",
            password=self.password,
            clean_session=True,
        )
        async with transport:
            filters = [tp.x(j) for j in self.neighbours] + [tp.status(j) for j in self.neighbours]
            await transport.subscribe(*filters)
            got: asyncio.Queue[int] = asyncio.Queue()
            reader = asyncio.create_task(self._read(transport, got))
            try:
                for payload in self.first.keys[:1]:
                    await transport.publish(tp.key(self.node), payload, retain=True)
                online = [s for s in self.first.statuses if b'"online"' in s][:1]
                for payload in online:
                    await transport.publish(tp.status(self.node), payload, retain=True)
                while len(self.up) < len(self.neighbours):
                    await got.get()
                z0 = [transport.publish(topic, payload) for topic, payload in self.first.z0.items()]
                await asyncio.gather(*z0)
                for t in sorted(self.first.chain):
                    x = encode_x(
                        node=self.node, t=t, phase=self.phase_at[t], x=self.value, k=self.first.chain[t]
                    )
                    while len(self.seen.get(t, ())) < len(self.neighbours):
                        await transport.publish(tp.x(self.node), x)
                        self.sent += 1
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(1.0):
                                while len(self.seen.get(t, ())) < len(self.neighbours):
                                    await got.get()
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader

    async def _read(self, transport: MqttTransport, got: asyncio.Queue[int]) -> None:
        async for msg in transport.messages():
            doc = json.loads(msg.payload)
            if msg.topic.endswith("/status"):
                if doc.get("state") in ("online", "running"):
                    self.up.add(int(doc["node"]))
                got.put_nowait(-1)
                continue
            self.seen.setdefault(int(doc["t"]), set()).add(int(doc["node"]))
            got.put_nowait(int(doc["t"]))
