"""The networked node: one participant of a run, talking the wire protocol through a :class:`Transport`.

The protocol is :mod:`~nlagg_node.runtime.wire`'s: v1 messages, and v2 for the sealed z^(0)
exchange (:mod:`~nlagg_node.runtime.seal`).

A node is a composition: its :class:`~nlagg_node.runtime.member.Member` (identity, intake,
z^(0) exchange, departure watch, status, checkpoint store), a
:class:`~nlagg_node.runtime.routing.Router` and, unless a host shares one, its own connection:
``async with`` connects and subscribes, :meth:`Node.run` reads its messages through the router
and runs the protocol loop (:mod:`~nlagg_node.runtime.loop`) with its member as the only one.
Several nodes sharing one connection are run by :func:`~nlagg_node.runtime.hosted.host_nodes`,
through the same router and the same loop.

The math is the simulator's (see :mod:`~nlagg_node.runtime.loop`): a testbed with the run seed
reproduces ``simulate(cfg, trials=1)`` bit for bit.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Generic, Self, TypeVar, Unpack, cast

from ..errors import NeighbourTimeoutError, NlaggError
from ..protocol.identity import Identity
from .auth import signed_will
from .checkpoint import Checkpoint, CheckpointStore
from .loop import run_members
from .member import Member, MemberOptions, NodeResult, Seat
from .public import ConfigMismatchError, build_config_msg, config_from_msg, run_edges
from .routing import Router
from .transport import Message, Will
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


def node_will(
    prefix: str,
    run_id: str,
    node_id: int,
    identity: Identity | None = None,
    *,
    shared: bool = False,
    instance: str | None = None,
) -> Will:
    """The last will of node ``node_id``: retained ``offline`` status (signed with ``identity`` for
    the run ``instance``); ``shared``: an epoch's, on the status topic every epoch shares
    (:class:`~.wire.topics`)."""
    t = topics(prefix, run_id, shared=shared)
    payload = encode(StatusMsg(node=node_id, state="offline", run=t.named))
    return signed_will(Will(t.status(node_id), payload, retain=True, qos=1), identity, instance)


T = TypeVar("T")


class _OfMember(Generic[T]):
    """A read-only attribute of a :class:`Node` that is its member's (the node is a composition)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, node: Node, owner: type[Node] | None = None) -> T:
        return cast(T, getattr(node.member, self.name))


class Node:
    """One node of a run, as an async context manager.

    ``async with Node(cfg, i, s_i, transport, run_id="r1") as node: result = await node.run()``

    Parameters
    ----------
    seat : ``cfg, node_id, value, transport`` (:data:`~nlagg_node.runtime.member.Seat`): the run
        configuration (the same file every node and the launcher read), this node's id, its private
        value s_i (never published, except in a corrupted node's adv state) and its connection to
        the broker. With ``own_transport`` (default) the node connects it, subscribes and reads it;
        otherwise a host (:func:`~nlagg_node.runtime.hosted.host_nodes`) shares one connection
        between several nodes.
    options : the member's (:class:`~nlagg_node.runtime.member.MemberOptions`): ``run_id`` (with
        ``prefix``, the topic namespace), ``edges``, ``corrupt``, ``seed``, ``neighbour_timeout``,
        ``startup_timeout``, ``checkpoint``, ``departure_timeout``, ``leave_after``, ``leave_quietly``.
    """

    def __init__(self, *seat: *Seat, own_transport: bool = True, **options: Unpack[MemberOptions]) -> None:
        self.member = Member(*seat, **options)
        self.transport = self.member.transport
        self.own_transport = own_transport
        self.router = Router([self.member], self._undecodable, self.member.reject)

    # What callers read of the node: its member's --------------------------------------------------
    id = _OfMember[int]("id")
    prefix = _OfMember[str]("prefix")
    run_id = _OfMember[str]("run_id")
    neighbours = _OfMember[list[int]]("neighbours")
    rejected = _OfMember[int]("rejected")
    duplicates = _OfMember[int]("duplicates")
    resumed = _OfMember[Checkpoint | None]("resumed")
    store = _OfMember[CheckpointStore | None]("store")

    def leave(self) -> bool:
        """Leave the run cleanly before the next x (a SIGTERM): publish ``leaving``, no output;
        False before the node's first x, when there is nothing to leave (:meth:`Member.leave`)."""
        return self.member.leave()

    def left(self, t: int) -> NodeResult:
        """This node has left the run cleanly at t: no output."""
        return self.member.left(t)

    def _undecodable(self, topic: str, exc: WireError) -> None:
        self.member.reject(f"{topic}: {exc}")

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

    async def run(self, stop: asyncio.Event | None = None) -> NodeResult:
        """Announce, wait for the neighbours, run every phase, publish ``done``; return the result.

        ``stop`` set (a SIGTERM): the node leaves before its next x, or raises
        :class:`~nlagg_node.errors.StopRequested` before its first one (:func:`run_members`).
        """
        if not self.own_transport:
            raise NlaggError(f"node {self.id}: a node without its own transport is run by host_nodes")
        (result,) = await run_members([self.member], self.router, self.transport, stop)
        return result
