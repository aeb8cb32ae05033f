"""Defaults at any n (issue 44): the one-sided start grows with n without a range, and the median of an
even number of values is the lower middle one, which the ideal world then exposes."""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node.config import NORMALIZED_DEFAULTS, OPERATOR_DEFAULTS, RunConfig, start_height
from nlagg_node.pdmm import Objective
from nlagg_node.scale import start_problem
from nlagg_node.schedule import true_aggregate
from nlagg_node.sim import simulate
from nlagg_node.sim.values import run_values
from nlagg_node.verdict import ideal_ranks

ONE_SIDED = ["max", "min", "topk", "trimmed-mean"]


@pytest.mark.parametrize("n", [3, 10, 12, 15], ids=lambda n: f"n{n}")
def test_up_to_fifteen_nodes_keep_the_calibrated_start(n: int) -> None:
    for op, table in OPERATOR_DEFAULTS.items():
        cfg = RunConfig(op=op, n=n, k=1)
        assert (cfg.mu_z_value, cfg.t_max_value) == (table["mu_z"], table["t_max"])
        ranged = RunConfig(op=op, n=n, k=1, value_range=(15.0, 35.0))
        assert (ranged.mu_z_value, ranged.t_max_value) == (
            NORMALIZED_DEFAULTS[op]["mu_z"],
            NORMALIZED_DEFAULTS[op]["t_max"],
        )


def test_the_cap_on_iterations_grows_with_n() -> None:
    caps = [RunConfig(n=n).t_max_value for n in (15, 16, 200, 1000)]
    assert caps == [7000, 7200, 16600, 28400]


def test_the_start_rises_with_n_and_not_with_a_range() -> None:
    starts = [RunConfig(n=n).mu_z_value / RunConfig(n=n).c_value for n in (16, 50, 100, 200, 1000)]
    assert starts == sorted(starts)
    assert starts[0] > 3.0
    assert starts[-1] == pytest.approx(start_height(1000))
    assert RunConfig(n=1000, value_range=(15.0, 35.0)).mu_z_value == 600.0  # calibrated for [0, 1]
    assert RunConfig(op="average", n=1000).mu_z_value == 0.0


@pytest.mark.parametrize("n", [200, 1000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("op", ONE_SIDED, ids=ONE_SIDED)
def test_every_default_value_lies_on_the_protected_side(op: str, n: int) -> None:
    """What `testbed --n N` and `deploy plan --n N --seed 0` check for every node before it starts."""
    cfg = RunConfig(op=op, n=n, trials=1)
    assert [v for v in run_values(cfg, 1)[0] if start_problem(cfg, float(v))] == []


@pytest.mark.parametrize("n", [4, 10, 50], ids=lambda n: f"n{n}")
def test_even_median_targets_the_lower_middle_value_and_the_ideal_world_exposes_it(n: int) -> None:
    values = np.random.default_rng(n).normal(size=(3, n))
    cfg = RunConfig(op="median", n=n)
    lo, hi = true_aggregate(cfg, values)
    lower_middle = np.sort(values, axis=1)[:, n // 2 - 1]
    np.testing.assert_array_equal(lo, lower_middle)
    np.testing.assert_array_equal(hi, lower_middle)
    assert ideal_ranks(cfg) == [n // 2]  # counted from the top: the (n/2)-th smallest


@pytest.mark.parametrize("m", [5, 6, 7, 8], ids=lambda m: f"of{m}")
def test_even_median_objective_has_the_lower_median_of_any_fewer_values_as_its_minimizer(m: int) -> None:
    """A departure leaves m <= n values: the tilted sum's minimizer is their lower median."""
    obj = Objective.median(8)
    s = np.sort(np.random.default_rng(m).normal(size=m))
    grid = np.linspace(s[0] - 1.0, s[-1] + 1.0, 20001)
    loss = (obj.alpha * np.maximum(grid[:, None] - s, 0) + obj.beta * np.maximum(s - grid[:, None], 0)).sum(1)
    assert grid[np.argmin(loss)] == pytest.approx(s[(m + 1) // 2 - 1], abs=1e-3)


def test_even_median_run_ends_on_the_lower_middle_value() -> None:
    cfg = RunConfig(op="median", n=10, graph="ring", trials=6, seed=4, record="none")
    res = simulate(cfg)
    lower_middle = np.sort(res.values, axis=1)[:, 4]
    assert np.max(np.abs(res.output - lower_middle[:, None])) <= 1e-9
