"""One participant of a run as the protocol loop sees it: a composition of its parts, and its status.

A :class:`Member` holds everything that belongs to one node and nothing about connections or
iterations. Its parts, one concern each:

* :class:`~nlagg_node.runtime.intake.XIntake`: the neighbours' x's (a barrier, the early-stop
  fields sent with them) and :class:`~nlagg_node.runtime.intake.Tally`, its counters;
* :class:`~nlagg_node.runtime.exchange.Z0Exchange`: the z^(0) exchanges, sealed or not, and the
  run's keys;
* :class:`~nlagg_node.runtime.watch.DepartureWatch`: the neighbours that have left for good;
* its neighbours' statuses and its outbox (:mod:`~nlagg_node.runtime.peers`), its checkpoint store.

The member itself reads its neighbours' statuses (:meth:`Member.on_status`) and publishes its own.
What each part accepts is the protocol's rule (:mod:`nlagg_node.protocol`). The message router
(:mod:`~nlagg_node.runtime.routing`) feeds it; the loop (:mod:`~nlagg_node.runtime.loop`) drives
it, for one node alone (:class:`~nlagg_node.runtime.node.Node`) or for several in one process
(:func:`~nlagg_node.runtime.hosted.host_nodes`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Literal, Required, TypedDict, Unpack

import numpy as np

from ..config import RunConfig
from ..errors import ConfigError, DepartedError, NeighbourTimeoutError, NlaggError
from ..graphs import IntArray
from ..init import DualInitSpec
from ..protocol import departure_claims, own_departure_error, status_error
from ..protocol.chain import KeyChain
from ..protocol.identity import Identity, Verifier
from ..schedule import Phase, combine
from ..termination import Fields
from .auth import SignedTransport
from .barrier import Outcome
from .checkpoint import Checkpoint, CheckpointStore, fingerprint
from .exchange import Z0Exchange
from .intake import Inlet, Tally, XIntake
from .patience import check_not_finished, wait_saying
from .peers import Neighbours, Outbox
from .public import config_mismatch, run_edges
from .result import NodeResult
from .runparts import RunParts
from .seal import KeyRing
from .transport import Transport
from .watch import DepartureWatch
from .wire import AdvStateMsg, ConfigMsg, KeyMsg, SealedZ0Msg, StatusMsg, Z0Msg, encode, topics

__all__ = [
    "DepartedError",
    "Member",
    "MemberOptions",
    "MemberSettings",
    "NodeResult",
    "Seat",
    "check_neighbour_timeout",
]


def check_neighbour_timeout(seconds: float) -> float:
    """``seconds`` if it can be a barrier's timeout (finite and positive), else a :class:`ConfigError`."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError("neighbour_timeout", seconds, "must be a positive number of seconds")
    return seconds


Seat = tuple[RunConfig, int, float, Transport]
"""A member's place in a run, the positional arguments of :class:`Member` (and
:class:`~nlagg_node.runtime.node.Node`): its configuration, id, private value and connection."""


class MemberSettings(TypedDict, total=False):
    """A node's options besides its :data:`Seat` and its run id (all optional).

    prefix, edges : the topic prefix (``nlagg``) and the canonical edge list (:func:`run_edges`).
    corrupt : publish ``adv/{i}/state`` every iteration (the paper's passive corrupted node).
    seed : seed of the private generator ``rng_for(seed, "node", 0, i)``; ``"config"`` (default)
        for ``cfg.seed``, None for OS entropy (a device in the field).
    neighbour_timeout : seconds a barrier may wait (30); ``startup_timeout`` for the neighbours to
        come online and for a z^(0) exchange (60).
    checkpoint : where to keep the local checkpoint; a node restarted with the same store resumes.
    departure_timeout : seconds a neighbour's will must stay before it departs (3/4 of the neighbour
        timeout by default).
    flap_limit : a neighbour whose will has come this many times departs at once (its session
        flaps, :func:`~nlagg_node.departure.flapped`); None (default): never. An epoch of a
        continuous deployment sets :data:`~nlagg_node.departure.FLAP_LIMIT`.
    leave_after : publish x^(0) .. x^(T-1), then leave the run cleanly (status ``leaving``).
    leave_quietly : instead of ``leaving``, return once every neighbour has published x^(T).
    first_init : draw the first dual group's z^(0) from this distribution instead of the phase's
        (an epoch's warm start, :mod:`nlagg_node.warm`).
    identities : the run's public identities (base64 Ed25519 keys, index = node id): every message
        is signed and checked (:mod:`nlagg_node.protocol.identity`); None: a run without.
    identity : this node's signing key (required with ``identities``, and must be its entry).
    parts : the run's shape and public config, built once for many nodes by their host
        (:class:`~nlagg_node.runtime.runparts.RunParts`); None (default): the node builds its own.
    """

    prefix: str
    edges: IntArray | None
    corrupt: bool
    seed: int | Literal["config"] | None
    neighbour_timeout: float
    startup_timeout: float
    checkpoint: CheckpointStore | None
    departure_timeout: float | None
    flap_limit: int | None
    leave_after: int | None
    leave_quietly: bool
    first_init: DualInitSpec | None
    identities: Sequence[str] | None
    identity: Identity | None
    instance: str | None
    parts: RunParts | None


