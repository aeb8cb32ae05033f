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
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

import numpy as np
from numpy.typing import NDArray

from ..config import RunConfig
from ..errors import NlaggError
from ..graphs import IntArray, neighbours, normalize_edges
from ..init import draw_z0, perturb_value
from ..pdmm import dual_sum, x_update, z_update
from ..rng import rng_for
from ..schedule import Phase, bypassed, combine, effective_values, phase_c, plan_phases, value_noise
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
    "NeighbourTimeoutError",
    "Node",
    "NodeResult",
    "build_config_msg",
    "config_from_msg",
    "host_nodes",
    "node_will",
    "run_edges",
]

log = logging.getLogger("nlagg.node")
FloatArray = NDArray[np.float64]


class NeighbourTimeoutError(NlaggError):
    """A neighbour did not deliver what the barrier waits for within the configured timeout."""


def run_edges(cfg: RunConfig) -> IntArray:
    """The graph of trial 0 of ``cfg``: the one the simulator and every testbed node build."""
    from ..sim.engine import sample_graphs

    return sample_graphs(cfg.model_copy(update={"trials": 1}))[0]


_PRIVATE_FIELDS = {"seed", "trials", "record", "graph_file"}


def build_config_msg(cfg: RunConfig, run_id: str, edges: IntArray) -> ConfigMsg:
    """The public ``P/R/config`` document: resolved parameters, the edge list, the phase schedule.

    Leaves out the seed (it would reveal every node's z^(0)) and simulator-only fields.
    """
    cfg = cfg.resolved()
    run = cfg.model_dump(mode="json", exclude=_PRIVATE_FIELDS)
    phases = [
        {
            "name": ph.name,
            "group": ph.group,
            "t_len": ph.t_len,
            "c": phase_c(cfg, ph),
            "objective": ph.objective.kind,
            "bypass": ph.bypass,
        }
        for ph in plan_phases(cfg)
    ]
    pairs = [[int(a), int(b)] for a, b in np.asarray(edges).tolist()]
    return ConfigMsg(run_id=run_id, n=cfg.n, edges=pairs, run=run, phases=phases)


def config_from_msg(msg: ConfigMsg) -> tuple[RunConfig, IntArray]:
    """Rebuild the run configuration (seed 0, graph from the message's edges) and the canonical edges."""
    from ..config import validate_config

    cfg = validate_config({**msg.run, "trials": 1, "record": "none"})
    return cfg, normalize_edges(msg.n, msg.edges, source="config.edges")


def node_will(prefix: str, run_id: str, node_id: int) -> Will:
    """The last will of node ``node_id``: retained ``offline`` status."""
    payload = encode(StatusMsg(node=node_id, state="offline"))
    return Will(topics(prefix, run_id).status(node_id), payload, retain=True, qos=1)


@dataclass
class NodeResult:
    """What one node ended with (``value`` is private; it never leaves the node)."""

    node: int
    value: float
    finals: list[float]  # final x of every phase
    output: list[float]  # combine(): the k values of top-K, else one value
    iterations: int
    seconds: float
    z0_sent: dict[str, list[float]] = field(default_factory=dict)  # group -> z_{i|j}^(0), j ascending
    x: list[float] = field(default_factory=list)  # x_i^(t), t = 0..iterations-1
    rejected: int = 0
    duplicates: int = 0

    @property
    def rounds_per_second(self) -> float:
        return self.iterations / self.seconds if self.seconds > 0 else 0.0


