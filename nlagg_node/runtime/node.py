"""The networked node: one participant of a run, talking wire protocol v1 through a :class:`Transport`.

The math is the simulator's: every x- and z-update is a call into :mod:`nlagg_node.pdmm` on the
node's own slice of the arrays (neighbours ascending), and the generators come from
:func:`nlagg_node.rng.rng_for` in the simulator's order (DP noise first, then z^(0) once per dual
group). A testbed with the run seed therefore reproduces ``simulate(cfg, trials=1)`` bit for bit.

Iteration t of node i: ``x_i^(t)`` from its duals, publish it (and, when corrupted, its state),
wait for ``x_j^(t)`` of every neighbour (the per-neighbour barrier), then update its own duals
``u_{i|j}`` and its copy of the neighbours' duals ``u_{j|i}`` (PDMM's broadcast form: after the
z^(0) exchange only x's travel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Literal, Self

import numpy as np
from numpy.typing import NDArray

from ..config import RunConfig
from ..errors import NlaggError
from ..graphs import IntArray, neighbours
from ..init import draw_z0, perturb_value
from ..pdmm import dual_sum, x_update, z_update
from ..rng import rng_for
from ..schedule import Phase, bypassed, combine, effective_values, phase_c, plan_phases, value_noise
from .barrier import KeyedSlots, NeighbourTimeoutError, NodeResult, first_error
from .checkpoint import Checkpoint, CheckpointStore, fingerprint
from .public import ConfigMismatchError, build_config_msg, config_from_msg, config_mismatch, run_edges
from .transport import Message, Transport, Will
from .wire import (
    AdvStateMsg,
    ConfigMsg,
    StatusMsg,
    TopicInfo,
    WireError,
    WireMessage,
    XMsg,
    Z0Msg,
    decode,
    encode,
    encode_x,
    topics,
)

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
FloatArray = NDArray[np.float64]


def node_will(prefix: str, run_id: str, node_id: int) -> Will:
    """The last will of node ``node_id``: retained ``offline`` status."""
    payload = encode(StatusMsg(node=node_id, state="offline"))
    return Will(topics(prefix, run_id).status(node_id), payload, retain=True, qos=1)


class Node:
    """One node of a run, as an async context manager.

    ``async with Node(cfg, i, s_i, transport, run_id="r1") as node: result = await node.run()``

    Parameters
    ----------
    cfg : the run configuration (the same file every node and the launcher read).
    node_id : this node's id.
    value : the private value s_i (never published, except in a corrupted node's adv state).
    transport : connection to the broker. With ``own_transport`` (default) the node connects it,
        subscribes and runs its own reader task; otherwise a host (:func:`host_nodes`) shares one
        connection between several nodes and calls :meth:`handle`.
    run_id, prefix : topic namespace.
    edges : canonical edge list; :func:`run_edges` of ``cfg`` when None.
    corrupt : publish ``adv/{i}/state`` every iteration (the paper's passive corrupted node).
    seed : seed of the private generator ``rng_for(seed, "node", 0, i)``; ``cfg.seed`` by default,
        None for OS entropy (a device in the field).
    neighbour_timeout : seconds a barrier may wait before :class:`NeighbourTimeoutError` names the missing
        neighbours; ``startup_timeout`` for the neighbours to come online.
    checkpoint : where to keep the local checkpoint (written before every publish that depends on the
        node's state); a node restarted with the same store resumes from it with the same numbers.
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
        self.neighbours = neighbours(self.cfg.n, self.edges)[node_id]
        if not self.neighbours:
            raise NlaggError(f"node {node_id} has no neighbours in the graph")
        self.corrupt = corrupt
        self.seed = self.cfg.seed if seed == "config" else seed
        self.neighbour_timeout = neighbour_timeout
        self.startup_timeout = startup_timeout
        self.own_transport = own_transport
        self.phases: list[Phase] = plan_phases(self.cfg)
        self.t_total = sum(p.t_len for p in self.phases)
        self._phase_at: list[str] = [p.name for p in self.phases for _ in range(p.t_len)]
        self._groups = {p.group for p in self.phases}
        self._inbox = KeyedSlots(self.neighbours)
        self._nbr_set = frozenset(self.neighbours)
        self._nbr_state: dict[int, str] = {}
        self._online: asyncio.Event = asyncio.Event()
        self._t_now = 0
        self._degree = len(self.neighbours)
        self._xbuf: dict[int, dict[int, float]] = {}
        self._x_wait_t = -1
        self._x_waiter: asyncio.Future[None] | None = None
        self._wait_since = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._groups_done: set[str] = set()
        self.rejected = 0
        self.duplicates = 0
        # Resending after a neighbour restarts: our z^(0) payloads per group and the last two x's.
        self._z0_out: dict[str, dict[int, bytes]] = {}
        self._sent_x: dict[int, bytes] = {}
        self._t_done = -1  # the last iteration whose neighbour x's were consumed
        self._consumed: dict[int, dict[int, float]] = {}
        self._phase_start = [sum(p.t_len for p in self.phases[:k]) for k in range(len(self.phases))]
        self.public = build_config_msg(self.cfg, run_id, self.edges)
        self.store = checkpoint
        self.resumed: Checkpoint | None = None
        self._fingerprint = ""
        if checkpoint is not None:
            self._fingerprint = fingerprint(
                run_id, node_id, self.value, self.public.model_dump(mode="json"), self.seed
            )
            self.resumed = checkpoint.load(self._fingerprint)
            if self.resumed is not None:
                self._restore_window(self.resumed)

    def _restore_window(self, ck: Checkpoint) -> None:
        """Before any message flows: the barrier window and the groups done of the checkpoint."""
        self._t_now = ck.t
        self._t_done = ck.t - 1
        self._consumed[ck.t - 1] = {int(j): v for j, v in ck.prev_got.items()}
        done_phases = ck.phase + (0 if ck.stage == "z0" else 1)
        self._groups_done = {p.group for p in self.phases[:done_phases]}
        for group, zs in ck.z0_sent.items():
            self._z0_out[group] = {
                j: self._z0_payload(j, group, z) for j, z in zip(self.neighbours, zs, strict=True)
            }

    # Subscriptions and message handling -------------------------------------------------
    def subscriptions(self) -> list[str]:
        """Topic filters this node needs: the retained config, its neighbours' x and status, z^(0) to it."""
        subs = [self.topics.config, self.topics.z0("+", self.id)]
        for j in self.neighbours:
            subs += [self.topics.x(j), self.topics.status(j)]
        return subs

    def _reject(self, why: str) -> None:
        self.rejected += 1
        log.warning("node %d: rejected message (%s)", self.id, why)

    def feed(self, msg: Message) -> None:
        """Decode and handle one raw message; malformed or foreign ones are logged and counted."""
        try:
            info, body = decode(msg.topic, msg.payload, self.prefix, self.run_id)
        except WireError as exc:
            self._reject(f"{msg.topic}: {exc}")
            return
        self.handle(info, body)

    def handle(self, info: TopicInfo, msg: WireMessage) -> None:
        """Route one validated message into the barrier buffers.

        Raises :class:`ConfigMismatchError` only for a retained run config contradicting this node's.
        """
        if isinstance(msg, XMsg):
            self._on_x(msg)
        elif isinstance(msg, Z0Msg):
            self._on_z0(msg)
        elif isinstance(msg, StatusMsg):
            if msg.node in self._nbr_set:
                self._on_status(msg)
            else:
                self._reject(f"status of node {msg.node}, not a neighbour of {self.id}")
        elif isinstance(msg, ConfigMsg):
            mismatch = config_mismatch(self.public, msg)
            if mismatch is not None:
                raise mismatch
        else:
            self._reject(f"{info.kind} message from node {info.node} is not for nodes")

    def _on_x(self, msg: XMsg) -> None:
        j, t = msg.node, msg.t
        if j not in self._nbr_set:
            self._reject(f"x from node {j}, not a neighbour of {self.id}")
            return
        if t < self.t_total and msg.phase != self._phase_at[t]:
            self._reject(f"x from node {j} at t={t}: phase {msg.phase!r}, expected {self._phase_at[t]!r}")
            return
        self._accept_x(j, t, msg.x)

    def _on_status(self, msg: StatusMsg) -> None:
        j = msg.node
        self._nbr_state[j] = msg.state
        if all(self._nbr_state.get(k) in ("online", "running", "done") for k in self.neighbours):
            self._online.set()
        if msg.state == "online":
            self._resend(j)  # j (re)started: it may have lost what we sent; it drops duplicates
        elif msg.state == "done" and msg.final and self._t_now >= self.t_total - 2:
            # j has finished and left: its last x is its last final (we may have crashed before it came)
            self._accept_x(j, self.t_total - 1, msg.final[-1])

    def _resend(self, j: int) -> None:
        """Republish our z^(0) to j and our last two x's (idempotent for every receiver)."""
        for payloads in self._z0_out.values():
            if j in payloads:
                self.transport.publish_nowait(self.topics.z0(self.id, j), payloads[j], qos=1)
        for t in sorted(self._sent_x):
            self.transport.publish_nowait(self.topics.x(self.id), self._sent_x[t], qos=1)

    def _accept_x(self, j: int, t: int, x: float) -> None:
        """Buffer x_j^(t) of neighbour j (checked: neighbour, phase); the barrier's hot path."""
        if t <= self._t_done:
            seen = self._consumed.get(t)
            if seen is None or j not in seen:
                self._reject(f"stale x from node {j} for t={t}; the node is at t={self._t_now}")
            elif seen[j] == x:
                self.duplicates += 1
            else:
                self._reject(f"x_{j}^({t}) = {x!r} differs from the {seen[j]!r} already used")
            return
        if t > self._t_now + 1 or t >= self.t_total:
            self._reject(f"x from node {j} for t={t}, outside the window {self._t_now}..{self._t_now + 1}")
            return
        slot = self._xbuf.get(t)
        if slot is None:
            slot = self._xbuf[t] = {}
        old = slot.get(j)
        if old is not None:
            if old == x:
                self.duplicates += 1
            else:
                self._reject(f"second, different x_{j}^({t}); the first one is kept")
            return
        slot[j] = x
        waiter = self._x_waiter
        if t == self._x_wait_t and waiter is not None and len(slot) == self._degree and not waiter.done():
            waiter.set_result(None)

    async def _take_x(self, t: int) -> dict[int, float]:
        slot = self._xbuf.get(t)
        if slot is None or len(slot) < self._degree:
            loop = asyncio.get_running_loop()
            self._x_wait_t = t
            self._x_waiter = waiter = loop.create_future()
            self._wait_since = loop.time()
            if self._watchdog is None:
                self._watchdog = loop.call_later(self.neighbour_timeout, self._check_barrier)
            try:
                await waiter
            finally:
                self._x_wait_t = -1
                self._x_waiter = None
        got = self._xbuf.pop(t)
        self._consumed[t] = got
        self._consumed.pop(t - 2, None)
        self._t_done = t
        return got

    def _check_barrier(self) -> None:
        """The barrier's deadline: fail the wait that has lasted ``neighbour_timeout``, naming the
        missing neighbours. One timer re-armed lazily instead of an ``asyncio.timeout`` per
        iteration: that costs a timer-heap push and cancel every round, on the hot path."""
        self._watchdog = None
        waiter = self._x_waiter
        if waiter is None or waiter.done():
            return  # not waiting: the next wait arms the timer again
        loop = asyncio.get_running_loop()
        waited = loop.time() - self._wait_since
        if waited < self.neighbour_timeout:
            self._watchdog = loop.call_later(self.neighbour_timeout - waited, self._check_barrier)
            return
        t = self._x_wait_t
        missing = [j for j in self.neighbours if j not in self._xbuf.get(t, {})]
        waiter.set_exception(
            NeighbourTimeoutError(
                f"node {self.id}: no x^({t}) from neighbour(s) {missing} within {self.neighbour_timeout:g} s"
            )
        )

    def _cancel_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _on_z0(self, msg: Z0Msg) -> None:
        j = msg.from_
        if msg.to != self.id or j not in self._nbr_set:
            self._reject(f"z0 from node {j} to node {msg.to}: not an edge of node {self.id}")
            return
        if msg.group not in self._groups:
            self._reject(f"z0 from node {j} for unknown dual group {msg.group!r}")
            return
        if msg.group in self._groups_done:
            self.duplicates += 1
            return
        self._count(self._inbox.put(("z0", msg.group), j, msg.z), f"z0 {j}->{self.id} ({msg.group})")

    def _count(self, outcome: str, what: str) -> None:
        if outcome == "dup":
            self.duplicates += 1
        elif outcome == "conflict":
            self._reject(f"second, different {what}; the first one is kept")

    # Lifecycle ------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self.own_transport:
            await self.transport.__aenter__()
            await self.transport.subscribe(*self.subscriptions())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.own_transport:
            await self.transport.__aexit__(exc_type, exc, tb)

    async def _read_loop(self) -> None:
        async for msg in self.transport.messages():
            self.feed(msg)
        raise NlaggError(f"node {self.id}: connection to the broker closed during the run")

    async def run(self) -> NodeResult:
        """Announce, wait for the neighbours, run every phase, publish ``done``; return the result."""
        try:
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(self._read_loop()) if self.own_transport else None
                try:
                    result = await self._protocol()
                finally:
                    if reader is not None:
                        reader.cancel()
                    self._cancel_watchdog()
        except ExceptionGroup as group:
            raise first_error(group) from None
        return result

    async def _status(self, state: Literal["online", "running", "done"], **extra: object) -> None:
        msg = StatusMsg.model_validate({"node": self.id, "state": state, **extra})
        await self.transport.publish(self.topics.status(self.id), encode(msg), qos=1, retain=True)

    async def _protocol(self) -> NodeResult:
        await self._announce()
        ck = self.resumed
        if ck is not None and ck.stage == "done":  # killed after finishing: announce it again
            await self._status("done", final=ck.finals, output=ck.output, iterations=self.t_total)
            return self._result(ck.finals, ck.output, ck.xs, ck.z0_sent, 0.0)
        await self._status("running")
        started = time.perf_counter()
        finals, xs, z0_sent = await self._iterate()
        return await self._finish(finals, xs, z0_sent, time.perf_counter() - started)

    async def _announce(self) -> None:
        """Publish ``online`` and wait until every neighbour is online (or ``startup_timeout``)."""
        await self._status("online")
        try:
            async with asyncio.timeout(self.startup_timeout):
                await self._online.wait()
        except TimeoutError:
            live = ("online", "running", "done")
            missing = [j for j in self.neighbours if self._nbr_state.get(j) not in live]
            raise NeighbourTimeoutError(
                f"node {self.id}: neighbour(s) {missing} not online within {self.startup_timeout:g} s"
            ) from None

    async def _finish(
        self, finals: list[float], xs: list[float], z0_sent: dict[str, list[float]], seconds: float
    ) -> NodeResult:
        """Combine the phases' finals into the output, publish ``done``, return the result."""
        output = combine(self.cfg, self.phases, [np.array([f]) for f in finals])
        out_list = [float(v) for v in np.ravel(output)]
        if self.store is not None:
            last = self.resumed
            assert last is not None  # _iterate saved at least one checkpoint
            last.stage, last.finals, last.xs, last.output = "done", finals, xs, out_list
            self.store.save(last)
        await self._status("done", final=finals, output=out_list, iterations=self.t_total)
        return self._result(finals, out_list, xs, z0_sent, seconds)

    def _result(
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
            iterations=self.t_total,
            seconds=sec,
            z0_sent=z0,
            x=xs,
            rejected=self.rejected,
            duplicates=self.duplicates,
        )

    def _z0_payload(self, j: int, group: str, z: float) -> bytes:
        return encode(Z0Msg.model_validate({"from": self.id, "to": j, "group": group, "z": z}))

    async def _exchange_z0(self, group: str, z_out: FloatArray) -> dict[int, float]:
        """Publish z_{i|j}^(0) (awaiting the broker) and wait for every z_{j|i}^(0) of ``group``."""
        payloads = {
            j: self._z0_payload(j, group, z) for j, z in zip(self.neighbours, z_out.tolist(), strict=True)
        }
        self._z0_out[group] = payloads
        for j, payload in payloads.items():
            await self.transport.publish(self.topics.z0(self.id, j), payload, qos=1)
        z_in = await self._inbox.take(("z0", group), self.startup_timeout, f"z0 ({group})", self.id)
        self._groups_done.add(group)
        return z_in

    def _save(self, ck: Checkpoint) -> None:
        if self.store is not None:
            self.store.save(ck)
            self.resumed = ck

    async def _iterate(self) -> tuple[list[float], list[float], dict[str, list[float]]]:
        """Every phase from the start, or from the checkpoint; a checkpoint precedes every publish."""
        cfg, nbrs = self.cfg, self.neighbours
        d = len(nbrs)
        rng = rng_for(self.seed, "node", 0, self.id)
        signs = np.array([1.0 if self.id < j else -1.0 for j in nbrs])
        src = np.zeros(d, dtype=np.int64)
        cd = np.array([float(d)])
        ck = self.resumed
        if ck is None:
            s_used = perturb_value(self.value, value_noise(cfg), cfg.sigma_s, rng)
            ck = Checkpoint(self._fingerprint, "z0", 0, 0, "", s_used, {})
        else:
            s_used = ck.s_used
            rng.bit_generator.state = ck.rng_state
        resuming = self.resumed is not None
        s_arr = np.array([s_used])
        # Both dual vectors in one: w = [u_{i|j} (own), u_{j|i} (the neighbours', tracked)], so one
        # z_update call per iteration updates both (element-wise the same operations, same bits).
        w = np.concatenate([ck.u_out, ck.u_in]) if ck.u_out else np.zeros(2 * d)
        swap = np.concatenate([np.arange(d, 2 * d), np.arange(d)])
        x_dst = np.empty(2 * d)
        finals, identified, xs = list(ck.finals), list(ck.identified), list(ck.xs)
        z0_sent: dict[str, list[float]] = dict(ck.z0_sent)
        group, t = ck.group, ck.t
        x_topic = self.topics.x(self.id)
        last_got = {int(j): v for j, v in ck.prev_got.items()}
        adv = None if ck.prev_adv is None else ck.prev_adv.encode()
        for p_idx in range(ck.phase, len(self.phases)):
            phase = self.phases[p_idx]
            c = phase_c(cfg, phase)
            cd_c = cd * c
            if (resuming and ck.stage == "z0") or (not resuming and phase.group != group):
                group = phase.group
                self._t_now = t
                if resuming:
                    z_out = np.array(ck.z_out)
                else:
                    z_out = draw_z0(phase.init, signs, rng)
                    z0_sent[group] = z_out.tolist()
                    identified = []
                    self._save(
                        Checkpoint(
                            ck.fingerprint, "z0", t, p_idx, group, s_used, dict(rng.bit_generator.state),
                            z_out=z0_sent[group], z0_sent=z0_sent, finals=finals, xs=xs,
                            prev_got={str(j): v for j, v in last_got.items()},
                        )
                    )  # fmt: skip
                z_in = await self._exchange_z0(group, z_out)
                w = np.concatenate([signs * z_out, -signs * np.array([z_in[j] for j in nbrs])])
            elif resuming and t > 0:
                # Resumed mid-phase: what we may have published just before the crash goes out again.
                self._sent_x[t - 1] = encode_x(self.id, t - 1, self._phase_at[t - 1], xs[-1])
                self.transport.publish_nowait(x_topic, self._sent_x[t - 1], qos=1)
                if ck.prev_adv is not None:
                    self.transport.publish_nowait(self.topics.adv(self.id), ck.prev_adv.encode(), qos=1)
            resuming = False
            skip = bypassed(phase, s_arr, np.array(identified).reshape(-1, 1), cfg.epsilon)
            s_eff = effective_values(phase, s_arr, skip)
            for t in range(t, self._phase_start[p_idx] + phase.t_len):  # noqa: B020 - t carries on
                self._t_now = t
                if self.store is not None:
                    self._save(
                        Checkpoint(
                            ck.fingerprint, "x", t, p_idx, group, s_used, dict(rng.bit_generator.state),
                            u_out=w[:d].tolist(), u_in=w[d:].tolist(), z0_sent=z0_sent, finals=finals,
                            identified=identified, xs=xs, prev_got={str(j): v for j, v in last_got.items()},
                            prev_adv=None if adv is None else adv.decode(),
                        )
                    )  # fmt: skip
                v = dual_sum(w[:d], src, 1)
                x = float(x_update(phase.objective, v, s_eff, cd_c)[0])
                xs.append(x)
                if self.corrupt:
                    adv = self._publish_state(t, s_used, signs, w[:d], w[d:])
                payload = encode_x(self.id, t, phase.name, x)
                self._sent_x[t] = payload
                self._sent_x.pop(t - 2, None)
                self.transport.publish_nowait(x_topic, payload, qos=1)
                last_got = await self._take_x(t)
                x_dst[:d] = [last_got[j] for j in nbrs]
                x_dst[d:] = x
                w = z_update(w, w[swap], x_dst, c, cfg.theta)
            t = self._phase_start[p_idx] + phase.t_len
            finals.append(xs[-1])
            identified.append(xs[-1])
        return finals, xs, z0_sent

    def _publish_state(
        self, t: int, s: float, signs: FloatArray, u_out: FloatArray, u_in: FloatArray
    ) -> bytes:
        z = (signs * u_out).tolist()
        z_in = (-signs * u_in).tolist()
        msg = AdvStateMsg(
            node=self.id,
            t=t,
            s=s,
            z={str(j): v for j, v in zip(self.neighbours, z, strict=True)},
            z_in={str(j): v for j, v in zip(self.neighbours, z_in, strict=True)},
        )
        payload = encode(msg)
        self.transport.publish_nowait(self.topics.adv(self.id), payload, qos=1)
        return payload
