"""One participant of a run as the protocol loop sees it: identity, inbox, neighbours, outbox, status.

A :class:`Member` holds everything that belongs to one node and nothing about connections or
iterations: its configuration and schedule, its two barriers (x and z^(0), see
:mod:`~nlagg_node.runtime.barrier`), its neighbours' statuses and its outbox (see
:mod:`~nlagg_node.runtime.peers`), its counters, and its checkpoint store. The message router
(:mod:`~nlagg_node.runtime.routing`) feeds it; the loop (:mod:`~nlagg_node.runtime.loop`) drives
it, for one node alone (:class:`~nlagg_node.runtime.node.Node`) or for several in one process
(:func:`~nlagg_node.runtime.hosted.host_nodes`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Literal

import numpy as np

from ..config import RunConfig
from ..errors import ConfigError, DepartedError, NeighbourTimeoutError, NlaggError
from ..graphs import IntArray, neighbours
from ..protocol import RunShape, departure_claims, key_error, status_error, z0_error
from ..schedule import Phase, combine
from ..termination import NO_STOP, Fields
from .barrier import Barrier, Outcome
from .checkpoint import Checkpoint, CheckpointStore, fingerprint
from .peers import HISTORY, Neighbours, Outbox
from .public import build_config_msg, config_mismatch, run_edges
from .result import NodeResult
from .seal import KeyRing, load_or_create_key, new_key
from .transport import Transport
from .wire import AdvStateMsg, ConfigMsg, KeyMsg, SealedZ0Msg, StatusMsg, WireError, Z0Msg, encode, topics

__all__ = ["DepartedError", "Member", "NodeResult", "check_neighbour_timeout"]

log = logging.getLogger("nlagg.node")


def check_neighbour_timeout(seconds: float) -> float:
    """``seconds`` if it can be a barrier's timeout (finite and positive), else a :class:`ConfigError`."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError("neighbour_timeout", seconds, "must be a positive number of seconds")
    return seconds