class _Slots:
    """Values that neighbours send for one key (an iteration or a dual group), and one waiter."""

    def __init__(self, expected: list[int]) -> None:
        self.expected = expected
        self.slots: dict[tuple[str, int | str], dict[int, float]] = {}
        self._key: tuple[str, int | str] | None = None
        self._future: asyncio.Future[None] | None = None

    def put(self, key: tuple[str, int | str], sender: int, value: float) -> Literal["new", "dup", "conflict"]:
        slot = self.slots.setdefault(key, {})
        if sender in slot:
            return "dup" if slot[sender] == value else "conflict"
        slot[sender] = value
        fut = self._future
        if key == self._key and len(slot) == len(self.expected) and fut is not None and not fut.done():
            fut.set_result(None)
        return "new"

    async def take(self, key: tuple[str, int | str], within: float, what: str, node: int) -> dict[int, float]:
        slot = self.slots.setdefault(key, {})
        if len(slot) < len(self.expected):
            self._key = key
            self._future = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(within):
                    await self._future
            except TimeoutError:
                missing = [j for j in self.expected if j not in slot]
                raise NeighbourTimeoutError(
                    f"node {node}: no {what} from neighbour(s) {missing} within {within:g} s"
                ) from None
            finally:
                self._key = None
                self._future = None
        return self.slots.pop(key)


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
        self._inbox = _Slots(self.neighbours)
        self._nbr_set = frozenset(self.neighbours)
        self._nbr_state: dict[int, str] = {}
        self._online: asyncio.Event = asyncio.Event()
        self._t_now = 0
        self._degree = len(self.neighbours)
        self._xbuf: dict[int, dict[int, float]] = {}
        self._x_wait_t = -1
        self._x_waiter: asyncio.Future[None] | None = None
        self._groups_done: set[str] = set()
        self.rejected = 0
        self.duplicates = 0

    # Subscriptions and message handling -------------------------------------------------
    def subscriptions(self) -> list[str]:
        """Topic filters this node needs: its neighbours' x and status, and z^(0) sent to it."""
        subs = [self.topics.z0("+", self.id)]
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
        """Route one validated message into the barrier buffers (never raises)."""
        if isinstance(msg, XMsg):
            self._on_x(msg)
        elif isinstance(msg, Z0Msg):
            self._on_z0(msg)
        elif isinstance(msg, StatusMsg):
            if msg.node in self._nbr_set:
                self._nbr_state[msg.node] = msg.state
                if all(self._nbr_state.get(j) in ("online", "running", "done") for j in self.neighbours):
                    self._online.set()
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

    def _accept_x(self, j: int, t: int, x: float) -> None:
        """Buffer x_j^(t) of neighbour j (checked: neighbour, phase); the barrier's hot path."""
        if t < self._t_now:
            self.duplicates += 1
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
            self._x_wait_t = t
            self._x_waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(self.neighbour_timeout):
                    await self._x_waiter
            except TimeoutError:
                have = self._xbuf.get(t, {})
                missing = [j for j in self.neighbours if j not in have]
                within = self.neighbour_timeout
                raise NeighbourTimeoutError(
                    f"node {self.id}: no x^({t}) from neighbour(s) {missing} within {within:g} s"
                ) from None
            finally:
                self._x_wait_t = -1
                self._x_waiter = None
        return self._xbuf.pop(t)

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
        except ExceptionGroup as group:
            raise group.exceptions[0] from None
        return result

    async def _status(self, state: Literal["online", "running", "done"], **extra: object) -> None:
        msg = StatusMsg.model_validate({"node": self.id, "state": state, **extra})
        await self.transport.publish(self.topics.status(self.id), encode(msg), qos=1, retain=True)

    async def _protocol(self) -> NodeResult:
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
        await self._status("running")
        started = time.perf_counter()
        finals, xs, z0_sent = await self._iterate()
        seconds = time.perf_counter() - started
        output = combine(self.cfg, self.phases, [np.array([f]) for f in finals])
        out_list = [float(v) for v in np.ravel(output)]
        await self._status("done", final=finals, output=out_list, iterations=self.t_total)
        return NodeResult(
            node=self.id,
            value=self.value,
            finals=finals,
            output=out_list,
            iterations=self.t_total,
            seconds=seconds,
            z0_sent=z0_sent,
            x=xs,
            rejected=self.rejected,
            duplicates=self.duplicates,
        )

    async def _exchange_z0(self, phase: Phase, rng: np.random.Generator, signs: FloatArray) -> FloatArray:
        z_out = draw_z0(phase.init, signs, rng)
        for j, z in zip(self.neighbours, z_out.tolist(), strict=True):
            msg = Z0Msg.model_validate({"from": self.id, "to": j, "group": phase.group, "z": z})
            await self.transport.publish(self.topics.z0(self.id, j), encode(msg), qos=1)
        return z_out

    async def _iterate(self) -> tuple[list[float], list[float], dict[str, list[float]]]:
        cfg, nbrs = self.cfg, self.neighbours
        d = len(nbrs)
        rng = rng_for(self.seed, "node", 0, self.id)
        s_used = perturb_value(self.value, value_noise(cfg), cfg.sigma_s, rng)
        s_arr = np.array([s_used])
        signs = np.array([1.0 if self.id < j else -1.0 for j in nbrs])
        src = np.zeros(d, dtype=np.int64)
        cd = np.array([float(d)])
        u_out = np.zeros(d)
        u_in = np.zeros(d)
        finals: list[float] = []
        identified: list[float] = []
        xs: list[float] = []
        z0_sent: dict[str, list[float]] = {}
        group = ""
        t = 0
        x_topic = self.topics.x(self.id)
        for phase in self.phases:
            c = phase_c(cfg, phase)
            cd_c = cd * c
            if phase.group != group:
                group = phase.group
                self._t_now = t
                z_out = await self._exchange_z0(phase, rng, signs)
                z0_sent[group] = z_out.tolist()
                z_in = await self._inbox.take(("z0", group), self.startup_timeout, f"z0 ({group})", self.id)
                self._groups_done.add(group)
                u_out = signs * z_out
                u_in = -signs * np.array([z_in[j] for j in nbrs])
                identified = []
            skip = bypassed(phase, s_arr, np.array(identified).reshape(-1, 1), cfg.epsilon)
            s_eff = effective_values(phase, s_arr, skip)
            for _ in range(phase.t_len):
                self._t_now = t
                v = dual_sum(u_out, src, 1)
                x = float(x_update(phase.objective, v, s_eff, cd_c)[0])
                xs.append(x)
                if self.corrupt:
                    self._publish_state(t, s_used, signs, u_out, u_in)
                self.transport.publish_nowait(x_topic, encode_x(self.id, t, phase.name, x), qos=1)
                got = await self._take_x(t)
                x_nbrs = np.array([got[j] for j in nbrs])
                u_out_new = z_update(u_out, u_in, x_nbrs, c, cfg.theta)
                u_in = z_update(u_in, u_out, np.full(d, x), c, cfg.theta)
                u_out = u_out_new
                t += 1
            finals.append(xs[-1])
            identified.append(xs[-1])
        return finals, xs, z0_sent

    def _publish_state(
        self, t: int, s: float, signs: FloatArray, u_out: FloatArray, u_in: FloatArray
    ) -> None:
        z = (signs * u_out).tolist()
        z_in = (-signs * u_in).tolist()
        msg = AdvStateMsg(
            node=self.id,
            t=t,
            s=s,
            z={str(j): v for j, v in zip(self.neighbours, z, strict=True)},
            z_in={str(j): v for j, v in zip(self.neighbours, z_in, strict=True)},
        )
        self.transport.publish_nowait(self.topics.adv(self.id), encode(msg), qos=1)


