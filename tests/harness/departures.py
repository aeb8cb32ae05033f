"""Nodes over the in-memory broker with planned departures: leaving cleanly, or killed (the will)."""

from __future__ import annotations

import asyncio

from nlagg_node.config import RunConfig
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, node_will, run_edges
from nlagg_node.sim import draw_values

__all__ = ["RUN", "DyingTransport", "run_with_departures"]

RUN = "dep"


class DyingTransport(MemoryTransport):
    """Loses its connection (the broker publishes the will) where the node would say ``leaving``:
    a process killed right after publishing its last x."""

    def publish_nowait(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        if b'"leaving"' in payload:
            self.abort()
            return
        super().publish_nowait(topic, payload, qos=qos, retain=retain)


async def run_with_departures(
    cfg: RunConfig, departures: dict[int, int], *, killed: bool, broker: MemoryBroker | None = None
) -> list[NodeResult]:
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    broker = MemoryBroker() if broker is None else broker

    async def one(i: int) -> NodeResult:
        will = node_will("nlagg", RUN, i)
        kind = DyingTransport if killed and i in departures else MemoryTransport
        tr = kind(broker, f"node-{i}", will=will)
        node = Node(
            cfg,
            i,
            s[i],
            tr,
            run_id=RUN,
            edges=edges,
            neighbour_timeout=10.0,
            departure_timeout=0.05,
            leave_after=departures.get(i),
        )
        async with node:
            try:
                return await node.run()
            except Exception:
                if killed and i in departures:
                    return node.left(departures[i])
                raise

    return list(await asyncio.gather(*(one(i) for i in range(cfg.n))))
