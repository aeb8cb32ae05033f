"""Stop claims checked against what a node knows (issue 43, item 1; docs/protocol.md, "Bounded
influence"): a node refuses, naming the sender, a stop it can contradict, on the in-memory transport.

An insider holding node 0's whole bundle publishes node 0's x's with a forged ``stop``. Honest
nodes must not end their phase on it: each of node 0's neighbours refuses the claim, names node 0,
and the run ends as the honest one does, every output inside the bounded-influence interval (what
node 0 could reach by lying about its own value).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from nlagg_node import load_config, simulate
from nlagg_node.config import RunConfig
from nlagg_node.protocol import fields_along
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node
from nlagg_node.runtime.public import run_edges
from nlagg_node.runtime.result import NodeResult
from nlagg_node.runtime.wire import topics
from nlagg_node.schedule import Schedule
from nlagg_node.termination import NO_STOP, Certificate, certificate_sign, stop_reach
from tests.harness.signednet import run_network

RUN = "stop-claims"
TP = topics("nlagg", RUN)
VALUES = [80.0, 85.0, 90.0, 88.0, 92.0, 95.0]
CFG = RunConfig(op="median", n=6, graph="ring", trials=1, seed=1)
BOUNDED = (88.0, 92.0)  # the median of the five honest values and any value node 0 could claim

Forge = Callable[[int], int | None]  # x_0^(t) -> the stop node 0 claims with it (None: the honest one)


async def run_ring(forge: Forge | None, cfg: RunConfig = CFG) -> list[NodeResult]:
    """The six nodes on a memory broker, node 0's x's rewritten by ``forge`` on their way out."""
    broker = MemoryBroker()
    route = broker.route

    def tamper(topic: str, payload: bytes, retain: bool) -> None:
        if forge is not None and topic == TP.x(0):
            body = json.loads(payload)
            stop = forge(body["t"])
            if stop is not None:
                body["stop"] = stop
                payload = json.dumps(body).encode()
        route(topic, payload, retain)

    broker.route = tamper  # type: ignore[method-assign]
    edges = run_edges(cfg)
    nodes = [
        Node(cfg, i, VALUES[i], MemoryTransport(broker, f"n{i}"), run_id=RUN, edges=edges) for i in range(6)
    ]
    tasks = await run_network(nodes)
    return [task.result() for task in tasks]


FORGERIES = [
    pytest.param(lambda t: 15 if 10 <= t <= 15 else None, "before the earliest stop", id="stop-15-at-t10-15"),
    pytest.param(
        lambda t: t + 3 if 150 <= t <= 152 else None,
        "this node was not at t=",
        id="plausible-stop-while-loud",
    ),
]


@pytest.mark.parametrize(("forge", "why"), FORGERIES)
async def test_a_forged_stop_is_refused_named_and_moves_no_output(
    forge: Forge, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    honest = await run_ring(None)
    with caplog.at_level(logging.WARNING, logger="nlagg.node"):
        forged = await run_ring(forge)
    assert [r.output for r in forged] == [r.output for r in honest]  # bit for bit the honest run
    assert all(BOUNDED[0] <= r.output[0] <= BOUNDED[1] for r in forged[1:])
    refusals = [rec.getMessage() for rec in caplog.records if "from node 0" in rec.getMessage()]
    assert refusals
    assert all(why in m for m in refusals), refusals
    assert {r.node for r in forged if r.rejected} == {1, 5}  # node 0's neighbours on the ring
    assert all(r.rejected == 0 for r in honest)


HALTS = [
    pytest.param("median", 150, range(150, 151), id="median-halts-at-150"),
    pytest.param("max", 300, range(296, 301), id="max-certified-halts-at-300"),  # honest: 95 after 845
]


@pytest.mark.parametrize(("op", "stop", "at"), HALTS)
async def test_a_neighbour_that_ends_its_phase_on_a_false_stop_fails_the_run_named(
    op: str, stop: int, at: range
) -> None:
    """Node 0's x's carry a stop the run's shape allows, and its x^(stop) says it halts there: its
    neighbours stop taking its x's, and each refuses the stop (they were not quiet over its window)
    and fails the run naming node 0, instead of waiting on it or ending its phase on it (issue 43:
    a forged max stop at t = 300 made every node output 94.68)."""
    cfg = RunConfig(op=op, n=6, graph="ring", trials=1, seed=1)
    with pytest.raises(BaseExceptionGroup) as caught:
        await run_ring(lambda t: stop if t in at else None, cfg)
    errors = [str(e) for e in caught.value.exceptions]
    assert errors
    assert all(f"from node 0 with its x^({stop})" in e for e in errors), errors
    assert all("node 0 ended its phase on it" in e for e in errors), errors


CLAIM_CASES = [
    pytest.param({"op": "max"}, None, id="max-certified"),
    pytest.param({"op": "min", "stop_rule": "tolerance"}, None, id="min-tolerance"),
    pytest.param({"op": "median"}, None, id="median"),
    pytest.param({"op": "max", "may_depart": True}, {4: 300}, id="max-departure"),
    pytest.param({"op": "median", "may_depart": True}, {4: 300, 9: 500}, id="median-departures"),
    pytest.param({"op": "topk", "k": 3}, None, id="topk-three-phases"),
]


@pytest.mark.parametrize(("kw", "departures"), CLAIM_CASES)
def test_no_honest_stop_is_ever_refused(kw: dict[str, Any], departures: dict[int, int] | None) -> None:
    """Along the simulator's trajectories (every phase), with and without departures, every stop a
    node hears is one it cannot contradict (the refusals above never fire on an honest run)."""
    cfg = load_config(n=15, trials=6, seed=2, record="all", **kw)
    res = simulate(cfg, departures=departures)
    rcfg, schedule = res.config.resolved(), Schedule.of(res.phases)
    heard = 0
    for b, p in itertools.product(range(cfg.trials), range(len(res.phases))):
        edges, gone, t0 = res.graphs[b], res.departures_of(b), schedule.start(p)
        cert = Certificate(res.protocol_values[b], certificate_sign(cfg.op)) if rcfg.certified else None
        reach = stop_reach(cfg.n, edges, cfg.may_depart)
        xs = res.recorded_x[t0 : t0 + int(res.phase_iterations[b, p]), b, :]
        refusals: list[str] = []
        rows = fields_along(xs, edges, t0, rcfg.stop_window_value, reach, cfg.tolerance, gone, cert, refusals)
        assert refusals == []
        heard += sum(f is not None and f[1] != NO_STOP for row in rows for f in row)
    assert heard > 0  # stops were claimed, and each was checked
