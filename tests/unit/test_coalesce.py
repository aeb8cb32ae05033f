"""A host's x's of an iteration in one message (``P/R/host/{lo}-{hi}/x``), on the in-memory transport:
each item is the x its node publishes alone, a receiver takes it as that, an item of a node the host
does not host is refused, named, and a forged item in a signed run is refused as a lone forged x is."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.protocol import new_identity
from nlagg_node.protocol.chain import KeyChain
from nlagg_node.protocol.identity import SIG_SUFFIX_BYTES
from nlagg_node.rng import rng_for
from nlagg_node.runtime.barrier import Barrier
from nlagg_node.runtime.coalesce import id_runs
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.runtime.routing import Router
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import (
    MAX_BATCH,
    WireError,
    batch_range,
    encode_x,
    encode_x_batch,
    split_x_batch,
    topics,
)
from nlagg_node.sim import simulate
from tests.harness.forgery import X_WAYS, forged_xs
from tests.harness.transcripts import x_payloads

RUN = "co"
TP = topics("nlagg", RUN)
CFG = RunConfig(op="max", n=6, trials=1, t_max=60, seed=3, record="all")  # early stop: x's with fields


class XLog(MemoryBroker):
    """Every x published, alone (by topic) or in a host's batch (by its items), by ``(node, t)``."""

    def __init__(self) -> None:
        super().__init__()
        self.alone: dict[tuple[int, int], bytes] = {}
        self.batched: dict[tuple[int, int], bytes] = {}
        self.batches = 0

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        xs = x_payloads(topic, payload, RUN)
        if xs is not None and batch_range(topic, "nlagg", RUN) is not None:
            self.batches += 1
            self.batched.update(xs)
        elif xs is not None:
            self.alone.update(xs)
        super().route(topic, payload, retain)


def nodes_of(cfg: RunConfig, transport: MemoryTransport, **extra: object) -> list[Node]:
    values = simulate(cfg).values[0]
    edges = run_edges(cfg)
    return [
        Node(cfg, i, values[i], transport, run_id=RUN, edges=edges, own_transport=False, **extra)  # type: ignore[arg-type]
        for i in range(cfg.n)
    ]


async def run_lone(cfg: RunConfig, broker: MemoryBroker) -> list[NodeResult]:
    values = simulate(cfg).values[0]
    edges = run_edges(cfg)

    async def one(i: int) -> NodeResult:
        async with Node(cfg, i, values[i], MemoryTransport(broker, f"n{i}"), run_id=RUN, edges=edges) as node:
            return await node.run()

    return list(await asyncio.gather(*(one(i) for i in range(cfg.n))))


@pytest.mark.parametrize(
    ("ids", "runs"),
    [([0, 1, 2, 3], [(0, 4)]), ([0, 1, 3, 4, 5], [(0, 2), (2, 5)]), ([2], [(0, 1)]), ([], [])],
    ids=["one-run", "two-runs", "one-node", "none"],
)
def test_a_host_batches_each_run_of_consecutive_ids(ids: list[int], runs: list[tuple[int, int]]) -> None:
    assert id_runs(ids) == runs
    assert id_runs(list(range(2 * MAX_BATCH + 1))) == [
        (0, MAX_BATCH),
        (MAX_BATCH, 2 * MAX_BATCH),
        (2 * MAX_BATCH, 2 * MAX_BATCH + 1),
    ]


async def test_a_hosts_batches_carry_the_very_x_payloads_its_nodes_publish_alone() -> None:
    """The hosted nodes publish no x on their own topics: one batch per iteration, whose items are,
    byte for byte, the x's the same nodes publish as processes of their own; the outputs agree."""
    hosted, lone = XLog(), XLog()
    async with MemoryTransport(hosted, "host") as tr:
        results = await host_nodes(nodes_of(CFG, tr), tr, "nlagg", RUN)
    alone = await run_lone(CFG, lone)
    assert hosted.alone == {}
    assert lone.batched == {}
    assert hosted.batched == lone.alone
    assert hosted.batches == results[0].iterations
    assert [r.output for r in results] == [r.output for r in alone]
    assert all(r.rejected == 0 for r in results)


def test_a_batch_splits_into_its_items_on_their_nodes_topics() -> None:
    items = [encode_x(node=i, t=4, phase="max", x=0.1 * i, quiet=2) for i in (3, 4)]
    payload = encode_x_batch(items)
    split = split_x_batch(TP.x_batch(3, 4), payload, "nlagg", RUN)
    assert split is not None
    got, refused = split
    assert [(it.topic, it.payload, it.msg.node) for it in got] == [
        (TP.x(3), items[0], 3),
        (TP.x(4), items[1], 4),
    ]
    assert refused == []
    assert batch_range(TP.x(3), "nlagg", RUN) is None
    assert split_x_batch(TP.x(3), items[0], "nlagg", RUN) is None


