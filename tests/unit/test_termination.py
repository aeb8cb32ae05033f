"""Early stopping (issue 15): the rule of :mod:`nlagg_node.termination` in the simulator."""

from __future__ import annotations

import json
from typing import Any

import networkx as nx
import numpy as np
import pytest

from nlagg_node import load_config, simulate
from nlagg_node.graphs import sample_graphs
from nlagg_node.limits import MAX_ITERATIONS, MAX_NODES
from nlagg_node.protocol import fields_along
from nlagg_node.runtime.wire import WireError, XMsg, decode, encode, topics
from nlagg_node.termination import diameter

WINDOW = 20


@pytest.mark.parametrize(
    ("n", "edges", "want"),
    [
        pytest.param(4, [[0, 1], [1, 2], [2, 3]], 3, id="path"),
        pytest.param(6, [[i, (i + 1) % 6] for i in range(6)], 3, id="cycle"),
        pytest.param(5, [[0, j] for j in range(1, 5)], 2, id="star"),
    ],
)
def test_diameter(n: int, edges: list[list[int]], want: int) -> None:
    assert diameter(n, np.array(edges)) == want


@pytest.mark.parametrize("n", [4, 300], ids=["python-search", "csgraph"])
def test_diameter_refuses_disconnected(n: int) -> None:
    with pytest.raises(ValueError, match="not connected"):
        diameter(n, np.array([[i, i + 1] for i in range(n - 1) if i != n // 2]))


@pytest.mark.parametrize("n", [40, 400], ids=["python-search", "csgraph"])
def test_diameter_is_networkx_s(n: int) -> None:
    edges = sample_graphs(load_config(n=n, trials=1).graph_spec(), 3, 1)[0]
    graph = nx.Graph(edges.tolist())
    assert diameter(n, edges) == nx.diameter(graph)


def _stop_from_trajectory(xs: np.ndarray, edges: np.ndarray, t0: int, tol: float) -> tuple[int, np.ndarray]:
    """The rule applied node by node to a fixed-schedule trajectory ``xs`` (T, n) of one phase
    (:func:`~nlagg_node.protocol.fields_along`, as the simulator's transcripts do).

    Returns the iterations the phase runs and every node's stop iteration ``e`` at the stop.
    """
    rows = fields_along(xs, edges, t0, WINDOW, diameter(xs.shape[1], edges), tol)
    return len(rows), np.array([f[1] for f in rows[-1] if f is not None])


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"op": "max", "t_max": 3000, "stop_rule": "tolerance"}, id="max"),
        pytest.param({"op": "median", "t_max": 3000}, id="median"),
        pytest.param({"op": "topk", "k": 2, "t_max": 2500}, id="topk"),
    ],
)
def test_simulator_stops_where_the_rule_says(params: dict[str, Any]) -> None:
    """Same trajectory as the fixed schedule up to the stop, frozen after, every node agreeing on
    the stop iteration, and every x quiet over the W iterations the proof promises."""
    base = load_config(n=12, trials=6, record="all", seed=3, **params)
    fixed = simulate(base)
    early = simulate(base.model_copy(update={"early_stop": True, "stop_window": WINDOW}))
    tol = base.tolerance
    stopped = 0
    for b in range(base.trials):
        start = 0
        edges = fixed.graphs[b]
        diam = diameter(base.n, edges)
        for p, phase in enumerate(fixed.phases):
            seg = slice(start, start + phase.t_len)
            if p > 0 and early.phase_iterations[b, :p].tolist() != fixed.phase_iterations[b, :p].tolist():
                break  # an earlier phase stopped early: this one starts from other duals
            ran, e = _stop_from_trajectory(fixed.recorded_x[seg, b], edges, start, tol)
            assert early.phase_iterations[b, p] == ran
            got = early.recorded_x[seg, b]
            np.testing.assert_array_equal(got[:ran], fixed.recorded_x[seg, b][:ran])
            np.testing.assert_array_equal(got[ran:], np.broadcast_to(got[ran - 1], got[ran:].shape))
            if ran < phase.t_len:
                stopped += 1
                assert (e == start + ran - 1).all()  # every node holds the same stop iteration
                # proposed at t* = stop - D: every node quiet at every t in [t* - D - W + 1, t* - D]
                window = fixed.recorded_x[seg, b][ran - 2 * diam - 2 * WINDOW : ran - 2 * diam]
                assert (np.abs(window[WINDOW:] - window[:-WINDOW]) <= tol).all()
            start += phase.t_len
    assert stopped > 0


@pytest.mark.slow
@pytest.mark.parametrize("op", ["max", "median"])
def test_early_stop_never_increases_leakage(op: str) -> None:
    """Leakage per rank over 1000 trials: with early stopping <= with the fixed schedule."""
    base = load_config(op=op, trials=1000, record="none", seed=0)  # early stopping: the default
    fixed = simulate(base.model_copy(update={"early_stop": False}))
    early = simulate(base)
    assert base.early_stop
    p_fixed, p_early = fixed.leakage_probability(), early.leakage_probability()
    assert (p_early <= p_fixed).all(), (p_early, p_fixed)
    assert early.phase_iterations.mean() < 0.6 * fixed.phase_iterations.mean()
    assert (early.converged_iterations >= 0).mean() >= 0.97


@pytest.mark.parametrize(
    ("quiet", "stop", "departures"),
    [
        pytest.param(0, None, None, id="counting"),
        pytest.param(140, 7004, None, id="stop-known"),
        pytest.param(0, 7030, (6990, 6995), id="departures-known"),
    ],
)
def test_x_fields_round_trip_exactly(
    quiet: int, stop: int | None, departures: tuple[int, ...] | None
) -> None:
    model = XMsg(node=2, t=7000, phase="max-2", x=0.1 + 0.2, quiet=quiet, stop=stop, departures=departures)
    payload = encode(model)
    fields = {"quiet": quiet, "stop": stop, "departures": None if departures is None else list(departures)}
    body = {"v": 1, "node": 2, "t": 7000, "phase": "max-2", "x": 0.1 + 0.2, **fields}
    assert (
        payload
        == json.dumps({k: v for k, v in body.items() if v is not None}, separators=(",", ":")).encode()
    )
    _, msg = decode(topics("nlagg", "r").x(2), payload, "nlagg", "r")
    assert msg == model


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("quiet", -1, id="negative-quiet"),
        pytest.param("quiet", MAX_ITERATIONS + 1, id="huge-quiet"),
        pytest.param("stop", MAX_ITERATIONS + MAX_NODES, id="huge-stop"),
        pytest.param("stop", 1.5, id="float-stop"),
        pytest.param("departures", [], id="empty-departures"),
        pytest.param("departures", [30, 20], id="departures-not-ascending"),
        pytest.param("departures", [20, 20], id="departures-repeated"),
        pytest.param("departures", [-1], id="negative-departure"),
        pytest.param("departures", [MAX_ITERATIONS], id="huge-departure"),
    ],
)
def test_x_fields_are_bounded(field: str, value: object) -> None:
    body = {"v": 1, "node": 0, "t": 3, "phase": "max", "x": 1.0, "quiet": 0, field: value}
    with pytest.raises(WireError, match=field):
        decode(topics("nlagg", "r").x(0), json.dumps(body).encode(), "nlagg", "r")
