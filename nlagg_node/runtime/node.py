"""The networked node: one participant of a run, talking wire protocol v1 through a :class:`Transport`.

A node is a :class:`~nlagg_node.runtime.member.Member` (identity, barriers, neighbours, outbox,
counters, checkpoint store) that owns its connection: ``async with`` connects and subscribes,
:meth:`Node.run` reads its messages through a :class:`~nlagg_node.runtime.routing.Router` and
runs the protocol loop (:mod:`~nlagg_node.runtime.loop`) with itself as the only hosted node.
Several nodes sharing one connection are run by :func:`~nlagg_node.runtime.hosted.host_nodes`,
through the same router and the same loop.

The math is the simulator's (see :mod:`~nlagg_node.runtime.loop`): a testbed with the run seed
reproduces ``simulate(cfg, trials=1)`` bit for bit.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Literal, Self

from ..config import RunConfig
from ..errors import NeighbourTimeoutError, NlaggError
from ..graphs import IntArray
from .checkpoint import CheckpointStore
from .loop import run_members
from .member import Member, NodeResult
from .public import ConfigMismatchError, build_config_msg, config_from_msg, run_edges
from .routing import Router
from .transport import Message, Transport, Will
from .wire import StatusMsg, WireError, encode, topics

__all__ = [
    "ConfigMismatchError",
    "NeighbourTimeoutError",
    "Node",
    "NodeResult",
    "build_config_msg",
    "config_from_msg",
    "node_will",
    "run_edges",
]

log = logging.getLogger("nlagg.node")


def node_will(prefix: str, run_id: str, node_id: int) -> Will:
    """The last will of node ``node_id``: retained ``offline`` status."""
    payload = encode(StatusMsg(node=node_id, state="offline"))
    return Will(topics(prefix, run_id).status(node_id), payload, retain=True, qos=1)


class Node(Member):
    """One node of a run, as an async context manager.

    ``async with Node(cfg, i, s_i, transport, run_id="r1") as node: result = await node.run()``

    Parameters
    ----------
    cfg : the run configuration (the same file every node and the launcher read).
    node_id : this node's id.
    value : the private value s_i (never published, except in a corrupted node's adv state).
    transport : connection to the broker. With ``own_transport`` (default) the node connects it,
        subscribes and reads it; otherwise a host (:func:`~nlagg_node.runtime.hosted.host_nodes`)
        shares one connection between several nodes.
    run_id, prefix : topic namespace.
    edges : canonical edge list; :func:`run_edges` of ``cfg`` when None.
    corrupt : publish ``adv/{i}/state`` every iteration (the paper's passive corrupted node).
    seed : seed of the private generator ``rng_for(seed, "node", 0, i)``; ``cfg.seed`` by default,
        None for OS entropy (a device in the field).
    neighbour_timeout : seconds a barrier may wait before :class:`NeighbourTimeoutError` names the missing
        neighbours; ``startup_timeout`` for the neighbours to come online (and for a z^(0) exchange).
    checkpoint : where to keep the local checkpoint (written before every publish that depends on the
        node's state); a node restarted with the same store resumes from it with the same numbers.
    departure_timeout : seconds a neighbour's last will (``offline``) must stay before the neighbour
        counts as departed for good (:mod:`nlagg_node.departure`); three quarters of ``neighbour_timeout``
        by default.
    leave_after : publish x^(0) .. x^(T-1), then leave the run cleanly (status ``leaving``).
    leave_quietly : instead of ``leaving``, return once every neighbour has published x^(T) (so
        holds x^(T-1)), for a caller that then dies (``nlagg testbed --depart``: SIGKILL, the will).
    """

    def __init__(
        self,
        cfg: RunConfig,
        node_id: int,
        value: float,
        transport: Transport,
        *,
        run_id: str,
        prefix: str = "nlagg",
        edges: IntArray | None = None,
        corrupt: bool = False,
        seed: int | Literal["config"] | None = "config",
        neighbour_timeout: float = 30.0,
        startup_timeout: float = 60.0,
        own_transport: bool = True,
        checkpoint: CheckpointStore | None = None,
        departure_timeout: float | None = None,
        leave_after: int | None = None,
        leave_quietly: bool = False,
    ) -> None:
        super().__init__(
            cfg, node_id, value, transport, run_id=run_id, prefix=prefix, edges=edges, corrupt=corrupt,
            seed=seed, neighbour_timeout=neighbour_timeout, startup_timeout=startup_timeout,
            checkpoint=checkpoint, departure_timeout=departure_timeout, leave_after=leave_after,
            leave_quietly=leave_quietly,
        )  # fmt: skip
        self.own_transport = own_transport
        self.router = Router([self], self._undecodable, self.reject)

    def _undecodable(self, topic: str, exc: WireError) -> None:
        self.reject(f"{topic}: {exc}")

    def feed(self, msg: Message) -> None:
        """Decode and handle one raw message; malformed or foreign ones are logged and counted."""
        self.router.feed(msg)

    async def __aenter__(self) -> Self:
        if self.own_transport:
            await self.transport.__aenter__()
            await self.transport.subscribe(*self.router.subscriptions())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.own_transport:
            await self.transport.__aexit__(exc_type, exc, tb)

    async def run(self) -> NodeResult:
        """Announce, wait for the neighbours, run every phase, publish ``done``; return the result."""
        if not self.own_transport:
            raise NlaggError(f"node {self.id}: a node without its own transport is run by host_nodes")
        (result,) = await run_members([self], self.router, self.transport)
        return result
