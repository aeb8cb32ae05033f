"""Several nodes of one run in one process, over one shared connection (``--in-process``).

One reader (:class:`~nlagg_node.runtime.routing.Router`) decodes every message once and hands it
to the hosted nodes that listen to its sender; each node keeps its own checks (neighbour, window,
duplicates, conflicts) in its own barriers. The iterations run in one loop over all hosted nodes
(:class:`~nlagg_node.runtime.loop.PdmmLoop`): one pdmm step per round over their flat dual
arrays, the same loop a lone :class:`~nlagg_node.runtime.node.Node` runs with h = 1, so the
numbers are bit for bit those of separate processes and of the simulator. Nodes with a
checkpoint store run one loop each, on the same shared reader, and resume on their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import NlaggError
from .loop import run_members
from .member import NodeResult
from .node import Node
from .routing import Router
from .transport import Transport
from .wire import WireError

__all__ = ["host_nodes"]

log = logging.getLogger("nlagg.node")


async def host_nodes(
    nodes: list[Node],
    transport: Transport,
    prefix: str,
    run_id: str,
    on_reject: Callable[[str, WireError], None] | None = None,
) -> list[NodeResult]:
    """Run several nodes over one shared connection: one reader dispatches to all.

    The transport must already be connected; every node must have ``own_transport=False`` and
    the same run configuration. Messages that fail to decode or do not fit the run's schedule
    are logged and passed to ``on_reject(topic, error)``; those that decode but do not fit a
    node's state are counted by that node (``NodeResult.rejected``).
    """
    if not nodes:
        return []
    if any(node.own_transport for node in nodes):
        raise NlaggError("host_nodes: the hosted nodes must be built with own_transport=False")
    if any(node.prefix != prefix or node.run_id != run_id for node in nodes):
        raise NlaggError(f"host_nodes: the hosted nodes must all belong to run {prefix}/{run_id}")

    def reject(topic: str, exc: WireError) -> None:
        log.warning("host: rejected message on %s (%s)", topic, exc)
        if on_reject is not None:
            on_reject(topic, exc)

    members = [node.member for node in nodes]
    router = Router(members, reject)
    await transport.subscribe(*router.subscriptions())
    return await run_members(members, router, transport)
