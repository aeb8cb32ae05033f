"""The async node over the in-memory transport: bit-for-bit equal to the simulator, robust to junk."""

from __future__ import annotations

import asyncio
import logging
import re

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.errors import NlaggError
from nlagg_node.graphs import EdgeLayout, neighbours
from nlagg_node.runtime import peers
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import NeighbourTimeoutError, Node, NodeResult, node_will, run_edges
from nlagg_node.runtime.runparts import RunParts
from nlagg_node.runtime.wire import AdvStateMsg, StatusMsg, Z0Msg, decode, encode, topics
from nlagg_node.sim import draw_values, simulate

RUN = "mem"
T = topics("nlagg", RUN)


async def run_nodes(
    cfg: RunConfig, broker: MemoryBroker, *, shared: bool, corrupt: frozenset[int] = frozenset()
) -> list[NodeResult]:
    s = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    if shared:
        async with MemoryTransport(broker, "host") as tr:
            parts = RunParts.of(cfg, RUN, edges)  # built once for every hosted node, as the testbed does
            nodes = [
                Node(cfg, i, s[i], tr, run_id=RUN, parts=parts, own_transport=False, corrupt=i in corrupt)
                for i in range(cfg.n)
            ]
            return await host_nodes(nodes, tr, "nlagg", RUN)

    async def one(i: int) -> NodeResult:
        tr = MemoryTransport(broker, f"node-{i}")
        async with Node(cfg, i, s[i], tr, run_id=RUN, edges=edges, corrupt=i in corrupt) as node:
            return await node.run()

    return list(await asyncio.gather(*(one(i) for i in range(cfg.n))))


@pytest.mark.parametrize(
    ("op", "shared"),
    [
        ("max", False),
        ("min", False),
        ("median", False),
        ("quantile", False),
        ("topk", False),
        ("average", False),
        ("max", True),
        ("topk", True),
        ("trimmed-mean", True),
    ],
    ids=[
        "max",
        "min",
        "median",
        "quantile",
        "topk",
        "average",
        "max-shared",
        "topk-shared",
        "trimmed-shared",
    ],
)
async def test_nodes_reproduce_simulator_bit_for_bit(op: str, shared: bool) -> None:
    level = 0.3 if op == "quantile" else 0.5  # a quantile other than the median
    cfg = RunConfig(op=op, n=8, trials=1, record="all", t_max=150, seed=11, quantile=level)
    sim = simulate(cfg)
    results = await run_nodes(cfg, MemoryBroker(), shared=shared)
    x_net = np.array([r.x for r in results]).T  # (T, n)
    assert x_net.shape == sim.recorded_x[:, 0, :].shape
    assert np.array_equal(x_net, sim.recorded_x[:, 0, :])
    layout = EdgeLayout.from_graphs(cfg.n, [run_edges(cfg)])
    for group, z_sim in sim.z0.items():
        for r in results:
            assert np.array_equal(np.array(r.z0_sent[group]), z_sim[layout.src == r.node])
    outputs = np.array([r.output for r in results]).reshape(sim.output[0].shape)
    assert np.array_equal(outputs, sim.output[0])


@pytest.mark.parametrize(
    ("field", "other"),
    [("run_id", "other-run"), ("seed", 1), ("instance", "AAAAAAAAAAAAAAAAAAAAAA==")],
    ids=["run-id", "graph", "instance"],
)
def test_parts_of_another_run_are_refused(field: str, other: object) -> None:
    cfg = RunConfig(op="max", n=6, graph="rgg", seed=3)
    edges = run_edges(cfg)
    run_id = other if field == "run_id" else RUN
    other_cfg = cfg.model_copy(update={"seed": other}) if field == "seed" else cfg
    instance = str(other) if field == "instance" else None
    parts = RunParts.of(other_cfg, str(run_id), run_edges(other_cfg), instance=instance)
    with pytest.raises(NlaggError, match="parts: built for another run"):
        Node(cfg, 0, 0.5, MemoryTransport(MemoryBroker(), "h"), run_id=RUN, edges=edges, parts=parts)


