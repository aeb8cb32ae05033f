"""The soak's ``forge`` fault (tests/harness/forgery.py) sends what it says: x's the nodes would take
but for their key chain, and departure claims they refuse, on a memory broker with identities.

Node 1's password holder sends its whole burst just before node 1's x^(10) goes out, when node 1's
neighbours are waiting for x_1^(10): the forged x_1^(10) and x_1^(11) are of the run's form and
inside every receiver's window (only the key chain refuses them), and the run is still the
simulator's, bit for bit, with no departure, every forgery refused by every neighbour.
"""

from __future__ import annotations

import json

import numpy as np

from nlagg_node.config import RunConfig
from nlagg_node.graphs import neighbours
from nlagg_node.protocol import NO_HALT, X_WINDOW, RunShape, admit, new_identity, x_form_error
from nlagg_node.protocol.chain import KeyChain, key_b64
from nlagg_node.rng import rng_for
from nlagg_node.runtime.memory import MemoryBroker
from nlagg_node.runtime.node import run_edges
from nlagg_node.runtime.result import NodeResult
from nlagg_node.runtime.wire import topics
from nlagg_node.sim import simulate
from tests.harness.forgery import X_WAYS, forged_statuses, forged_xs
from tests.harness.signednet import memory_network, run_network

RUN = "forge"
TP = topics("nlagg", RUN)
CFG = RunConfig(op="max", n=6, trials=1, t_max=40, c=10.0, mu_z=30.0, seed=3, record="all", early_stop=False)
EDGES = run_edges(CFG)
SHAPE = RunShape(CFG.resolved(), EDGES)
NBRS = neighbours(CFG.n, EDGES)
IDS = [new_identity() for _ in range(CFG.n)]
AT = 10  # node 1's neighbours wait for x_1^(10) when the burst goes out


def burst(value: float) -> tuple[list[tuple[int, bytes]], list[bytes]]:
    """The fault's x's for t = AT .. AT+3 and its statuses, as the soak's forger builds them."""
    rng = rng_for(0, "forge-test")
    own = new_identity()
    chain = KeyChain(own.chain_seed("forger"), SHAPE.t_total)
    stranger = min(set(range(CFG.n)) - {1, *NBRS[1]})
    copied = AT - 1, key_b64(KeyChain(IDS[1].chain_seed(f"nlagg|{RUN}|1"), SHAPE.t_total).key(AT - 1))
    ts = range(AT, AT + 4)
    xs = forged_xs(
        1, ts, lambda t: SHAPE.phase_at[t], value, copied, lambda: rng.bytes(16), (own, chain), TP.x(1)
    )
    statuses = forged_statuses(1, NBRS[1][0], stranger, AT, own, key_b64(chain.anchor), TP.status(1))
    return xs, statuses


async def run_forged(xs: list[tuple[int, bytes]], statuses: list[bytes]) -> list[NodeResult]:
    broker = MemoryBroker()
    route = broker.route

    def forge(topic: str, payload: bytes, retain: bool) -> None:
        if topic == TP.x(1) and json.loads(payload)["t"] == AT:
            for _, forged in xs:
                route(topic, forged, False)
            for status in statuses:
                route(TP.status(1), status, True)
        route(topic, payload, retain)

    broker.route = forge  # type: ignore[method-assign]
    tasks = await run_network(memory_network(CFG, broker, RUN, IDS))
    return [task.result() for task in tasks]


async def test_the_forged_burst_is_in_the_window_and_every_node_refuses_it() -> None:
    sim = simulate(CFG)
    xs, statuses = burst(value=float(sim.values[0].max()) + 1.0)
    assert len(xs) == 4 * len(X_WAYS)
    for t, payload in xs:
        body = json.loads(payload)
        assert x_form_error(SHAPE, 1, t, body["phase"], None, None, None) is None
        if t < AT + X_WINDOW:  # what a receiver at position AT takes, but for the key chain
            assert admit(t, AT, SHAPE.t_total, NO_HALT, X_WINDOW, SHAPE.jumps) is None
    results = await run_forged(xs, statuses)
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    assert all(r.departed == {} for r in results)
    forged = len(xs) + len(statuses)
    assert all(results[i].rejected >= forged for i in NBRS[1]), [r.rejected for r in results]
