"""The two forms of the loop's duals: numpy over several nodes, Python floats for one, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nlagg_node.pdmm import Objective, dual_sum, dual_sum_one, x_one, x_update
from nlagg_node.runtime.duals import FlatDuals, LoneDuals, duals_for

OBJECTIVES = [
    pytest.param(Objective.maximum(), id="max"),
    pytest.param(Objective.minimum(), id="min"),
    pytest.param(Objective.median(), id="median"),
    pytest.param(Objective.quantile(0.3), id="quantile"),
    pytest.param(Objective.average(), id="average"),
]


def _bits(values: list[float]) -> list[int]:
    bits: list[int] = np.array(values, dtype=np.float64).view(np.int64).tolist()
    return bits


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_scalar_x_update_has_the_array_bits(objective: Objective) -> None:
    """x_one on Python floats equals x_update elementwise, on both branches, matches and -inf values."""
    rng = np.random.default_rng(7)
    v = rng.normal(0.0, 50.0, 4000)
    s = rng.normal(0.0, 5.0, 4000)
    s[::9] = -math.inf  # a top-K node that bypasses the max
    cd = rng.uniform(0.5, 40.0, 4000)
    cd[::5] = 3.0
    v[::7] = -3.0 * s[::7] - 1.0  # with cd = 3 and alpha = 1, lo lands on or next to s: ties and near-ties
    v[np.isinf(v)] = 0.0
    arrays = x_update(objective, v, s, cd).tolist()
    scalars = [x_one(objective, a, b, c) for a, b, c in zip(v.tolist(), s.tolist(), cd.tolist(), strict=True)]
    assert _bits(scalars) == _bits(arrays)
    picked = {"lo": 0, "hi": 0, "s": 0}
    for xv, sv in zip(scalars, s.tolist(), strict=True):
        picked["s" if xv == sv else "lo" if xv > sv else "hi"] += 1
    assert picked["s"] > 0  # both kinds of outcome were checked
    assert picked["lo"] + picked["hi"] > 0


def test_scalar_dual_sum_has_the_array_bits() -> None:
    rng = np.random.default_rng(3)
    for d in (1, 2, 5, 13):
        u = rng.normal(0.0, 1e3, d) * 10.0 ** rng.integers(-8, 8, d)
        one_node = np.zeros(d, dtype=np.int64)
        assert _bits([dual_sum_one(u.tolist())]) == _bits(dual_sum(u, one_node, 1).tolist())


def _run(duals: FlatDuals | LoneDuals, degree: int, steps: int, drop_at: int) -> list[list[float]]:
    """Iterate with fixed neighbour x's; drop slot 1 at ``drop_at``; every step's x and duals."""
    rng = np.random.default_rng(11)
    duals.start([rng.normal(0, 30, degree).tolist()], [rng.normal(0, 30, degree).tolist()])
    here, trace = degree, []
    for t in range(steps):
        x = duals.x(Objective.maximum(), [0.25], 0.4)
        got = rng.normal(0, 2, here).tolist()
        keep = [q != 1 for q in range(here)] if t == drop_at else None
        duals.update(got, 0.4, 0.5, keep)
        if keep is not None:
            here -= 1
        out, into = duals.of(0)
        trace.append(x + out + into)
    return trace


@pytest.mark.parametrize("degree", [1, 2, 6], ids=lambda d: f"degree-{d}")
def test_lone_duals_follow_the_flat_ones_bit_for_bit(degree: int) -> None:
    """One node on floats and on numpy: the same x and duals at every step, across a departure
    (degrees 2 and 6; the isolated node is the next test's)."""
    lone = _run(LoneDuals(degree), degree, 40, drop_at=17 if degree > 1 else 40)
    flat = _run(FlatDuals([degree]), degree, 40, drop_at=17 if degree > 1 else 40)
    assert [_bits(step) for step in lone] == [_bits(step) for step in flat]
    assert len(lone[-1]) == 1 + 2 * (degree - (degree > 1))


def test_isolated_node_publishes_its_value() -> None:
    """Both forms: a node whose only neighbour departed publishes its value from then on."""
    for duals in (LoneDuals(1), FlatDuals([1, 2])):
        h = 1 if isinstance(duals, LoneDuals) else 2
        duals.start([[5.0]] + [[1.0, 2.0]] * (h - 1), [[-5.0]] + [[0.5, 0.5]] * (h - 1))
        duals.x(Objective.maximum(), [0.25] * h, 0.4)
        duals.update([1.0] * (1 + 2 * (h - 1)), 0.4, 0.5, [False] + [True] * 2 * (h - 1))
        assert duals.x(Objective.maximum(), [0.25] * h, 0.4)[0] == 0.25


def test_duals_for_picks_floats_for_a_lone_node() -> None:
    assert isinstance(duals_for([4]), LoneDuals)
    assert isinstance(duals_for([4, 2]), FlatDuals)