class MemberOptions(MemberSettings, total=False):
    """:class:`MemberSettings` and the run's id (with ``prefix``, the topic namespace): required.
    ``shared``: the run is an epoch of a continuous deployment, its status and key on the topics
    every epoch shares (:class:`~nlagg_node.runtime.wire.topics`)."""

    run_id: Required[str]
    shared: bool


_NO_KEYS = {"identities", "launcher", "sig"}  # a checkpoint's fingerprint of a run without them is as before


def _verifier(
    identities: Sequence[str] | None, node_id: int, n: int, identity: Identity | None, instance: str | None
) -> Verifier | None:
    """The run's verifier, once this node's own identity is its entry (None: a run without)."""
    if identities is None:
        return None
    if len(identities) != n:
        raise ConfigError("identities", f"{len(identities)} keys", f"the run has {n} nodes")
    if identity is None:
        raise ConfigError("signing_key", None, "the run's nodes sign their messages: give this node's key")
    if identity.public != identities[node_id]:
        raise ConfigError("signing_key", identity.public, f"is not node {node_id}'s identity in the config")
    return Verifier(identities, instance)


class Member:
    """One node of a run; see :class:`~nlagg_node.runtime.node.Node` and :class:`MemberOptions`."""

    def __init__(
        self,
        cfg: RunConfig,
        node_id: int,
        value: float,
        transport: Transport,
        **options: Unpack[MemberOptions],
    ) -> None:
        self.cfg = cfg.resolved()
        if not 0 <= node_id < self.cfg.n:
            raise NlaggError(f"node_id={node_id!r}: must lie in 0..{self.cfg.n - 1}")
        self.id = node_id
        self.value = float(value)
        self.transport = transport
        self.run_id = run_id = options["run_id"]
        self.prefix = options.get("prefix", "nlagg")
        self.topics = topics(self.prefix, run_id, shared=options.get("shared", False))
        identities = options.get("identities")
        # The start of the run its messages bind (:mod:`nlagg_node.protocol.instance`; None: none).
        self.instance = instance = options.get("instance")
        parts = options.get("parts")
        edges = options.get("edges", None if parts is None else parts.shape.edges)
        self.edges = run_edges(self.cfg) if edges is None else edges
        if parts is None:
            parts = RunParts.of(self.cfg, run_id, self.edges, identities, instance=instance)
        else:
            parts.check_fits(self.cfg, run_id, self.edges, identities, instance)
        self.shape = parts.shape
        self.public = parts.public
        self.neighbours: list[int] = self.shape.neighbours[node_id]
        if not self.neighbours:
            raise NlaggError(f"node {node_id} has no neighbours in the graph")
        self.slot = {j: k for k, j in enumerate(self.neighbours)}
        self.active: list[int] = list(self.neighbours)  # those not departed (the loop drops them)
        self.corrupt = options.get("corrupt", False)
        seed = options.get("seed", "config")
        self.seed = self.cfg.seed if seed == "config" else seed
        neighbour_timeout = check_neighbour_timeout(options.get("neighbour_timeout", 30.0))
        self.startup_timeout = options.get("startup_timeout", 60.0)
        self.leave_at = options.get("leave_after")  # publish x^(0..T-1), then leave (None: stay)
        self.leave_quietly = options.get("leave_quietly", False)  # no 'leaving': wait for x^(T)
        self.first_init = options.get("first_init")
        self.has_left = False
        self._told: dict[int, dict[str, int]] = {}  # the departures each neighbour has announced
        self.phases: list[Phase] = self.shape.phases
        self.t_total = self.shape.t_total
        self.phase_at: list[str] = self.shape.phase_at
        self.verifier = _verifier(identities, node_id, self.cfg.n, options.get("identity"), instance)
        self.peers = Neighbours(self.neighbours)
        identity = options.get("identity") if self.verifier is not None else None
        signed, chain = transport, None
        if identity is not None:  # every message signed; x's also carry a key-chain element
            signed = SignedTransport(transport, identity, instance=instance)  # x's too: a pair proves
            context = f"{self.prefix}|{run_id}|{node_id}" + ("" if instance is None else f"|{instance}")
            chain = KeyChain(identity.chain_seed(context), self.t_total)
        self.outbox = Outbox(signed, self.topics, node_id, chain)
        self.tally = Tally(node_id)
        self.intake = XIntake(
            node_id,
            self.neighbours,
            timeout=neighbour_timeout,
            t_total=self.t_total,
            jumps=self.shape.jumps,
            tally=self.tally,
        )
        self.x_in = self.intake.barrier
        self.store = options.get("checkpoint")
        self.z0 = Z0Exchange(
            self.shape,
            node_id,
            self.neighbours,
            self.outbox,
            self.topics,
            self.tally,
            timeout=self.startup_timeout,
            checkpoint=self.store,
            active=lambda: self.active,
            run=(self.prefix, run_id),
            signed=self.verifier is not None,
        )
        self.z0_in = self.z0.barrier
        departure_timeout = options.get("departure_timeout")
        self.watch = DepartureWatch(
            node_id,
            (self.x_in, self.z0_in),
            self.peers,
            self.outbox,
            self.tally.reject,
            timeout=0.75 * neighbour_timeout if departure_timeout is None else departure_timeout,
            neighbour_timeout=neighbour_timeout,
            flap_limit=options.get("flap_limit"),
        )
        self.iterations_run = self.t_total
        self.resumed: Checkpoint | None = None
        self.fingerprint = ""
        if self.store is not None:
            self.fingerprint, self.resumed = self._load(self.store)
        self.restarted = self.resumed is not None
        if self.resumed is not None:
            self._restore(self.resumed)

    def _load(self, store: CheckpointStore) -> tuple[str, Checkpoint | None]:
        """The checkpoint's fingerprint (of the run instance too) and the checkpoint to resume, if
        any: one of another start of the run is discarded, not resumed."""
        exclude = _NO_KEYS | ({"instance"} if self.instance is None else set())
        public = self.public.model_dump(mode="json", exclude=exclude)
        digest = fingerprint(self.run_id, self.id, self.value, public, self.seed)
        if self.instance is not None:  # before loading
            store.save_instance(self.instance)
        return digest, store.load(digest)

    def _restore(self, ck: Checkpoint) -> None:
        """Before any message flows: the barriers' positions and the z^(0) sent, from the checkpoint."""
        if ck.prev_got and len(ck.prev_got) < len(self.neighbours):
            raise NlaggError(
                f"node {self.id}: its checkpoint was written after a neighbour departed; "
                "a run with departures cannot be resumed"
            )
        prev = [ck.prev_got[str(j)] for j in self.neighbours] if ck.prev_got else None
        self.x_in.resume(ck.t, prev)
        self.iterations_run = self.t_total - ck.skipped
        group = self.phases[ck.phase].group
        self.z0.restore(self.shape.exchange_of[group] + (0 if ck.stage == "z0" else 1), ck.z0_sent)

    # The parts' state, as the loop and the results read it ----------------------------------
    @property
    def rejected(self) -> int:
        return self.tally.rejected

    @property
    def duplicates(self) -> int:
        return self.tally.duplicates

    @property
    def departed(self) -> dict[int, int]:
        """The departed neighbours and their departure iterations."""
        return self.watch.departed

    join_window = False  # whether neighbours absent when the run starts depart at t = 0 (an epoch's)

    @property
    def away(self) -> bool:
        """Whether a neighbour may have counted this node departed: it has published no x yet (it
        may be a restart of a node that left), it resumed its checkpoint, or it lost a connection
        since it joined (its last will came)."""
        return not self.outbox.sent_x or self.restarted or self.outbox.transport.reconnects > 0

    @property
    def keys(self) -> KeyRing | None:
        return self.z0.keys

    @property
    def sealed(self) -> frozenset[str]:
        return self.shape.sealed

    def subscriptions(self) -> list[str]:
        """Topic filters this node needs: the retained config, its neighbours' x and status, z^(0) to it."""
        t = self.topics
        subs = [t.config, t.z0("+", self.id)]
        for j in self.neighbours:
            subs += [t.x(j), t.status(j)] + ([t.key(j)] if self.keys is not None else [])
        return subs

    # What the router hands over -------------------------------------------------------------
    def reject(self, why: str) -> None:
        self.tally.reject(why)

    def x_inlet(self, j: int) -> Inlet:
        """Where neighbour j's x's go: the barrier's ``put``, j's slot and the intake's
        ``keep_quiet`` (the router's hot path).

        The router puts ``x_j^(t)`` (its form already checked) and hands back what is not
        ``"new"`` to :meth:`count_x`, and the early-stop fields of a new one to ``keep_quiet``.
        """
        return self.intake.inlet(self.slot[j])

    def keep_quiet(self, t: int, slot: int, fields: Fields) -> None:
        self.intake.keep_quiet(t, slot, fields)

    def take_quiet(self, t: int) -> list[Fields]:
        return self.intake.take_quiet(t)

    def count_x(self, outcome: Outcome, j: int, t: int, x: float) -> None:
        self.intake.count(outcome, j, t, x, self.departed.get(j))

    def on_z0(self, msg: Z0Msg) -> None:
        self.z0.on_z0(msg)

    def on_sealed_z0(self, msg: SealedZ0Msg) -> None:
        self.z0.on_sealed_z0(msg)

    def on_key(self, msg: KeyMsg) -> None:
        self.z0.on_key(msg)

    def on_status(self, msg: StatusMsg) -> None:
        """A neighbour's status: its departure claims (:func:`~nlagg_node.protocol.departure_claims`),
        its liveness, what it may have lost."""
        j = msg.node
        slot = self.slot.get(j)
        why = status_error(self.shape, j, msg.iterations, msg.departed)
        if why is None and slot is None:
            why = f"status of node {j}, not a neighbour of {self.id}"
        if why is not None or slot is None:
            self.reject(str(why))
            return
        claims = departure_claims(j, msg.state, msg.iterations, msg.departed)
        for subject, at in claims:
            if subject == self.id and not self.has_left:
                lie = own_departure_error(j, self.id, at, self.away, self.join_window)
                if lie is not None:
                    self.reject(lie)
                    return
                raise DepartedError(
                    f"node {self.id}: neighbour {j} counts this node as departed at "
                    f"t={at}; a departed node is refused for the rest of the run"
                )
        if j in self.departed:
            if msg.state in ("online", "running"):
                self.reject(f"node {j} departed at t={self.departed[j]} and is refused for this run")
            return
        before = self.peers.state.get(j)
        news = (msg.departed or {}) != self._told.get(j, {})  # a departure notice, not a republish
        self._told[j] = msg.departed or {}
        again = before == msg.state and not news
        self.peers.update(j, msg.state)
        self.watch.watch(j, msg.state, before)
        if msg.state == "leaving":
            for subject, at in claims:
                if subject == j:  # its own word; its claims about others are about their edges
                    self.watch.depart(j, at)
        elif msg.state == "online" or (msg.state == "running" and again):
            # j (re)started, or republished its status after the broker lost its session: it may
            # have lost what we sent (it drops duplicates).
            self.outbox.resend_to(j)
        elif msg.state == "done" and msg.final and not self.cfg.early_stop:
            # j has finished and left: its last x is its last final (we may have crashed before it came)
            outcome = self.x_in.put(self.t_total - 1, slot, msg.final[-1])
            if outcome in ("dup", "conflict"):
                self.count_x(outcome, j, self.t_total - 1, msg.final[-1])

    def start_running(self) -> None:
        """The run has begun: from now on a neighbour gone offline for good departs."""
        self.watch.start()

    def departed_wire(self) -> dict[str, int] | None:
        """The departed neighbours as the wire carries them, or None."""
        return self.watch.wire()

    def on_config(self, msg: ConfigMsg) -> None:
        """Raise :class:`~nlagg_node.runtime.public.ConfigMismatchError` if the run's config differs."""
        mismatch = config_mismatch(self.public, msg)
        if mismatch is not None:
            raise mismatch

    # What the loop calls ---------------------------------------------------------------------
    async def status(self, state: Literal["online", "running", "done", "leaving"], **extra: object) -> None:
        msg = StatusMsg.model_validate({"node": self.id, "state": state, "run": self.topics.named, **extra})
        await self.outbox.send_status(encode(msg))

    def z0_payloads(self, group: str, z_out: list[float]) -> dict[int, bytes]:
        """The z0 messages of ``group``: plaintext (v1), or sealed per edge (v2, every key known)."""
        return self.z0.payloads(group, z_out)

    async def exchange_z0(self, group: str, z_out: list[float]) -> list[float]:
        """Publish z_{i|j}^(0) and wait for every z_{j|i}^(0) of ``group`` (:class:`Z0Exchange`)."""
        return await self.z0.exchange(group, z_out)

    def publish_state(self, t: int, s: float, signs: list[float], out: list[float], into: list[float]) -> str:
        """A corrupted node's ``adv`` state of iteration t (``a_ij``, its signed duals); the payload."""
        z = [a * u for a, u in zip(signs, out, strict=True)]
        z_in = [-a * u for a, u in zip(signs, into, strict=True)]
        msg = AdvStateMsg(
            node=self.id,
            t=t,
            s=s,
            z={str(j): v for j, v in zip(self.active, z, strict=True)},
            z_in={str(j): v for j, v in zip(self.active, z_in, strict=True)},
        )
        payload = encode(msg)
        self.outbox.send_adv(payload)
        return payload.decode()

    def save(self, ck: Checkpoint) -> None:
        if self.store is not None:
            self.store.save(ck)
            self.resumed = ck

    def output_of(self, finals: list[float]) -> list[float]:
        """The node's output (protocol scale) from its phases' finals."""
        return [float(v) for v in np.ravel(combine(self.cfg, self.phases, [np.array([f]) for f in finals]))]

    async def finish(
        self, finals: list[float], xs: list[float], z0_sent: dict[str, list[float]], seconds: float
    ) -> NodeResult:
        """Combine the phases' finals into the output, checkpoint and publish ``done``, return the result."""
        out_list = self.output_of(finals)
        if self.store is not None:
            last = self.resumed
            assert last is not None  # the loop saved at least one checkpoint
            last.stage, last.finals, last.xs, last.output = "done", finals, xs, out_list
            last.skipped = self.t_total - self.iterations_run
            self.store.save(last)
        await self.status(
            "done",
            final=finals,
            output=out_list,
            iterations=self.iterations_run,
            departed=self.departed_wire(),
        )
        return self.result(finals, out_list, xs, z0_sent, seconds)

    def result(
        self,
        finals: list[float],
        output: list[float],
        xs: list[float],
        z0: dict[str, list[float]],
        sec: float,
    ) -> NodeResult:
        return NodeResult(
            node=self.id,
            value=self.value,
            finals=finals,
            output=output,
            iterations=self.iterations_run,
            seconds=sec,
            z0_sent=z0,
            x=xs,
            rejected=self.rejected,
            duplicates=self.duplicates,
            departed=dict(self.departed),
        )

    def leave(self) -> bool:
        """Leave the run cleanly before the next x (a SIGTERM): publish ``leaving``, no output.

        False, and nothing changes, while this node has published no x: it has nothing to leave
        (announcing, or in its first z^(0) exchange) and its runtime stops it outright.
        """
        if not self.outbox.sent_x:
            return False
        if self.leave_at is None:
            self.leave_at = 0
        return True

    def left(self, t: int) -> NodeResult:
        """This node has left the run cleanly at t: no output."""
        self.has_left, self.watch.running = True, False
        res = self.result([], [], [], {}, 0.0)
        res.left_at, res.iterations = t, t
        return res

    async def announce(self) -> None:
        """Publish our public key (sealed runs) and ``online``; wait until every neighbour is live."""
        self.z0.announce_key()
        await self.status("online")
        try:
            async with asyncio.timeout(self.startup_timeout):
                await wait_saying(self.peers.all_live, self._waiting_for)
        except TimeoutError:
            missing, within = self.peers.not_live(), self.startup_timeout
            raise NeighbourTimeoutError(
                f"node {self.id}: neighbour(s) {missing} not online within {within:g} s"
            ) from None
        if self.resumed is None:  # a node with a checkpoint may rejoin its finished run
            check_not_finished(self.id, self.run_id, self.peers.state, self.neighbours)

    def _waiting_for(self) -> str:
        return f"node {self.id}: waiting for neighbour(s) {self.peers.not_live()} to come online"

    def close(self) -> None:
        self.outbox.cancel_resends()
        self.x_in.close()
        self.z0_in.close()
        self.watch.close()