async def host_nodes(
    nodes: list[Node],
    transport: Transport,
    prefix: str,
    run_id: str,
    on_reject: Callable[[str, WireError], None] | None = None,
) -> list[NodeResult]:
    """Run several nodes over one shared connection (``--in-process``): one reader dispatches to all.

    The transport must already be connected; every node must have ``own_transport=False``.
    Messages that fail to decode are logged and passed to ``on_reject(topic, error)``; those that
    decode but do not fit a node's state are counted by that node (``NodeResult.rejected``).
    """
    t = topics(prefix, run_id)
    await transport.subscribe(t.x("+"), t.status("+"), t.z0("+", "+"))
    hosted = {node.id: node for node in nodes}
    phase_at = nodes[0]._phase_at
    schedule_len = len(phase_at)
    listeners: dict[int, list[Node]] = {}
    for node in nodes:
        for j in node.neighbours:
            listeners.setdefault(j, []).append(node)

    async def reader() -> None:
        async for raw in transport.messages():
            try:
                info, msg = decode(raw.topic, raw.payload, prefix, run_id)
            except WireError as exc:
                log.warning("host: rejected message on %s (%s)", raw.topic, exc)
                if on_reject is not None:
                    on_reject(raw.topic, exc)
                continue
            if isinstance(msg, XMsg):
                # One schedule check per message, then the barrier fast path of every listener.
                if msg.t >= schedule_len or msg.phase != phase_at[msg.t]:
                    misfit = WireError("t/phase", (msg.t, msg.phase), "does not fit the run's schedule")
                    log.warning("host: rejected message on %s (%s)", raw.topic, misfit)
                    if on_reject is not None:
                        on_reject(raw.topic, misfit)
                    continue
                for node in listeners.get(msg.node, ()):
                    node._accept_x(msg.node, msg.t, msg.x)
            elif info.kind == "z0":
                target = hosted.get(info.peer if info.peer is not None else -1)
                if target is not None:
                    target.handle(info, msg)
            else:
                for node in listeners.get(info.node if info.node is not None else -1, ()):
                    node.handle(info, msg)
        raise NlaggError("host: connection to the broker closed during the run")

    try:
        async with asyncio.TaskGroup() as tg:
            read_task = tg.create_task(reader())
            runs = [tg.create_task(node.run()) for node in nodes]
            try:
                results = [await r for r in runs]
            finally:
                read_task.cancel()
    except ExceptionGroup as group:
        raise group.exceptions[0] from None
    return results
