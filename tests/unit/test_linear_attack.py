"""The exact linear attack finds every value the transcript's linear relations determine.

The reference below is a plain rank computation written out in the test: the average phase's
z-recursion as dense matrices over the unknowns ``[s; u^(0)]``, one row per published x, plus a
row per value or dual the adversary knows; ``s_i`` is determined iff adding the row ``e_i`` leaves
the rank unchanged. It shares nothing with :mod:`adversary.linear` but the transcript.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adversary.simulated import adversary_z0, attack_simulation, trial_x
from nlagg_node.config import RunConfig
from nlagg_node.graphs import EdgeLayout
from nlagg_node.rng import rng_for
from nlagg_node.sim import SimResult, simulate
from nlagg_node.sim.output import summarize
from nlagg_node.threat import determined_by_sums


def _random_graph(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """A random tree plus a few random chords (connected)."""
    edges = {(int(rng.integers(0, i)), i) for i in range(1, n)}
    for _ in range(int(rng.integers(0, n))):
        a, b = sorted(int(v) for v in rng.choice(n, size=2, replace=False))
        edges.add((a, b))
    return sorted(edges)


def _run(tmp: Path, n: int, edges: list[tuple[int, int]], values: list[float], **params: object) -> SimResult:
    (tmp / "g.csv").write_text("\n".join(f"{a},{b}" for a, b in edges))
    (tmp / "v.csv").write_text(",".join(repr(v) for v in values))
    cfg = RunConfig(
        n=n,
        graph="file",
        graph_file=tmp / "g.csv",
        values_file=tmp / "v.csv",
        trials=1,
        record="all",
        early_stop=False,
        **params,
    )
    return simulate(cfg)


def _reference_determined(res: SimResult, corrupted: list[int]) -> set[int]:
    """Plain rank computation over the average phase of trial 0 (see the module notes)."""
    cfg = res.config
    n, edges = cfg.n, res.graphs[0]
    lay = EdgeLayout.from_graphs(n, [edges])
    e2, h = len(lay.src), lay.n_pairs
    z0 = adversary_z0(res, 0, corrupted)["average"]
    x = trial_x(res, 0)
    t0 = sum(p.t_len for p in res.phases[:-1])
    phase = res.phases[-1]
    theta = cfg.theta
    swap = np.zeros((e2, e2))
    swap[np.arange(e2), (np.arange(e2) + h) % e2] = 1.0  # reverse direction of each edge
    step = (1.0 - theta) * np.eye(e2) - theta * swap
    incidence = np.zeros((n, e2))
    incidence[lay.src, np.arange(e2)] = 1.0
    sign = np.diag(lay.sign)  # u = a z
    phi = sign.copy()  # u^(t) = phi z^(0) + (a part the x's fix, which no rank depends on)
    rows = []
    for _ in range(phase.t_len):
        for i in range(n):
            a = np.zeros(n + e2)
            a[i] = 1.0
            a[n:] = -(incidence @ phi)[i]
            rows.append(a)  # s_i - v_i = x_i (1 + c d_i): only the coefficients matter for the rank
        phi = step @ phi
    assert np.isfinite(x[:, t0 : t0 + phase.t_len]).all()  # every x published: one row each
    known_s = set(corrupted) | {int(i) for i in np.flatnonzero(res.matched[0])}
    for j in sorted(known_s):
        rows.append(np.eye(n + e2)[j])
    for e in np.flatnonzero(np.isfinite(z0)):
        rows.append(np.eye(n + e2)[n + e])
    a_mat = np.array(rows)
    rank = np.linalg.matrix_rank(a_mat)
    found = set(known_s)
    for i in range(n):
        if np.linalg.matrix_rank(np.vstack([a_mat, np.eye(n + e2)[i]])) == rank:
            found.add(i)
    return found


@pytest.mark.parametrize("case", range(12), ids=[f"graph-{c}" for c in range(12)])
def test_determined_set_matches_an_independent_rank_computation(case: int, tmp_path: Path) -> None:
    rng = rng_for(7, "test-linear-attack", case)
    n = int(rng.integers(4, 13))
    edges = _random_graph(rng, n)
    corrupted = sorted(int(v) for v in rng.choice(n, size=int(rng.integers(1, n // 2 + 1)), replace=False))
    values = [float(v) for v in rng.normal(size=n)]
    params: dict[str, object] = (
        {"op": "trimmed-mean", "k": int(rng.integers(1, (n - 1) // 2 + 1)), "t_max": 2500, "avg_t_max": 40}
        if case % 3
        else {"op": "average", "t_max": 40}
    )
    res = _run(tmp_path, n, edges, values, **params)
    report = attack_simulation(res, 0, corrupted)
    expected = _reference_determined(res, corrupted)
    assert set(report.extra["determined"]) == expected
    # nlagg sim's count, the component rule of nlagg_node.threat, agrees.
    known = np.zeros(n, dtype=bool)
    known[corrupted] = True
    known |= res.matched[0]
    assert set(np.flatnonzero(determined_by_sums(n, res.graphs[0], known, [corrupted])).tolist()) == expected
    assert report.precision == 1.0
    assert report.interval_soundness == 1.0


def test_path_case_reports_the_values_the_component_sums_give(tmp_path: Path) -> None:
    # Path 0-1-...-6, nodes 1 and 4 corrupted, trimmed mean K = 1: node 3 holds the maximum and
    # node 6 the minimum, so the components {2, 3} and {5, 6} have one unknown each.
    values = [0.1, -0.3, 0.5, 2.0, 0.2, -0.1, -2.0]
    res = _run(tmp_path, 7, [(i, i + 1) for i in range(6)], values, op="trimmed-mean", k=1, t_max=3000)
    report = attack_simulation(res, 0, [1, 4])
    found = {f.node: f for f in report.findings}
    for i in (2, 5):
        assert found[i].status == "exposed"
        assert found[i].how == "solved from component sum"
        value = found[i].value
        assert value is not None
        assert abs(value - values[i]) <= 1e-9
    assert found[0].how == "solved"  # an honest singleton component: every dual known
    assert report.extra["determined"] == list(range(7))


def test_a_node_leaving_during_the_average_phase_is_exposed_and_sim_counts_it() -> None:
    # The sums of the whole ring before the departure and of the survivors after it differ by
    # the departed node's value.
    cfg = RunConfig(op="average", n=6, graph="ring", trials=1, record="all", t_max=200, may_depart=True)
    res = simulate(cfg, departures={2: 20})
    report = attack_simulation(res, 0)
    found = {f.node: f for f in report.findings if f.status == "exposed"}
    assert set(found) == {2}
    value = found[2].value
    assert value is not None
    assert abs(value - float(res.values[0, 2])) <= 1e-9
    counted = summarize(res)["determined_probability"]
    assert counted == [1.0 if r == res.rank[0, 2] else 0.0 for r in range(6)]