@pytest.mark.parametrize(
    ("topic", "payload", "field"),
    [
        (f"{TP.base}/host/4-3/x", b'{"v":1,"xs":[]}', "topic"),
        (f"{TP.base}/host/03-4/x", b'{"v":1,"xs":[]}', "topic"),
        (f"{TP.base}/host/3-4/y", b'{"v":1,"xs":[]}', "topic"),
        (TP.x_batch(3, 4), b'{"v":1,"xs":[]}', "payload"),
        (TP.x_batch(3, 4), b'{"v":1,"xs":[{"v":1,"node":3,"t":0,"phase":"max","x":"a"}]}', "xs[0].x"),
        (TP.x_batch(3, 4), b'{"v":1,"xs":[{"v":1,"node":3,"t":0,"phase":"max","x":1e999}]}', "xs[0].x"),
    ],
    ids=["descending", "leading-zero", "not-x", "empty", "x-not-a-number", "x-infinite"],
)
def test_a_malformed_batch_is_refused_whole_and_named(topic: str, payload: bytes, field: str) -> None:
    with pytest.raises(WireError) as caught:
        split_x_batch(topic, payload, "nlagg", RUN)
    assert caught.value.field == field


def test_an_item_of_a_node_the_host_does_not_host_is_refused_named_the_others_taken() -> None:
    """Host 0-1's batch carrying an x of node 2: that item is refused, naming it and the host's
    range; node 1's x in the same batch is taken by every hosted neighbour of node 1."""
    rejected: list[tuple[str, WireError]] = []
    nodes = nodes_of(CFG, MemoryTransport(MemoryBroker(), "host"))
    members = [nd.member for nd in nodes]
    router = Router(members, lambda topic, exc: rejected.append((topic, exc)))
    phase = members[0].phase_at[0]
    items = [encode_x(node=j, t=0, phase=phase, x=0.5 + j, quiet=0) for j in (1, 2)]
    router.feed(Message(TP.x_batch(0, 1), encode_x_batch(items)))
    assert [(topic, exc.field, exc.value) for topic, exc in rejected] == [(TP.x_batch(0, 1), "xs[1].node", 2)]
    assert "not a node of host 0-1" in str(rejected[0][1])
    listeners = {j: [m for m in members if j in m.neighbours] for j in (1, 2)}
    assert listeners[1]
    assert listeners[2]
    assert all(m.x_in.put(0, m.slot[1], 1.5) == "dup" for m in listeners[1])  # taken from the batch
    assert all(m.x_in.put(0, m.slot[2], 2.5) == "new" for m in listeners[2])  # never taken


SIGNED = RunConfig(op="max", n=6, trials=1, t_max=40, seed=3, record="all", early_stop=False)
AT = 10  # the forged items come right after the host's batch of x^(AT)


def forged_items(genuine: bytes) -> list[bytes]:
    """x_1^(AT) forged: every way :data:`~tests.harness.forgery.X_WAYS` forges one, and the genuine
    item with another number, keeping its key-chain element and signature (a conflict whose signature
    does not verify)."""
    body = json.loads(genuine)
    own = new_identity()
    chain = KeyChain(own.chain_seed("forger"), 1 + SIGNED.t_max_value)
    rng = rng_for(0, "coalesce-forge")
    forged = [
        p
        for _, p in forged_xs(
            1, [AT], lambda _: body["phase"], 9.0, None, lambda: rng.bytes(16), (own, chain), TP.x(1)
        )
    ]
    assert len(forged) == len(X_WAYS) - 1  # no copied element: that is the genuine one below
    other = encode_x(node=1, t=AT, phase=body["phase"], x=body["x"] + 1.0, k=body["k"])
    return [*forged, other[:-1] + genuine[-SIG_SUFFIX_BYTES:]]


