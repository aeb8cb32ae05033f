"""Message routing: one reader decodes every message once and hands it to the members it concerns.

The same router serves a lone node (one member, its own connection, subscribed to exactly its
topics) and an in-process host (every member of the process, one shared connection, subscribed
with wildcards). Dispatch is by sender: an x or a status of node j goes to the members that
have j as a neighbour (so does its public key in a sealed run), a z^(0) to its addressee, the
retained run config to every member.
In a run with identities every message must carry its sender's signature
(:func:`nlagg_node.protocol.identity.signature_error`, checked once per message, before anything
else reads it); in a run without, none may carry one.
The form check of an x (:func:`nlagg_node.protocol.x_form_error`: its iteration, phase and
fields) is made once per message, then each listening member's barrier decides (window,
duplicate, conflict: :func:`nlagg_node.protocol.admit`).

What does not decode, or does not fit the run's schedule, goes to ``on_reject``; what no
member listens to goes to ``on_unrouted`` (a lone node counts both as rejected; a host with
wildcard subscriptions sees other nodes' statuses as a matter of course and drops them).
A status or key of another run, on the topics the epochs of a continuous deployment share (a
neighbour's retained status of the epoch before), is stale: counted in :attr:`Router.stale` and
logged at debug, never taken as this run's (its ``done`` ends nothing, its ``offline`` departs nobody).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from ..errors import NlaggError
from ..protocol import NO_HALT, halt_span, x_form_error, x_value_error
from ..protocol.chain import ChainCheck, chain_check, x_key_error
from ..protocol.equivocation import x_conflict_error
from ..protocol.identity import signature_error
from ..termination import NO_STOP, Fields
from .barrier import Outcome
from .intake import Inlet
from .member import Member
from .transport import Message, Transport
from .wire import (
    ConfigMsg,
    HotDecoder,
    KeyMsg,
    SealedZ0Msg,
    StatusMsg,
    WireError,
    XItem,
    XMsg,
    Z0Msg,
    split_x_batch,
    stale_run,
)

__all__ = ["Router"]

log = logging.getLogger("nlagg.node")

RowPut = Callable[[int, list[int], list[float]], list[Outcome] | None]  # Barrier.put_row

_ROW_PLANS = 64  # sequences of a batch's senders whose rows are kept (a host's is one)
_KEPT_X = 8  # iterations of x payloads kept per sender for a conflict's proof


class Router:
    """Dispatches a connection's messages to ``members`` (all of one run, one configuration).

    Parameters
    ----------
    members : the nodes this connection serves.
    on_reject : ``(topic, error)`` for a message that does not decode or fit the schedule.
    on_unrouted : ``(reason)`` for a decoded message that no member listens to; None drops it.
    """

    def __init__(
        self,
        members: list[Member],
        on_reject: Callable[[str, WireError], None],
        on_unrouted: Callable[[str], None] | None = None,
    ) -> None:
        if not members:
            raise NlaggError("a router needs at least one member")
        first = members[0]
        if any((m.public, m.run_id, m.prefix) != (first.public, first.run_id, first.prefix) for m in members):
            raise NlaggError("the nodes of one connection must share one run configuration and run id")
        self.members = members
        self.prefix, self.run_id = first.prefix, first.run_id
        self.on_reject = on_reject
        self.on_unrouted = on_unrouted
        self.decode = HotDecoder(self.prefix, self.run_id).decode
        self.split = partial(split_x_batch, prefix=self.prefix, run_id=self.run_id)
        # A host's batches: per sequence of senders, each listener's row (see _row_plan).
        self._row_plans: dict[
            tuple[int, ...], list[tuple[Member, RowPut, list[int], list[int], list[int]]] | None
        ]
        self._row_plans = {}
        self.verifier = first.verifier  # None: a run without identities (and no message may be signed)
        self.chains: dict[int, ChainCheck] = {}  # each sender's x key chain, from its signed anchor
        self.x_payloads: dict[int, dict[int, bytes]] = {}  # each sender's recent x's taken (signed runs)
        self.shape = first.shape
        self.far = {t: t + 1 for t in self.shape.jumps}  # a phase start may follow a long skip
        self.by_id = {m.id: m for m in members}
        self.stale = 0  # statuses and keys of other runs (other epochs, on shared topics)
        self.listeners: dict[int, list[Member]] = {}
        # Per sender, each listener's inlet: (member, put, slot, keep_quiet) (see Member.x_inlet).
        self.x_routes: dict[int, list[tuple[Member, *Inlet]]] = {}
        for m in members:
            for j in m.neighbours:
                self.listeners.setdefault(j, []).append(m)
                self.x_routes.setdefault(j, []).append((m, *m.x_inlet(j)))

    def subscriptions(self) -> list[str]:
        """A lone member's own topics; several members share wildcard filters."""
        if len(self.members) == 1:
            return self.members[0].subscriptions()
        t = self.members[0].topics
        keys = [t.key("+")] if self.members[0].keys is not None else []
        return [t.x("+"), t.x_batches, t.status("+"), t.z0("+", "+"), *keys]

    def _unrouted(self, why: str) -> None:
        if self.on_unrouted is not None:
            self.on_unrouted(why)

    def _keep_x(self, j: int, t: int, payload: bytes) -> None:
        """Keep x_j^(t)'s payload as taken (the first one of its slot) for a conflict's proof, a few
        iterations back (the barrier's window is two)."""
        held = self.x_payloads.setdefault(j, {})
        if t not in held:
            held[t] = payload
            if len(held) > _KEPT_X:
                del held[min(held)]

    def _taken_x(self, j: int, t: int) -> bytes | None:
        return self.x_payloads.get(j, {}).get(t)

    def _forged(self, raw: Message, sender: int | None, sig: str | None) -> bool:
        """Whether a message fails the run's signature rule (then it is rejected here)."""
        why = signature_error(self.verifier, raw.topic, sender, raw.payload, sig is not None)
        if why is not None:
            self.on_reject(raw.topic, WireError("sig", sender, why))
        return why is not None

    def _routes_of(self, topic: str, msg: XMsg) -> list[tuple[Member, *Inlet]] | None:
        """The listeners of x_j^(t) (decoded, on node j's topic) once its form and key pass (checked
        once per message, whatever the listeners); None: refused or unrouted (reported)."""
        t, j = msg.t, msg.node
        why = x_form_error(self.shape, j, t, msg.phase, msg.quiet, msg.stop, msg.departures, msg.cand)
        why = why or x_value_error(self.shape, j, t, msg.x, msg.cand)
        if why is not None:
            self.on_reject(topic, WireError("x", (j, t, msg.phase), why))
            return None
        routes = self.x_routes.get(j)
        if routes is None:
            self._unrouted(f"x from node {j}, not a neighbour of {sorted(self.by_id)}")
            return None
        if (self.verifier is not None or msg.k is not None or msg.sig is not None) and (
            why := x_key_error(self.verifier is not None, self.chains.get(j), j, t, msg.k, msg.sig)
        ):
            self.on_reject(topic, WireError("k", j, why))
            return None
        return routes

    def _fields(self, msg: XMsg) -> tuple[Fields | None, tuple[int, int]]:
        """An x's early-stop fields (None: a run without) and its halt span, the same for every listener."""
        if msg.quiet is None:
            return None, NO_HALT
        t, stop, deps = msg.t, msg.stop, msg.departures
        fields = (msg.quiet, NO_STOP if stop is None else stop, tuple(deps or ()), msg.cand)
        return fields, (halt_span(self.shape, t, stop, deps) if stop == t else NO_HALT)

    def _take_x(self, topic: str, payload: bytes, msg: XMsg) -> None:
        """x_j^(t) (decoded) on node j's topic: its form and key checked once, then each listener's
        barrier admits it or not (:func:`~nlagg_node.protocol.admit`)."""
        routes = self._routes_of(topic, msg)
        if routes is not None:
            self._hand_over(topic, payload, msg, routes)

    def _hand_over(self, topic: str, payload: bytes, msg: XMsg, routes: list[tuple[Member, *Inlet]]) -> None:
        """x_j^(t), its form and key passed, to each of its listeners' barriers, one after the other."""
        j, t, x = msg.node, msg.t, msg.x
        fields, halt = self._fields(msg)
        for m, put, slot, keep_quiet in routes:
            outcome = put(t, slot, x)
            if outcome == "conflict" and self.verifier is not None:
                # Only now is an x's signature verified: a copy is refused, an equivocation proven.
                verdict = x_conflict_error(self.verifier, topic, j, t, self._taken_x(j, t), payload)
                if isinstance(verdict, str):
                    self.on_reject(topic, WireError("sig", j, verdict))
                    return
                raise verdict
            if outcome != "new":
                m.count_x(outcome, j, t, x)
            elif fields is not None:
                keep_quiet(t, slot, fields)
                if halt != NO_HALT:
                    m.x_in.halted(slot, halt)  # its last x of the phase: a later one is refused
        if self.verifier is not None:
            self._keep_x(j, t, payload)

    def _take_row(self, items: list[XItem]) -> None:
        """A host's batch of x's of one iteration in a run without identities: each x checked as
        :meth:`_take_x` checks it, then handed to each listener's barrier as one row
        (:meth:`~nlagg_node.runtime.barrier.Barrier.put_row`: the same verdicts as one put per x).

        What follows a verdict is what :meth:`_take_x` does, in the same order (by x, then by
        listener): a duplicate counted, a conflict ending the run, a new x's fields kept. Without
        identities no verdict stops the hand-off of an x midway, so handing it over by listener
        instead of by x gives every barrier the same values.
        """
        checked = [(it, routes) for it in items if (routes := self._routes_of(it.topic, it.msg)) is not None]
        if not checked:
            return
        taken = [(it.msg, routes) for it, routes in checked]
        nodes = tuple(msg.node for msg, _ in taken)
        if nodes not in self._row_plans:
            if len(self._row_plans) >= _ROW_PLANS:  # a host sends one sequence: others are rare
                self._row_plans.clear()
            self._row_plans[nodes] = self._row_plan([routes for _, routes in taken], len(set(nodes)))
        plan = self._row_plans[nodes]
        if plan is None:  # a node twice in one batch: one x at a time
            for it, routes in checked:
                self._hand_over(it.topic, it.payload, it.msg, routes)
            return
        t = taken[0][0].t
        xs = [msg.x for msg, _ in taken]
        late: list[tuple[int, int, Member, Outcome]] = []
        for m, put_row, slots, picks, order in plan:
            verdicts = put_row(t, slots, [xs[p] for p in picks])
            if verdicts is not None:
                late += [(picks[k], order[k], m, v) for k, v in enumerate(verdicts) if v != "new"]
        if late:
            late.sort(key=lambda v: (v[0], v[1]))
            for p, _, m, verdict in late:
                msg = taken[p][0]
                m.count_x(verdict, msg.node, t, msg.x)
        sent = [self._fields(msg) for msg, _ in taken]  # the early-stop fields of each new x
        if all(fields is None for fields, _ in sent):
            return
        refused = {(p, m.id) for p, _, m, _ in late} if late else None
        for m, _, slots, picks, _ in plan:
            kept = [
                (slot, fields)
                for slot, p in zip(slots, picks, strict=True)
                if (fields := sent[p][0]) is not None and (refused is None or (p, m.id) not in refused)
            ]
            m.intake.keep_quiet_row(t, kept)
        for p, (_, halt) in enumerate(sent):
            if halt != NO_HALT:
                for m, _, slot, _ in taken[p][1]:
                    if refused is None or (p, m.id) not in refused:
                        m.x_in.halted(slot, halt)  # its last x of the phase: a later one is refused

    def _row_plan(
        self, routes: list[list[tuple[Member, *Inlet]]], distinct: int
    ) -> list[tuple[Member, RowPut, list[int], list[int], list[int]]] | None:
        """For x's of these senders (their routes, in batch order): each listener's barrier row
        (its slots, the x's positions in the batch, each route's rank among the x's listeners).
        None when a sender comes twice."""
        if distinct != len(routes):
            return None
        rows: dict[int, tuple[Member, RowPut, list[int], list[int], list[int]]] = {}
        for p, listeners in enumerate(routes):
            for rank, (m, _, slot, _) in enumerate(listeners):
                row = rows.get(m.id)
                if row is None:
                    row = rows[m.id] = (m, m.x_in.put_row, [], [], [])
                row[2].append(slot)
                row[3].append(p)
                row[4].append(rank)
        return list(rows.values())

    def feed(self, raw: Message) -> None:
        """Decode one raw message and dispatch it (raises only for a contradicting run config).

        A host's batch (:func:`~nlagg_node.runtime.wire.split_x_batch`) is taken as the x's it
        carries, each on its node's own topic, as if its node had published it alone."""
        try:
            batch = self.split(raw.topic, raw.payload)
            if batch is None:
                info, msg = self.decode(raw.topic, raw.payload)
        except WireError as exc:
            self.on_reject(raw.topic, exc)
            return
        if batch is not None:
            items, refused = batch
            for _, error in refused:
                self.on_reject(raw.topic, error)
            if self.verifier is None and len(items) > 1 and len({it.msg.t for it in items}) == 1:
                self._take_row(items)
            else:
                for item in items:
                    self._take_x(item.topic, item.payload, item.msg)
        elif isinstance(msg, XMsg):
            self._take_x(raw.topic, raw.payload, msg)
        elif self._forged(raw, info.node, getattr(msg, "sig", None)):
            return
        elif isinstance(msg, Z0Msg | SealedZ0Msg):
            target = self.by_id.get(msg.to)
            if target is None:
                self._unrouted(f"z0 from node {msg.from_} to node {msg.to}, not hosted here")
            elif isinstance(msg, Z0Msg):
                target.on_z0(msg)
            else:
                target.on_sealed_z0(msg)
        elif isinstance(msg, KeyMsg | StatusMsg):
            if (other := stale_run(msg, self.run_id)) is not None:
                self.stale += 1
                log.debug(
                    "%s of run %s on %s: stale, not this run's (%s)", info.kind, other, raw.topic, self.run_id
                )
                return
            if isinstance(msg, StatusMsg) and msg.chain is not None and msg.node not in self.chains:
                self.chains[msg.node] = chain_check(msg.chain, self.far)
            listeners = self.listeners.get(msg.node)
            if listeners is None:
                what = "key" if isinstance(msg, KeyMsg) else "status"
                self._unrouted(f"{what} of node {msg.node}, not a neighbour of {sorted(self.by_id)}")
                return
            for m in listeners:
                if isinstance(msg, KeyMsg):
                    m.on_key(msg)
                else:
                    m.on_status(msg)
        elif isinstance(msg, ConfigMsg):
            for m in self.members:
                m.on_config(msg)
        else:
            self._unrouted(f"{info.kind} message from node {info.node} is not for nodes")

    async def read(self, transport: Transport) -> None:
        """Feed every message of ``transport`` until it closes (an error: the run was not over)."""
        feed = self.feed
        async for raw in transport.messages():
            feed(raw)
        raise NlaggError("connection to the broker closed during the run")