async def test_junk_is_counted_and_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cfg = RunConfig(op="max", n=6, trials=1, record="all", t_max=120, seed=5)
    sim = simulate(cfg)
    broker = MemoryBroker()
    junk = [
        (T.x(1), b"not json"),
        (T.x(1), b'{"v":1,"node":1,"t":0,"phase":"max","x":NaN}'),
        (T.x(1), b'{"v":1,"node":2,"t":0,"phase":"max","x":1.0}'),
        (T.x(1), b'{"v":1,"node":1,"t":99999,"phase":"max","x":1.0}'),
        (T.x(1), b'{"v":1,"node":1,"t":0,"phase":"max","x":1.0,"quiet":0,"departures":[0]}'),
        (T.z0(1, 0), b'{"v":1,"from":1,"to":0,"group":"nope","z":1.0}'),
        (T.status(1), b'{"v":1,"node":1,"state":"sleeping"}'),
    ]
    done = asyncio.Event()

    async def attacker() -> int:
        sent = 0
        async with MemoryTransport(broker, "attacker") as tr:
            while not done.is_set():
                for topic, payload in junk:
                    await tr.publish(topic, payload)
                    sent += 1
                await asyncio.sleep(0.001)
        return sent

    with caplog.at_level(logging.WARNING, logger="nlagg.node"):
        task = asyncio.create_task(attacker())
        results = await run_nodes(cfg, broker, shared=False)
        done.set()
        assert await task > 0
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    nbrs = neighbours(cfg.n, run_edges(cfg))
    assert all(r.rejected > 0 for r in results if 1 in nbrs[r.node])
    assert "rejected message" in caplog.text
    assert "x_1^(0): departures in a run whose nodes may not depart" in caplog.text  # protocol.x_form_error


async def test_missing_neighbour_is_named_after_timeout() -> None:
    cfg = RunConfig(op="max", n=6, trials=1, t_max=50, seed=5)
    broker = MemoryBroker()
    tr = MemoryTransport(broker, "node-0")
    node = Node(cfg, 0, 1.0, tr, run_id=RUN, startup_timeout=0.2, neighbour_timeout=0.2)
    async with node:
        with pytest.raises(
            NeighbourTimeoutError, match=r"node 0: neighbour\(s\) \[.*\] not online within 0.2 s"
        ):
            await node.run()


async def test_silent_neighbour_is_named_at_the_barrier() -> None:
    cfg = RunConfig(op="max", n=6, trials=1, t_max=50, seed=5)
    broker = MemoryBroker()
    node = Node(cfg, 0, 1.0, MemoryTransport(broker, "node-0"), run_id=RUN, neighbour_timeout=0.3)
    fakes = node.neighbours
    async with MemoryTransport(broker, "fakes") as tr:
        for j in fakes:  # announce and send z0, but never an x
            await tr.publish(T.status(j), encode(StatusMsg(node=j, state="online")), retain=True)
        async with node:
            task = asyncio.create_task(node.run())
            await asyncio.sleep(0.05)
            for j in fakes:
                z0 = Z0Msg.model_validate({"from": j, "to": 0, "group": "max", "z": 1.0})
                await tr.publish(T.z0(j, 0), encode(z0))
            with pytest.raises(NeighbourTimeoutError, match=re.escape(f"no x^(0) from neighbour(s) {fakes}")):
                await task


async def test_corrupted_node_forwards_its_state() -> None:
    cfg = RunConfig(op="max", n=6, trials=1, t_max=40, seed=2)
    broker = MemoryBroker()
    states: list[AdvStateMsg] = []

    async def collect(eve: MemoryTransport) -> None:
        async for raw in eve.messages():
            _, msg = decode(raw.topic, raw.payload, "nlagg", RUN)
            assert isinstance(msg, AdvStateMsg)
            states.append(msg)

    async with MemoryTransport(broker, "eve") as eve:
        await eve.subscribe(T.adv("+"))
        reader = asyncio.create_task(collect(eve))
        results = await run_nodes(cfg, broker, shared=True, corrupt=frozenset({2}))
        await asyncio.sleep(0)
    await reader
    assert [m.t for m in states] == list(range(40))
    assert {m.node for m in states} == {2}
    first = states[0]
    assert list(first.z.values()) == results[2].z0_sent["max"]


async def test_last_will_marks_node_offline() -> None:
    broker = MemoryBroker()
    tr = MemoryTransport(broker, "node-3", will=node_will("nlagg", RUN, 3))
    await tr.connect()
    tr.abort()
    _, msg = decode(T.status(3), broker.retained[T.status(3)], "nlagg", RUN)
    assert isinstance(msg, StatusMsg)
    assert msg.state == "offline"


async def test_outbox_settles_its_resends_after_a_lost_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lost session a node publishes its history at once and again later, for a capture that
    resubscribes after it; a node that finishes meanwhile waits for those resends before it exits
    (it exited first, and the capture missed an x and a state lost with the broker)."""
    monkeypatch.setattr(peers, "RESEND_AFTER", (0.05, 0.1, 0.2))
    broker = MemoryBroker()
    transport = MemoryTransport(broker, "n0")
    await transport.connect()
    outbox = peers.Outbox(transport, topics("nlagg", "r"), 0)
    outbox.send_x(0, "max", 1.0)
    before = broker.published
    outbox.republish()
    assert broker.published - before == 1  # at once
    await outbox.settle()
    assert broker.published - before == 4  # and at each of the three resends
    await outbox.settle()  # nothing pending: returns at once
