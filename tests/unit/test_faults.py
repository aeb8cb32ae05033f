"""Reliability in-process: checkpoints, the transcript's completeness, hostile payloads against the
decoder and a node, duplicates in a running memory network (the faulty runs on a real Mosquitto:
tests/integration/test_faults.py).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError, WireError
from nlagg_node.runtime.checkpoint import Checkpoint, CheckpointStore
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node
from nlagg_node.runtime.public import run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import XMsg, decode, encode, encode_x, topics


def test_checkpoint_is_atomic_and_refuses_another_run(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "r1", 3)
    ck = Checkpoint("fp", "x", 2, 0, "max", 0.25, {"a": 1}, u_out=[0.1, -2.5], xs=[1.0, 0.1 + 0.2])
    store.save(ck)
    with store.xlog.open("a") as f:
        f.write("7.5\n")  # an x appended after the last checkpoint, then a crash
    loaded = CheckpointStore(tmp_path, "r1", 3).load("fp")
    assert loaded is not None
    assert (loaded.stage, loaded.t, loaded.u_out, loaded.xs, loaded.n_x) == ("x", 2, [0.1, -2.5], ck.xs, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nlagg-r1-node-3.json", "nlagg-r1-node-3.xlog"]
    assert store.xlog.read_text().splitlines() == ["1.0", "0.30000000000000004"]  # the extra x dropped
    with pytest.raises(ConfigError, match="another configuration"):
        store.load("other")
    assert CheckpointStore(tmp_path, "r2", 3).load("fp") is None


def test_completeness_ignores_valid_looking_messages_outside_the_run(tmp_path: Path) -> None:
    t = topics("nlagg", "done")
    with Transcript(tmp_path / "t.sqlite", run_id="done") as tr:
        for i, j in ((0, 1), (1, 0)):
            tr.add(t.z0(i, j), b'{"v":1,"from":%d,"to":%d,"group":"max","z":0.5}' % (i, j))
        tr.add(t.z0(0, 1), b'{"v":1,"from":0,"to":1,"group":"nope","z":0.5}')  # unknown group
        tr.add(t.z0(0, 2), b'{"v":1,"from":0,"to":2,"group":"max","z":0.5}')  # not an edge
        for k in range(2):
            tr.add(t.x(k), encode_x(node=k, t=0, phase="max", x=1.0))
        tr.add(t.x(7), encode_x(node=7, t=0, phase="max", x=1.0))  # not a node of the run
        assert tr.complete(2, 1, [[0, 1]], {"max"}) == (0, 0)
        assert tr.complete(2, 2, [[0, 1]], {"max", "min"}) == (2, 2)


RUN = "fuzz"


T = topics("nlagg", RUN)


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(), st.text(max_size=8)
)


x_like = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2, "1"]), "node": st.integers(-1, 7), "t": st.integers(-1, 200)},
    optional={"phase": st.sampled_from(["max", "min", ""]), "x": json_scalars, "extra": json_scalars},
)


payloads = st.one_of(
    st.binary(max_size=64),
    x_like.map(lambda d: json.dumps(d).encode()),
    st.dictionaries(st.sampled_from(["v", "from", "to", "group", "z", "state", "final"]), json_scalars).map(
        lambda d: json.dumps(d).encode()
    ),
)


run_topics = st.one_of(
    st.builds(T.x, st.integers(0, 7)),
    st.builds(T.z0, st.integers(0, 7), st.integers(0, 7)),
    st.builds(T.status, st.integers(0, 7)),
    st.builds(T.adv, st.integers(0, 7)),
    st.sampled_from([T.config, f"{T.base}/node/1/y", f"{T.base}/node/01/x", f"{T.base}/x"]),
)


@settings(max_examples=300, deadline=None)
@given(run_topics, payloads)
def test_decode_raises_only_wire_errors(topic: str, payload: bytes) -> None:
    error: WireError | None
    try:
        info, msg = decode(topic, payload, "nlagg", RUN)
    except WireError as exc:
        error = exc
    else:
        error = None
    if error is not None:
        assert error.field in str(error)  # names the field
        return
    for value in (msgspec.structs.asdict(msg) if isinstance(msg, XMsg) else msg.model_dump()).values():
        if isinstance(value, float):
            assert math.isfinite(value)
    assert encode(msg)  # whatever decodes encodes again
    assert info.kind in ("config", "z0", "x", "status", "adv")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(run_topics, payloads), max_size=30))
def test_node_message_handling_never_raises_and_counts_what_it_refuses(
    messages: list[tuple[str, bytes]],
) -> None:
    cfg = RunConfig(op="max", n=8, trials=1, t_max=150, seed=1)
    node = Node(cfg, 3, 0.5, MemoryTransport(MemoryBroker(), "n3"), run_id=RUN)
    for topic, payload in messages:
        before = node.rejected
        node.feed(Message(topic, payload))
        try:
            info, msg = decode(topic, payload, "nlagg", RUN)
        except WireError:
            assert node.rejected == before + 1  # undecodable: rejected and counted
            continue
        if isinstance(msg, XMsg) and (msg.node not in node.neighbours or msg.t > 1):
            assert node.rejected == before + 1  # not a neighbour, or outside the window t = 0..1
        if info.kind == "adv":
            assert node.rejected == before + 1  # not for nodes


async def test_duplicates_are_ignored_in_a_running_network() -> None:
    """Every x re-sent identical while a memory network runs: same numbers (an altered copy is an
    equivocation that ends the run: tests/unit/test_identity.py)."""
    from nlagg_node.sim import simulate

    cfg = RunConfig(op="median", n=6, trials=1, t_max=80, seed=7, record="all")
    sim = simulate(cfg)
    broker = MemoryBroker()
    edges = run_edges(cfg)
    values = sim.values[0]
    orig_route = broker.route

    def echo(topic: str, payload: bytes, retain: bool) -> None:
        orig_route(topic, payload, retain)
        if topic.endswith("/x"):
            orig_route(topic, payload, retain)  # identical duplicate

    broker.route = echo  # type: ignore[method-assign]
    nodes = [
        Node(cfg, i, values[i], MemoryTransport(broker, f"n{i}"), run_id=RUN, edges=edges)
        for i in range(cfg.n)
    ]
    async with asyncio.TaskGroup() as tg:
        for nd in nodes:
            await nd.__aenter__()
        runs = [tg.create_task(nd.run()) for nd in nodes]
    results = [r.result() for r in runs]
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    assert all(r.duplicates > 0 and r.rejected == 0 for r in results)
