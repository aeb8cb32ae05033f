"""Bounded influence: with a declared value range, every honest x lies in the run's envelope, and a
forged x outside it is refused by the one acceptance rule (the node's and the transcript's).

The property test runs the simulator (the same math as every runtime) over operators and
initializations with pinned seeds and asserts that no honest x ever leaves the envelope, with how
close the closest came (the envelope is a proven bound: the ratio must stay below 1).
"""

from __future__ import annotations

import asyncio
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from adversary.rules import RunRules
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import NlaggError
from nlagg_node.protocol import RunShape, output_error, x_value_error
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, XMsg, Z0Msg, decode, encode, encode_x, topics
from nlagg_node.sim import simulate
from nlagg_node.valuemap import scale_for

RANGE = (-3.0, 5.0)


def shape_of(**kw: object) -> RunShape:
    cfg = RunConfig(trials=1, **kw).resolved()
    return RunShape(cfg, run_edges(cfg))


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"op": "max"}, id="max-from-above"),
        pytest.param({"op": "max", "init": "none"}, id="max-none"),
        pytest.param({"op": "max", "init": "dp-gauss"}, id="max-dp-gauss"),
        pytest.param({"op": "min", "early_stop": False, "t_max": 1500}, id="min-fixed"),
        pytest.param({"op": "topk"}, id="topk"),
        pytest.param({"op": "median"}, id="median-prior"),
        pytest.param({"op": "median", "init": "symmetric", "sigma_z": 1.0}, id="median-symmetric"),
        pytest.param({"op": "quantile", "quantile": 0.7}, id="quantile"),
        pytest.param({"op": "trimmed-mean", "k": 2}, id="trimmed-mean"),
        pytest.param({"op": "average"}, id="average"),
        pytest.param({"op": "max", "early_stop": False, "t_max": 3000, "gone": {3: 200}}, id="max-departure"),
        pytest.param({"op": "median", "may_depart": True, "gone": {3: 200, 7: 900}}, id="median-departures"),
    ],
)
def test_no_honest_x_of_the_simulator_leaves_the_envelope(kw: dict[str, object]) -> None:
    params = dict(kw)
    gone = cast("dict[int, int] | None", params.pop("gone", None))
    cfg = RunConfig(n=15, trials=20, seed=1, record="all", value_range=RANGE, **params)
    res = simulate(cfg, departures=gone)
    resolved = res.config.resolved()
    worst = 0.0
    for b in range(res.recorded_x.shape[1]):
        env = RunShape(resolved, res.graphs[b]).envelope
        assert env is not None
        phase = np.searchsorted(np.asarray(env.schedule.starts), res.recorded_t, side="right") - 1
        radius = np.asarray(env.radius)[phase][:, None] * np.asarray(env.scale)[None, :]
        x = res.recorded_x[:, b, :]
        beyond = np.maximum(x - env.s_hi, env.s_lo - x)  # > 0 outside the values' range
        worst = max(worst, float(np.nanmax(beyond / radius)))
    assert worst < 1.0, f"an honest x lay {worst:.3g} radii beyond the values' range"


def test_a_forged_x_outside_the_envelope_is_refused_and_one_inside_is_not() -> None:
    shape = shape_of(op="max", n=15, value_range=RANGE)
    assert shape.envelope is not None
    lo, hi = shape.envelope.bounds(1, 10)
    assert lo < 0.0 < 1.0 < hi  # the values' range [0, 1] (protocol scale) lies inside
    assert x_value_error(shape, 1, 10, 0.5) is None
    assert x_value_error(shape, 1, 10, hi) is None
    why = x_value_error(shape, 1, 10, 1168.0)  # issue 31's forged 2337 in a range [0, 2]
    assert why is not None
    assert "x_1^(10)=1168.0: outside" in why


def test_without_a_value_range_there_is_no_envelope() -> None:
    shape = shape_of(op="max", n=15)
    assert shape.envelope is None
    assert x_value_error(shape, 1, 10, 1e300) is None


def test_an_output_outside_the_range_names_the_neighbour_that_pulled_it() -> None:
    shape = shape_of(op="max", n=15, value_range=RANGE)
    env = shape.envelope
    assert env is not None
    scale = scale_for(shape.cfg)
    assert output_error(env, 0, [0.7], {1: 0.7, 2: 0.71}, scale) is None
    why = output_error(env, 0, [1.5], {1: 9.5, 2: 0.7, 3: 0.68}, scale)
    assert why is not None
    assert "suspect neighbour(s) [1]" in why
    assert "above" in why
    assert "output 9 lies above the values' range [-3, 5]" in why  # in the user's units
    why = output_error(env, 0, [-0.4], {1: 0.3, 2: 0.7}, scale)  # none beyond: the one pulling farthest down
    assert why is not None
    assert "suspect neighbour(s) [1]" in why
    assert "below" in why


