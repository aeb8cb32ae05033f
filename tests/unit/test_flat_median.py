"""The median of an even number of values (and a quantile with n p an integer) is the lower of the two
values its loss is flat between: pinned by a tilt of each node's objective (``Objective.pinned_low``),
exposed by the ideal world, and started where the prior expects it (docs/reference.md)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from nlagg_node import RunConfig, simulate
from nlagg_node.pdmm import Objective, order_of
from nlagg_node.schedule import plan_phases
from nlagg_node.verdict import ideal_ranks


def _loss(objective: Objective, x: float, s: np.ndarray) -> float:
    return float(np.sum(objective.alpha * np.maximum(x - s, 0.0) + objective.beta * np.maximum(s - x, 0.0)))


@pytest.mark.parametrize(
    ("op", "n", "quantile"),
    [("median", 8, 0.5), ("median", 50, 0.5), ("quantile", 8, 0.25), ("quantile", 20, 0.75)],
    ids=["median-8", "median-50", "quantile-8-quarter", "quantile-20-three-quarters"],
)
def test_the_flat_stretch_keeps_only_its_lower_end(op: str, n: int, quantile: float) -> None:
    """Summed over the nodes, the run's objective is least at the k-th smallest value and nowhere else."""
    (phase,) = plan_phases(RunConfig(op=op, n=n, quantile=quantile))
    s = np.sort(np.random.default_rng(3).normal(size=n))
    k = order_of(n, quantile)
    grid = np.linspace(s[0] - 1, s[-1] + 1, 20_001)
    losses = np.array([_loss(phase.objective, x, s) for x in [*grid, *s]])
    best = float(np.concatenate([grid, s])[np.argmin(losses)])
    assert best == s[k - 1]
    # the slopes on either side of it are symmetric, as around an odd n's median
    left = _loss(phase.objective, s[k - 1] - 1e-9, s) - _loss(phase.objective, s[k - 1], s)
    right = _loss(phase.objective, s[k - 1] + 1e-9, s) - _loss(phase.objective, s[k - 1], s)
    assert left == pytest.approx(right, rel=1e-4)


@pytest.mark.parametrize("n", [7, 8], ids=["odd", "even"])
def test_the_median_outputs_one_value_which_the_ideal_world_exposes(n: int) -> None:
    result = simulate(RunConfig(op="median", n=n, trials=20, seed=4, t_max=6000, record="none"))
    lower_middle = np.sort(result.values, axis=1)[:, order_of(n, 0.5) - 1]
    assert np.array_equal(result.truth_lo, result.truth_hi)
    assert np.array_equal(result.truth_lo, lower_middle)
    assert np.abs(result.output - lower_middle[:, None]).max() < 1e-9
    # the lower middle (for an odd n the median), counted from the top
    assert ideal_ranks(RunConfig(op="median", n=n)) == [n // 2]


@pytest.mark.parametrize(
    ("n", "value_range", "expected"),
    [
        (49, None, 0.0),
        (50, None, NormalDist().inv_cdf(0.49)),
        (15, (0.0, 10.0), 5.0),
        (10, (0.0, 10.0), 4.5),
    ],
    ids=["odd", "even", "odd-range", "even-range"],
)
def test_the_prior_start_is_where_the_output_is_expected(
    n: int, value_range: tuple[float, float] | None, expected: float
) -> None:
    """The level (k - 1/2) / n of the range or of N(0, 1): the midpoint for an odd n, below for an even n."""
    cfg = RunConfig(op="median", n=n, value_range=value_range)
    assert math.isclose(cfg.prior_median_value, expected)


def _worst_beyond(n: int) -> float:
    cfg = RunConfig(op="median", n=n, trials=300, seed=0, record="none")
    leak = simulate(cfg).leakage_probability()
    ideal = set(ideal_ranks(cfg))
    return max(float(p) for r, p in enumerate(leak) if r not in ideal)


@pytest.mark.slow
def test_an_even_n_leaks_no_more_beyond_the_ideal_world_than_the_odd_n_beside_it() -> None:
    """Measured (300 trials, seed 0): n = 50 0.433 against 0.437 (n = 49) and 0.447 (n = 51); before the
    pin and the start below the midpoint, 0.497. Tolerance: one standard error of 300 trials (0.03)."""
    odd = max(_worst_beyond(49), _worst_beyond(51))
    assert _worst_beyond(50) <= odd + 0.03
