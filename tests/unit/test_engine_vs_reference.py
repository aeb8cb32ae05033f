"""The batched engine against a per-node loop written straight from the paper."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from nlagg_node import EdgeLayout, SimResult, load_config, simulate
from nlagg_node.pdmm import paper_q
from tests.harness.reference import run_reference

CASES = [
    pytest.param({"op": "max", "init": "proposed", "c": 10.0, "mu_z": 100.0}, id="max-proposed"),
    pytest.param({"op": "max", "init": "none", "c": 1.0}, id="max-nonprivate"),
    pytest.param({"op": "min", "init": "proposed", "c": 10.0, "mu_z": 100.0}, id="min-proposed"),
    pytest.param({"op": "median", "init": "symmetric", "c": 2.0, "sigma_z": 3.0}, id="median-symmetric"),
    pytest.param(
        {"op": "quantile", "init": "from-above", "c": 5.0, "mu_z": 20.0, "quantile": 0.7}, id="quantile"
    ),
    pytest.param({"op": "average", "init": "symmetric", "c": 1.0, "sigma_z": 10.0}, id="average"),
    pytest.param(
        {"op": "topk", "k": 3, "n": 8, "trials": 2, "t_max": 1500, "c": 10.0, "mu_z": 60.0, "seed": 5},
        id="topk-algorithm-2",
    ),
    pytest.param({"op": "max", "init": "dp-gauss", "c": 1.0, "sigma_s": 0.5}, id="max-dp"),
    pytest.param({"op": "median", "init": "none", "c": 1.0, "theta": 1.0}, id="median-theta1"),
]


def _trial_inputs(result: SimResult, b: int) -> tuple[list[tuple[int, int]], dict[tuple[int, int], float]]:
    cfg = result.config
    n = cfg.n
    layout = EdgeLayout.from_graphs(n, result.graphs)
    group = result.phases[0].group
    mask = layout.src // n == b
    z0 = {
        (int(i) - b * n, int(j) - b * n): float(z)
        for i, j, z in zip(layout.src[mask], layout.dst[mask], result.z0[group][mask], strict=True)
    }
    edges = [(int(i), int(j)) for i, j in result.graphs[b]]
    return edges, z0


@pytest.mark.parametrize("params", CASES)
def test_engine_matches_paper_loop(params: dict[str, float | str]) -> None:
    # The paper's loop runs the fixed schedule.
    settings: dict[str, Any] = {"n": 7, "trials": 3, "t_max": 400, "record": "all", "seed": 11}
    settings.update({"early_stop": False, **params})
    cfg = load_config(**settings)
    result = simulate(cfg)
    topk = cfg.op == "topk"  # Algorithm 2: k rounds of max consensus
    for b in range(cfg.trials):
        edges, z0 = _trial_inputs(result, b)
        xs, events = run_reference(
            "max" if topk else cfg.op,
            cfg.n,
            edges,
            list(result.used_values[b]),
            z0,
            cfg.c_value,
            cfg.theta,
            cfg.t_max_value,
            q=paper_q(cfg.quantile),
            rounds=cfg.k if topk else 1,
            epsilon=cfg.epsilon,
        )
        engine_x = result.recorded_x[:, b, :]
        np.testing.assert_allclose(engine_x, xs, rtol=0, atol=1e-12)
        engine_events = {
            (int(t), int(i)) for t, i in zip(*np.nonzero(engine_x == result.used_values[b]), strict=True)
        }
        if cfg.op != "average":
            assert engine_events == events
            first = {i: min(t for t, j in events if j == i) for _, i in events}
            assert {i: int(result.first_match[b, i]) for i in first} == first
            assert result.matched[b].sum() == len(first)


def test_batch_trial_equals_single_run() -> None:
    """Trial 0 of a batch is bit for bit the single run a testbed with the same seed performs."""
    batch = simulate(load_config(op="median", trials=5, t_max=300, record="all", seed=3))
    single = simulate(load_config(op="median", trials=1, t_max=300, record="all", seed=3))
    assert np.array_equal(batch.recorded_x[:, 0, :], single.recorded_x[:, 0, :])
    assert np.array_equal(batch.values[0], single.values[0])
    assert np.array_equal(batch.graphs[0], single.graphs[0])
