"""Every node of a run on one memory broker, signed with its identity or not (the in-memory tests
of authentication: tests/unit/test_identity.py, tests/unit/test_forge_fault.py)."""

from __future__ import annotations

import asyncio

from nlagg_node.config import RunConfig
from nlagg_node.protocol import Identity
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, run_edges
from nlagg_node.runtime.result import NodeResult
from nlagg_node.sim import simulate


def memory_network(
    cfg: RunConfig, broker: MemoryBroker, run_id: str, ids: list[Identity] | None
) -> list[Node]:
    """Node i of ``cfg`` with trial 0's value i on ``broker``; ``ids``: each node's identity (every
    message signed, every node holding the public keys), or None (an unsigned run)."""
    edges = run_edges(cfg)
    values = simulate(cfg).values[0]
    keys = None if ids is None else [identity.public for identity in ids]
    return [
        Node(
            cfg,
            i,
            values[i],
            MemoryTransport(broker, f"n{i}"),
            run_id=run_id,
            edges=edges,
            identities=keys,
            identity=None if ids is None else ids[i],
        )
        for i in range(cfg.n)
    ]


async def run_network(nodes: list[Node]) -> list[asyncio.Task[NodeResult]]:
    """Connect every node, then run them together; the tasks once all have ended."""
    async with asyncio.TaskGroup() as tg:
        for node in nodes:
            await node.__aenter__()
        return [tg.create_task(node.run()) for node in nodes]