async def test_forged_items_of_a_signed_run_are_refused_as_lone_forged_xs_are() -> None:
    """In a signed hosted run, a second batch on the host's topic carrying x_1^(AT) forged (no or a
    wrong key-chain element, another identity's signature, the genuine element and signature on
    another number) is refused item by item, named; the run is the simulator's, bit for bit."""
    ids = [new_identity() for _ in range(SIGNED.n)]
    keys = [identity.public for identity in ids]
    broker = MemoryBroker()
    route = broker.route
    injected: list[int] = []

    def forge(topic: str, payload: bytes, retain: bool) -> None:
        route(topic, payload, retain)
        batch = split_x_batch(topic, payload, "nlagg", RUN)
        if batch is not None and not injected and batch[0][0].msg.t == AT:
            genuine = next(it.payload for it in batch[0] if it.msg.node == 1)
            items = forged_items(genuine)
            injected.append(len(items))
            route(topic, encode_x_batch(items), False)

    broker.route = forge  # type: ignore[method-assign]
    rejected: list[tuple[str, WireError]] = []
    values = simulate(SIGNED).values[0]
    edges = run_edges(SIGNED)
    async with MemoryTransport(broker, "host") as tr:
        nodes = [
            Node(
                SIGNED,
                i,
                values[i],
                tr,
                run_id=RUN,
                edges=edges,
                own_transport=False,
                identities=keys,
                identity=ids[i],
            )
            for i in range(SIGNED.n)
        ]
        results = await host_nodes(nodes, tr, "nlagg", RUN, on_reject=lambda t, e: rejected.append((t, e)))
    assert injected == [len(X_WAYS)]
    assert {topic for topic, _ in rejected} == {TP.x(1)}
    assert sorted({exc.field for _, exc in rejected}) == ["k", "sig"]
    assert any("does not verify with node 1's identity" in str(exc) for _, exc in rejected)
    sim = simulate(SIGNED)
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])


def test_a_batch_is_a_json_object_of_the_items_verbatim() -> None:
    items = [encode_x(node=0, t=1, phase="max", x=0.1 + 0.2), encode_x(node=1, t=1, phase="max", x=-3e-300)]
    payload = encode_x_batch(items)
    assert json.loads(payload) == {"v": 1, "xs": [json.loads(p) for p in items]}


def fresh_barrier() -> Barrier:
    """Five senders' x's, at position 3 (x^(0..2) taken: 1.0 from every slot)."""
    barrier = Barrier(0, [1, 2, 3, 4, 5], "x^({})", timeout=30.0, end=50, window=2, keep=8)
    for key in range(3):
        for slot in range(5):
            barrier.put(key, slot, 1.0)
        barrier.next = key + 1  # taken (what take() leaves behind, without waiting)
    return barrier


ROWS = [
    ("in-window", [], 3, [0.5] * 5),
    ("next-one", [], 4, [0.5] * 5),
    ("ahead", [], 5, [0.5] * 5),
    ("taken-dup-and-conflict", [], 2, [1.0, 1.0, 2.0, 1.0, 1.0]),
    ("half-there", [(3, 1, 0.5), (3, 3, 0.7)], 3, [0.5, 0.5, 0.5, 0.6, 0.5]),
    ("departed-slot", [("gone", 2, 3)], 3, [0.5] * 5),
    ("halted-slot", [("halt", 4, (2, 10))], 3, [0.5] * 5),
    ("past-the-end", [], 50, [0.5] * 5),
]


@pytest.mark.parametrize(("before", "key", "values"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_row_gets_the_verdicts_one_put_per_slot_gets(
    before: list[tuple[object, int, object]], key: int, values: list[float]
) -> None:
    """``put_row`` is ``put`` slot by slot: the same verdicts and the same values kept afterwards."""
    row, single = fresh_barrier(), fresh_barrier()
    for barrier in (row, single):
        for what, slot, arg in before:
            if what == "gone":
                barrier.depart(slot, arg)  # type: ignore[arg-type]
            elif what == "halt":
                barrier.halted(slot, arg)  # type: ignore[arg-type]
            else:
                barrier.put(what, slot, arg)  # type: ignore[arg-type]
    slots = [0, 1, 2, 3, 4]
    got = row.put_row(key, slots, values)
    want = [single.put(key, slot, v) for slot, v in zip(slots, values, strict=True)]
    assert (got or ["new"] * 5) == want
    probe = [row.put(key, slot, 9.0) for slot in slots]
    assert probe == [single.put(key, slot, 9.0) for slot in slots]


def test_a_batch_with_a_node_twice_is_taken_one_x_at_a_time_each_refusal_once() -> None:
    """A batch carrying node 1's x twice (a copy: a duplicate for each listener) and an x of node 2
    of the wrong phase: the copy is counted once per listener, the wrong x refused once, named."""
    rejected: list[tuple[str, WireError]] = []
    nodes = nodes_of(CFG, MemoryTransport(MemoryBroker(), "host"))
    members = [nd.member for nd in nodes]
    router = Router(members, lambda topic, exc: rejected.append((topic, exc)))
    phase = members[0].phase_at[0]
    one = encode_x(node=1, t=0, phase=phase, x=1.5, quiet=0)
    wrong = encode_x(node=2, t=0, phase="not-a-phase", x=2.5, quiet=0)
    router.feed(Message(TP.x_batch(0, 5), encode_x_batch([one, wrong, one])))
    assert [(topic, exc.field) for topic, exc in rejected] == [(TP.x(2), "x")]
    listeners = [m for m in members if 1 in m.neighbours]
    assert [m.duplicates for m in listeners] == [1] * len(listeners)
    assert all(m.x_in.put(0, m.slot[1], 1.5) == "dup" for m in listeners)
