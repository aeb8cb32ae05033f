"""Several nodes of one run in one process, over one shared connection (``--in-process``).

One reader task decodes every message once and hands it to the hosted nodes that listen to its
sender; each node keeps its own checks (neighbour, window, duplicates, conflicts) and barrier.

The iterations run as one step per round over all hosted nodes: their duals live in one flat
array, node after node with neighbours ascending, ``[u_{i|j} of every node; u_{j|i} of every
node]``, and the step is the same :mod:`nlagg_node.pdmm` calls a lone
:class:`~nlagg_node.runtime.node.Node` makes on its own slice. The operations are element-wise
and :func:`~nlagg_node.pdmm.dual_sum` adds each node's duals in the same order, so the numbers
are bit for bit those of separate processes and of the simulator. One iterating coroutine per
node, with numpy calls on five-element arrays, spent more on scheduling and call overhead than on
the math (n = 15 on Mosquitto: 1.32 ms of host CPU per round, 1.08 ms batched; the raw MQTT
baseline of ``benchmarks/bench_testbed.py`` takes 1.01 ms). Nodes with a checkpoint store run
their own per-node loop (resume is per node).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import numpy as np

from ..errors import NlaggError
from ..init import draw_z0, perturb_value
from ..pdmm import dual_sum, x_update, z_update
from ..rng import rng_for
from ..schedule import bypassed, effective_values, phase_c, value_noise
from .barrier import NodeResult, first_error
from .node import FloatArray, Node
from .transport import Transport
from .wire import WireError, XMsg, decode, encode_x, topics

__all__ = ["host_nodes"]

log = logging.getLogger("nlagg.node")
T = TypeVar("T")


async def _all(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    return [t.result() for t in tasks]


async def host_nodes(
    nodes: list[Node],
    transport: Transport,
    prefix: str,
    run_id: str,
    on_reject: Callable[[str, WireError], None] | None = None,
) -> list[NodeResult]:
    """Run several nodes over one shared connection: one reader dispatches to all.

    The transport must already be connected; every node must have ``own_transport=False`` and
    the same run configuration. Messages that fail to decode are logged and passed to
    ``on_reject(topic, error)``; those that decode but do not fit a node's state are counted by
    that node (``NodeResult.rejected``).
    """
    if not nodes:
        return []
    if any(node.public != nodes[0].public for node in nodes):
        raise NlaggError("host_nodes: the hosted nodes must share one run configuration")
    t = topics(prefix, run_id)
    await transport.subscribe(t.x("+"), t.status("+"), t.z0("+", "+"))
    hosted = {node.id: node for node in nodes}
    phase_at = nodes[0]._phase_at
    schedule_len = len(phase_at)
    listeners: dict[int, list[Node]] = {}
    for node in nodes:
        for j in node.neighbours:
            listeners.setdefault(j, []).append(node)

    def reject(topic: str, exc: WireError) -> None:
        log.warning("host: rejected message on %s (%s)", topic, exc)
        if on_reject is not None:
            on_reject(topic, exc)

    async def reader() -> None:
        async for raw in transport.messages():
            try:
                info, msg = decode(raw.topic, raw.payload, prefix, run_id)
            except WireError as exc:
                reject(raw.topic, exc)
                continue
            if isinstance(msg, XMsg):
                # One schedule check per message, then the barrier fast path of every listener.
                if msg.t >= schedule_len or msg.phase != phase_at[msg.t]:
                    reject(
                        raw.topic, WireError("t/phase", (msg.t, msg.phase), "does not fit the run's schedule")
                    )
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

    batched = all(node.store is None for node in nodes)
    try:
        async with asyncio.TaskGroup() as tg:
            read_task = tg.create_task(reader())
            try:
                if batched:
                    results = await _run_batched(nodes)
                else:
                    results = await _all([node.run() for node in nodes])
            finally:
                read_task.cancel()
                for node in nodes:
                    node._cancel_watchdog()
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    return results


async def _run_batched(nodes: list[Node]) -> list[NodeResult]:
    await _all([node._announce() for node in nodes])
    await _all([node._status("running") for node in nodes])
    started = time.perf_counter()
    finals, xs, z0_sent = await _iterate_batched(nodes)
    seconds = time.perf_counter() - started
    return await _all([node._finish(finals[k], xs[k], z0_sent[k], seconds) for k, node in enumerate(nodes)])


async def _iterate_batched(
    nodes: list[Node],
) -> tuple[list[list[float]], list[list[float]], list[dict[str, list[float]]]]:
    """Every phase for every hosted node; :meth:`Node._iterate` element for element."""
    cfg, phases = nodes[0].cfg, nodes[0].phases
    h = len(nodes)
    deg = np.array([len(node.neighbours) for node in nodes])
    d_all = int(deg.sum())
    start = np.concatenate([[0], np.cumsum(deg)])
    own = [slice(int(start[k]), int(start[k + 1])) for k in range(h)]
    owner = np.repeat(np.arange(h), deg)
    swap = np.concatenate([np.arange(d_all, 2 * d_all), np.arange(d_all)])
    signs = np.array([1.0 if node.id < j else -1.0 for node in nodes for j in node.neighbours])
    cd = deg.astype(np.float64)
    rngs = [rng_for(node.seed, "node", 0, node.id) for node in nodes]
    s_used = np.array(
        [
            perturb_value(node.value, value_noise(cfg), cfg.sigma_s, rng)
            for node, rng in zip(nodes, rngs, strict=True)
        ]
    )
    x_topics = [node.topics.x(node.id) for node in nodes]
    publish = nodes[0].transport.publish_nowait
    w = np.zeros(2 * d_all)
    x_dst = np.empty(2 * d_all)
    finals: list[list[float]] = [[] for _ in nodes]
    xs: list[list[float]] = [[] for _ in nodes]
    z0_sent: list[dict[str, list[float]]] = [{} for _ in nodes]
    identified: list[FloatArray] = []
    group, t = "", 0
    for p_idx, phase in enumerate(phases):
        c = phase_c(cfg, phase)
        cd_c = cd * c
        if phase.group != group:
            group = phase.group
            for node in nodes:
                node._t_now = t
            z_out = [draw_z0(phase.init, signs[own[k]], rngs[k]) for k in range(h)]
            for k in range(h):
                z0_sent[k][group] = z_out[k].tolist()
            identified = []
            z_in = await _all([node._exchange_z0(group, z_out[k]) for k, node in enumerate(nodes)])
            z_in_flat = np.array([z_in[k][j] for k, node in enumerate(nodes) for j in node.neighbours])
            w = np.concatenate([signs * np.concatenate(z_out), -signs * z_in_flat])
        skip = bypassed(phase, s_used, np.array(identified).reshape(-1, h), cfg.epsilon)
        s_eff = effective_values(phase, s_used, skip)
        name = phase.name
        end = nodes[0]._phase_start[p_idx] + phase.t_len
        for t in range(t, end):  # noqa: B020 - t carries on across phases
            for node in nodes:
                node._t_now = t
            v = dual_sum(w[:d_all], owner, h)
            x = x_update(phase.objective, v, s_eff, cd_c)
            x_list: list[float] = x.tolist()
            for k, node in enumerate(nodes):
                xk = x_list[k]
                xs[k].append(xk)
                if node.corrupt:
                    sl = own[k]
                    node._publish_state(t, float(s_used[k]), signs[sl], w[:d_all][sl], w[d_all:][sl])
                payload = encode_x(node.id, t, name, xk)
                node._sent_x[t] = payload
                node._sent_x.pop(t - 2, None)
                publish(x_topics[k], payload, qos=1)
            got_flat: list[float] = []
            for node in nodes:
                got = await node._take_x(t)
                got_flat += [got[j] for j in node.neighbours]
            x_dst[:d_all] = got_flat
            x_dst[d_all:] = x[owner]
            w = z_update(w, w[swap], x_dst, c, cfg.theta)
        t = end
        last = np.array([row[-1] for row in xs])
        for k in range(h):
            finals[k].append(xs[k][-1])
        identified.append(last)
    return finals, xs, z0_sent