async def test_a_node_and_the_transcript_refuse_a_forged_x_outside_the_envelope(tmp_path: Path) -> None:
    """Nodes 0 and 2 of a 6-ring (node 1's neighbours) and a transcript: node 1's forged x^(0) far
    outside the envelope is refused by all three, and the real one that follows is taken."""
    run = "env"
    tp = topics("nlagg", run)
    cfg = RunConfig(op="max", n=6, graph="ring", t_max=20, trials=1, early_stop=False, value_range=(0.0, 1.0))
    edges = run_edges(cfg)
    broker = MemoryBroker()
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                Node(cfg, i, 0.5, MemoryTransport(broker, f"n{i}"), run_id=run, edges=edges)
            )
            for i in (0, 2)
        ]
        tr = stack.enter_context(Transcript(tmp_path / "t.sqlite", run_id=run))
        tr.add(tp.config, encode(build_config_msg(cfg, run, edges)), retained=True)
        forged, real = (
            encode_x(node=1, t=0, phase="max", x=2337.0),
            encode_x(node=1, t=0, phase="max", x=1.1),
        )
        for node in nodes:
            node.feed(Message(tp.x(1), forged))
            assert node.rejected == 1
            node.feed(Message(tp.x(1), real))
            assert (node.rejected, node.duplicates) == (1, 0)
        assert tr.add(tp.x(1), forged) is None
        [(_, why)] = tr.rejected()
        assert "x_1^(0)=2337.0: outside" in why
        assert tr.add(tp.x(1), real) is not None


CANDIDATES = [
    pytest.param("max", RANGE, 1.0, None, id="range-top"),
    pytest.param("max", RANGE, 0.0, None, id="range-bottom"),
    pytest.param("max", RANGE, 1.5, "outside [0, 1]", id="range-above"),
    pytest.param("max", RANGE, -0.2, "outside [0, 1]", id="range-below"),
    pytest.param("max", None, 2.98, None, id="no-range-max-below-start"),
    pytest.param("max", None, 1e6, "not below the from-above start 2.99", id="no-range-max-1e6"),
    pytest.param("max", None, 2.99, "not below the from-above start 2.99", id="no-range-max-at-start"),
    pytest.param("min", None, -1e6, "not above the from-below start -2.99", id="no-range-min-minus-1e6"),
    pytest.param("min", None, 1e6, None, id="no-range-min-high"),
]


@pytest.mark.parametrize(("op", "value_range", "cand", "why"), CANDIDATES)
def test_a_certified_candidate_where_no_value_lies_is_refused(
    op: str, value_range: tuple[float, float] | None, cand: float, why: str | None
) -> None:
    """A candidate is some node's value: one where no value of the run lies would make every node
    pass its certificate and output it, so nodes and transcript refuse it alike. With a range
    (protocol scale [0, 1]) that is outside it; without one, beyond the one-sided start, which a
    node refuses a value beyond (check_start; issue 43, break 3: a candidate 1e6 became every
    output)."""
    cfg = RunConfig(op=op, n=8, graph="ring", t_max=300, trials=1, value_range=value_range)
    rules = RunRules(build_config_msg(cfg, "cert", run_edges(cfg)))
    msg = XMsg(node=3, t=0, phase=op, x=0.5, quiet=0, cand=cand)
    refusal = x_value_error(rules.shape, 3, 0, 0.5, cand)
    assert rules.reject(msg) == refusal
    if why is None:
        assert refusal is None
    else:
        assert f"cand of x_3^(0)={cand!r}: {why}" in str(refusal)


def test_without_a_range_or_a_one_sided_start_a_candidate_is_any_value() -> None:
    """Max from a symmetric start without a range: a node's value may be any number, so may a
    candidate (a forged one is then exactly node 3 claiming it as its own value)."""
    shape = shape_of(op="max", n=8, graph="ring", init="symmetric")
    assert shape.value_bounds is None
    assert x_value_error(shape, 3, 0, 0.5, 1e300) is None


def test_the_transcript_rules_and_the_node_rule_are_one() -> None:
    cfg = RunConfig(op="median", n=8, graph="ring", t_max=20, trials=1, early_stop=False, value_range=RANGE)
    rules = RunRules(build_config_msg(cfg, "one", run_edges(cfg)))
    for x in (0.5, 40.0, -40.0):
        msg = XMsg(node=3, t=0, phase="median", x=x)
        assert rules.reject(msg) == x_value_error(rules.shape, 3, 0, x)


async def test_an_output_pulled_outside_the_range_fails_the_node_naming_the_suspect() -> None:
    """Node 1 of a 2-node run is an impostor whose every x is 2.0: inside the envelope (about
    [-3, 4] here), outside the range [0, 1]. It pulls node 0's output there, and node 0 fails
    with one line naming it."""
    run = "pull"
    tp = topics("nlagg", run)
    cfg = RunConfig(
        op="max", n=2, graph="complete", t_max=300, trials=1, early_stop=False, value_range=(0.0, 1.0)
    )
    broker = MemoryBroker()

    async def impostor(tr: MemoryTransport) -> None:
        z0 = Z0Msg.model_validate({"from": 1, "to": 0, "group": "max", "z": 1100.0})
        await tr.publish(tp.z0(1, 0), encode(z0))
        async for raw in tr.messages():
            _, msg = decode(raw.topic, raw.payload, "nlagg", run)
            if isinstance(msg, XMsg):
                await tr.publish(tp.x(1), encode_x(node=1, t=msg.t, phase="max", x=2.0))

    async with MemoryTransport(broker, "impostor") as tr:
        await tr.subscribe(tp.x(0))
        await tr.publish(tp.status(1), encode(StatusMsg(node=1, state="online")), retain=True)
        node = Node(cfg, 0, 0.5, MemoryTransport(broker, "node-0"), run_id=run, edges=run_edges(cfg))
        async with node:
            fake = asyncio.create_task(impostor(tr))
            with pytest.raises(NlaggError, match=re.escape("suspect neighbour(s) [1]")):
                await node.run()
            fake.cancel()