class Member:
    """One node of a run; see :class:`~nlagg_node.runtime.node.Node` for the parameters."""

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
        checkpoint: CheckpointStore | None = None,
        departure_timeout: float | None = None,
        leave_after: int | None = None,
        leave_quietly: bool = False,
    ) -> None:
        self.cfg = cfg.resolved()
        if not 0 <= node_id < self.cfg.n:
            raise NlaggError(f"node_id={node_id!r}: must lie in 0..{self.cfg.n - 1}")
        self.id = node_id
        self.value = float(value)
        self.transport = transport
        self.run_id = run_id
        self.prefix = prefix
        self.topics = topics(prefix, run_id)
        self.edges = run_edges(self.cfg) if edges is None else edges
        self.neighbours: list[int] = neighbours(self.cfg.n, self.edges)[node_id]
        if not self.neighbours:
            raise NlaggError(f"node {node_id} has no neighbours in the graph")
        self.slot = {j: k for k, j in enumerate(self.neighbours)}
        self.active: list[int] = list(self.neighbours)  # those not departed (the loop drops them)
        self.corrupt = corrupt
        self.seed = self.cfg.seed if seed == "config" else seed
        self.neighbour_timeout = check_neighbour_timeout(neighbour_timeout)
        self.startup_timeout = startup_timeout
        # Departures (nlagg_node.departure): a neighbour whose last will stays longer than this has left.
        self.departure_timeout = 0.75 * neighbour_timeout if departure_timeout is None else departure_timeout
        if not 0 < self.departure_timeout < neighbour_timeout:
            raise ConfigError(
                "departure_timeout",
                self.departure_timeout,
                f"must lie between 0 and the neighbour timeout ({neighbour_timeout:g} s)",
            )
        self.departed: dict[int, int] = {}
        self.leave_at = leave_after  # publish x^(0..T-1), then leave (None: stay)
        self.leave_quietly = leave_quietly  # no 'leaving': wait until every neighbour holds x^(T-1)
        self.running = False
        self.has_left = False
        self._told: dict[int, dict[str, int]] = {}  # the departures each neighbour has announced
        self._expiry: dict[int, asyncio.TimerHandle] = {}
        self.shape = RunShape(self.cfg, self.edges)
        self.phases: list[Phase] = self.shape.phases
        self.t_total = self.shape.t_total
        self.phase_at: list[str] = self.shape.phase_at
        self.exchanges = self.shape.exchanges  # the z^(0) exchanges, one whenever the dual group changes
        self.exchange_of = self.shape.exchange_of
        self.sealed = self.shape.sealed  # groups whose z^(0) travel sealed (v2)
        self.public = build_config_msg(self.cfg, run_id, self.edges)
        self.peers = Neighbours(self.neighbours)
        self.outbox = Outbox(transport, self.topics, node_id)
        self.x_in = Barrier(
            node_id, self.neighbours, "x^({})", timeout=neighbour_timeout, end=self.t_total, window=2,
            keep=HISTORY,  # a neighbour's x's sent again after a broker crash are duplicates, not stale
        )  # fmt: skip
        self.z0_in = Barrier(
            node_id, self.neighbours, "z0 ({})", timeout=startup_timeout,
            end=len(self.exchanges), window=len(self.exchanges), keep=None,
        )  # fmt: skip
        self.z0_in.labels = self.exchanges
        # Early stopping: every phase may end before its t_len; the next phase starts at its usual t.
        self.x_in.jumps = self.shape.jumps
        self.quiet_in: dict[int, list[Fields]] = {}
        self.iterations_run = self.t_total
        self.rejected = 0
        self.duplicates = 0
        self.store = checkpoint
        self.resumed: Checkpoint | None = None
        self.fingerprint = ""
        if checkpoint is not None:
            self.fingerprint = fingerprint(
                run_id, node_id, self.value, self.public.model_dump(mode="json"), self.seed
            )
            self.resumed = checkpoint.load(self.fingerprint)
        # Sealed initialization: an ephemeral key pair per run from the OS (kept with the checkpoint,
        # so a resumed node keeps its key); sealed z^(0) from a neighbour whose key has not come yet wait.
        self.keys: KeyRing | None = None
        self._early: dict[int, list[SealedZ0Msg]] = {}
        self._resend_plain: dict[str, list[float]] = {}  # restored sealed groups, sealed once keys come
        if self.sealed:
            key = new_key() if checkpoint is None else load_or_create_key(checkpoint.path.with_suffix(".key"))
            self.keys = KeyRing(node_id, self.neighbours, key, prefix=prefix, run_id=run_id)
        if self.resumed is not None:
            self._restore(self.resumed)

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
        self.z0_in.resume(self.exchange_of[group] + (0 if ck.stage == "z0" else 1))
        for g, zs in ck.z0_sent.items():
            if g in self.sealed:
                self._resend_plain[g] = zs
            else:
                self.outbox.keep_z0(g, self.z0_payloads(g, zs))

    def subscriptions(self) -> list[str]:
        """Topic filters this node needs: the retained config, its neighbours' x and status, z^(0) to it."""
        t = self.topics
        subs = [t.config, t.z0("+", self.id)]
        for j in self.neighbours:
            subs += [t.x(j), t.status(j)] + ([t.key(j)] if self.keys is not None else [])
        return subs

    # What the router hands over -------------------------------------------------------------
    def reject(self, why: str) -> None:
        self.rejected += 1
        log.warning("node %d: rejected message (%s)", self.id, why)

    def x_inlet(self, j: int) -> tuple[Callable[[int, int, float], Outcome], int]:
        """Where neighbour j's x's go: the barrier's ``put`` and j's slot (the router's hot path).

        The router puts ``x_j^(t)`` (its phase already checked) and hands back what is not
        ``"new"`` to :meth:`count_x`, and the early-stop fields of a new one to :meth:`keep_quiet`.
        """
        return self.x_in.put, self.slot[j]

    def keep_quiet(self, t: int, slot: int, fields: Fields) -> None:
        """The early-stop fields sent with a new x^(t), kept for :meth:`take_quiet`."""
        row = self.quiet_in.get(t)
        if row is None:
            row = self.quiet_in[t] = [(0, NO_STOP, ())] * len(self.neighbours)
        row[slot] = fields

    def take_quiet(self, t: int) -> list[Fields]:
        """The neighbours' ``(quiet, stop, departures)`` sent with x^(t), by slot (after taking x^(t);
        a departed neighbour's slot holds nothing that counts, and so do all when none is left)."""
        return self.quiet_in.pop(t, None) or [(0, NO_STOP, ())] * len(self.neighbours)

    def count_x(self, outcome: Outcome, j: int, t: int, x: float) -> None:
        """An x_j^(t) the barrier did not take as new: a duplicate is counted, the rest rejected."""
        nxt = self.x_in.next
        if outcome == "dup":
            self.duplicates += 1
        elif outcome == "conflict":
            if t < nxt:
                used = self.x_in.taken(t, self.slot[j])
                self.reject(f"x_{j}^({t}) = {x!r} differs from the {used!r} already used")
            else:
                self.reject(f"second, different x_{j}^({t}); the first one is kept")
        elif outcome == "stale":
            self.reject(f"stale x from node {j} for t={t}; the node is at t={nxt}")
        elif outcome == "gone":
            self.reject(f"x from node {j} for t={t}: it departed at t={self.departed.get(j)}")
        elif outcome == "stopped":
            self.reject(f"x from node {j} for t={t}: it had ended this phase")
        else:
            self.reject(f"x from node {j} for t={t}, outside the window {nxt}..{nxt + 1}")

    def _z0_slot(self, msg: Z0Msg | SealedZ0Msg) -> tuple[int, int] | None:
        """``(neighbour slot, exchange)`` of a z^(0) addressed to this node; None (rejected) otherwise."""
        j = msg.from_
        why = z0_error(self.shape, j, msg.to, msg.group, isinstance(msg, SealedZ0Msg))
        if why is None and msg.to != self.id:
            why = f"z0 from node {j} to node {msg.to}: not addressed to node {self.id}"
        if why is not None:
            if "protocol v" in why:
                why += f" (init_channel={self.cfg.init_channel}); refused"
            self.reject(why)
            return None
        return self.slot[j], self.exchange_of[msg.group]

    def _put_z0(self, j: int, slot: int, key: int, group: str, z: float) -> None:
        outcome = self.z0_in.put(key, slot, z)
        if outcome in ("dup", "stale"):  # stale: an exchange already done (a resent copy)
            self.duplicates += 1
        elif outcome == "conflict":
            self.reject(f"second, different z0 {j}->{self.id} ({group}); the first one is kept")

    def on_z0(self, msg: Z0Msg) -> None:
        where = self._z0_slot(msg)
        if where is not None:
            self._put_z0(msg.from_, *where, msg.group, msg.z)

    def on_sealed_z0(self, msg: SealedZ0Msg) -> None:
        """A sealed z^(0) (v2): opened with the edge's key, or kept until the sender's key comes."""
        where = self._z0_slot(msg)
        if where is None or self.keys is None:
            return
        j = msg.from_
        if j not in self.keys.peers:
            early = self._early.setdefault(j, [])
            if len(early) >= 2 * len(self.exchanges):
                self.reject(f"sealed z0 from node {j} before its key, more than the run needs; dropped")
            else:
                early.append(msg)
            return
        try:
            z = self.keys.open(j, msg.nonce, msg.ct, self.topics.z0(j, self.id), msg.group)
        except WireError as exc:
            self.reject(str(exc))
            return
        self._put_z0(j, *where, msg.group, z)

    def on_key(self, msg: KeyMsg) -> None:
        """Neighbour j's public key of the run: open what waited for it, seal what we may resend to it."""
        j = msg.node
        why = key_error(self.shape, j)
        if why is None and j not in self.slot:
            why = f"key of node {j}: not a neighbour of node {self.id}"
        if why is not None or self.keys is None:
            self.reject(str(why))
            return
        try:
            new = self.keys.add(j, msg.key)
        except WireError as exc:
            self.reject(str(exc))
            return
        if not new:
            self.duplicates += 1
            return
        for early in self._early.pop(j, []):
            self.on_sealed_z0(early)
        for g, zs in self._resend_plain.items():
            self.outbox.z0.setdefault(g, {})[j] = self._sealed_payload(g, j, zs[self.slot[j]])

    def on_status(self, msg: StatusMsg) -> None:
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
        self._watch(j, msg.state, before)
        if msg.state == "leaving":
            for subject, at in claims:
                if subject == j:  # its own word; its neighbours' claims about others are theirs
                    self._depart(j, at)
        elif msg.state == "online" or (msg.state == "running" and again):
            # j (re)started, or republished its status after the broker lost its session: it may
            # have lost what we sent (it drops duplicates).
            self.outbox.resend_to(j)
        elif msg.state == "done" and msg.final and not self.cfg.early_stop:
            # j has finished and left: its last x is its last final (we may have crashed before it came)
            outcome = self.x_in.put(self.t_total - 1, slot, msg.final[-1])
            if outcome in ("dup", "conflict"):
                self.count_x(outcome, j, self.t_total - 1, msg.final[-1])

    # Departures ------------------------------------------------------------------------------
    def start_running(self) -> None:
        """The run has begun: from now on a neighbour gone offline for good departs."""
        self.running = True
        for j, state in list(self.peers.state.items()):
            self._watch(j, state, None)

    def _watch(self, j: int, state: str, before: str | None) -> None:
        """Arm (offline) or disarm (back) the departure timer of neighbour j."""
        timer = self._expiry.pop(j, None)
        if timer is not None:
            timer.cancel()
        if state == "offline" and before != "done" and self.running:
            loop = asyncio.get_running_loop()
            self._expiry[j] = loop.call_later(self.departure_timeout, self._expired, j)

    def _expired(self, j: int) -> None:
        self._expiry.pop(j, None)
        if self.peers.state.get(j) == "offline" and j not in self.departed:
            self._depart(j, None)

    def _depart(self, j: int, at: int | None) -> None:
        """Neighbour j has left at ``at`` (None: the x it has not delivered); tell the other neighbours."""
        slot = self.slot[j]
        if at is not None and at >= self.t_total:
            return  # it had delivered everything: nothing changes
        try:
            t = self.x_in.depart(slot, at)
        except NlaggError as exc:
            self.reject(f"node {j} leaving: {exc}")
            return
        if t >= self.t_total:
            return
        self.z0_in.depart(slot)
        self.departed[j] = t
        log.warning("node %d: neighbour %d departed at t=%d", self.id, j, t)
        msg = StatusMsg(node=self.id, state="running", departed=self.departed_wire())
        self.outbox.set_status(encode(msg))

    def departed_wire(self) -> dict[str, int] | None:
        """The departed neighbours as the wire carries them, or None."""
        return {str(j): t for j, t in sorted(self.departed.items())} or None

    def on_config(self, msg: ConfigMsg) -> None:
        """Raise :class:`~nlagg_node.runtime.public.ConfigMismatchError` if the run's config differs."""
        mismatch = config_mismatch(self.public, msg)
        if mismatch is not None:
            raise mismatch

    # What the loop calls ---------------------------------------------------------------------
    async def status(self, state: Literal["online", "running", "done", "leaving"], **extra: object) -> None:
        msg = StatusMsg.model_validate({"node": self.id, "state": state, **extra})
        await self.outbox.send_status(encode(msg))

    def z0_payloads(self, group: str, z_out: list[float]) -> dict[int, bytes]:
        """The z0 messages of ``group``: plaintext (v1), or sealed per edge (v2, every key known)."""
        if group in self.sealed:
            return {j: self._sealed_payload(group, j, z) for j, z in zip(self.neighbours, z_out, strict=True)}
        return {
            j: encode(Z0Msg.model_validate({"from": self.id, "to": j, "group": group, "z": z}))
            for j, z in zip(self.active, z_out, strict=True)
        }

    def _sealed_payload(self, group: str, j: int, z: float) -> bytes:
        assert self.keys is not None
        nonce, ct = self.keys.seal(j, z, self.topics.z0(self.id, j), group)
        return encode(
            SealedZ0Msg.model_validate({"from": self.id, "to": j, "group": group, "nonce": nonce, "ct": ct})
        )

    async def exchange_z0(self, group: str, z_out: list[float]) -> list[float]:
        """Publish z_{i|j}^(0) (awaiting the broker) and wait for every z_{j|i}^(0) of ``group``.

        A sealed group first waits for every neighbour's public key (``startup_timeout``).
        """
        if group in self.sealed and self.keys is not None and not self.keys.complete.is_set():
            try:
                async with asyncio.timeout(self.startup_timeout):
                    await self.keys.complete.wait()
            except TimeoutError:
                missing, within = self.keys.missing(), self.startup_timeout
                raise NeighbourTimeoutError(
                    f"node {self.id}: no public key from neighbour(s) {missing} within {within:g} s"
                ) from None
        await self.outbox.send_z0(group, self.z0_payloads(group, z_out))
        return await self.z0_in.take(self.exchange_of[group])

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

    async def finish(
        self, finals: list[float], xs: list[float], z0_sent: dict[str, list[float]], seconds: float
    ) -> NodeResult:
        """Combine the phases' finals into the output, checkpoint and publish ``done``, return the result."""
        output = combine(self.cfg, self.phases, [np.array([f]) for f in finals])
        out_list = [float(v) for v in np.ravel(output)]
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
            node=self.id, value=self.value, finals=finals, output=output, iterations=self.iterations_run,
            seconds=sec, z0_sent=z0, x=xs, rejected=self.rejected, duplicates=self.duplicates,
            departed=dict(self.departed),
        )  # fmt: skip

    def leave(self) -> None:
        """Leave the run cleanly before the next x (a SIGTERM): publish ``leaving``, no output."""
        if self.leave_at is None:
            self.leave_at = 0

    def left(self, t: int) -> NodeResult:
        """This node has left the run cleanly at t: no output."""
        self.has_left, self.running = True, False
        res = self.result([], [], [], {}, 0.0)
        res.left_at, res.iterations = t, t
        return res

    async def announce(self) -> None:
        """Publish our public key (sealed runs) and ``online``; wait until every neighbour is live."""
        if self.keys is not None:
            self.outbox.send_key(encode(KeyMsg(node=self.id, key=self.keys.public)))
        await self.status("online")
        try:
            async with asyncio.timeout(self.startup_timeout):
                await self.peers.all_live.wait()
        except TimeoutError:
            missing, within = self.peers.not_live(), self.startup_timeout
            raise NeighbourTimeoutError(
                f"node {self.id}: neighbour(s) {missing} not online within {within:g} s"
            ) from None

    def close(self) -> None:
        self.outbox.cancel_resends()
        self.x_in.close()
        self.z0_in.close()
        for timer in self._expiry.values():
            timer.cancel()
        self._expiry.clear()
