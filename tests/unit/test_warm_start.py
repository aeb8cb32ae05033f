"""Warm starts (nlagg_node.warm): the initialization from the last output, and the safety rule."""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node.init import draw_z0
from nlagg_node.pdmm import Objective, x_update
from nlagg_node.rng import rng_for
from nlagg_node.warm import WARM_C_FACTOR, warm_c, warm_margin, warm_start


def test_max_starts_beyond_the_last_output_by_the_margin() -> None:
    ws = warm_start("max", 25.0, drift=0.005, c=1000.0, sigma_z=1.0, value_range=(20.0, 30.0))
    assert ws.kind == "from-above"
    assert ws.last_output == 0.5  # (25 - 20) / (30 - 20), the protocol's scale
    assert ws.bound == 0.505
    assert ws.c == 1000.0
    assert ws.init.center == 0.5
    assert ws.init.mu_z == 1000.0 * (2 * 0.005 + 4.0 / 1000.0)
    assert ws.start == pytest.approx(0.514, abs=1e-12)


def test_min_mirrors_max_without_a_range() -> None:
    ws = warm_start("min", -1.5, drift=0.1, c=100.0, sigma_z=0.0)
    assert (ws.kind, ws.last_output, ws.bound) == ("from-below", -1.5, -1.6)
    assert ws.init.mean_per_sign() == 100.0 * warm_margin(0.1, 100.0, 0.0) - 100.0 * -1.5
    assert ws.start == pytest.approx(-1.5 - 0.21, abs=1e-12)


@pytest.mark.parametrize(("op", "drift", "c"), [("median", 0.005, 200.0), ("quantile", 0.05, 30.0)], ids=str)
def test_median_and_quantile_take_the_prior_at_the_last_output(op: str, drift: float, c: float) -> None:
    ws = warm_start(op, 0.7, drift=drift, c=30.0, sigma_z=0.0, value_range=(0.0, 1.0))
    assert (ws.kind, ws.init.prior_median, ws.c, ws.init.c) == ("prior", 0.7, c, c)
    assert ws.init.mean_per_sign() == -c * 0.7
    assert not ws.violated(0.0)
    assert not ws.violated(1.0)


def test_warm_c_keeps_the_window_inside_the_drift_band_within_a_cap() -> None:
    assert warm_c("median", 0.001, 30.0) == 30.0 * WARM_C_FACTOR
    assert warm_c("median", 0.5, 30.0) == 30.0
    assert warm_c("median", 0.0, 30.0) == 30.0 * WARM_C_FACTOR
    assert warm_c("max", 0.001, 1000.0) == 1000.0


def test_every_x_starts_beyond_every_value_the_drift_allows() -> None:
    """Eq. (condition_P) at t = 0: x_i^(0) above every value below the bound, and above every
    compressed value (the largest a violating node runs with is below bound + D)."""
    ws = warm_start("max", 0.8, drift=0.005, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    signs = np.array([1.0, -1.0, 1.0, -1.0, 1.0])
    for node in range(200):
        u = signs * draw_z0(ws.init, signs, rng_for(7, "z0", node))
        x0 = x_update(Objective.maximum(), np.array([u.sum()]), np.array([-np.inf]), np.array([1000.0 * 5]))
        assert x0[0] > ws.bound + ws.drift


def test_a_value_beyond_the_bound_is_compressed_below_the_start_keeping_the_order() -> None:
    ws = warm_start("max", 0.5, drift=0.01, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    assert ws.used_value(0.51) == 0.51  # on the bound: as declared, its own value
    beyond = [0.52, 0.6, 0.9, 1.0]
    used = [ws.used_value(v) for v in beyond]
    assert all(ws.violated(v) for v in beyond)
    assert used == sorted(used)
    assert len(set(used)) == len(used)
    assert all(0.51 < u < 0.52 < ws.start for u in used)
    assert used[0] == pytest.approx(0.51 + 0.01 * 0.01 / 0.02, abs=1e-15)


def test_the_output_check_falls_back_exactly_when_a_value_lies_beyond_the_bound() -> None:
    ws = warm_start("min", 0.5, drift=0.01, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    values = [0.7, 0.495, 0.6]
    assert not ws.falls_back(min(ws.used_value(v) for v in values))
    values.append(0.3)  # moved further down than declared
    out = min(ws.used_value(v) for v in values)
    assert ws.falls_back(out)
    assert 0.48 < out < 0.49


@pytest.mark.parametrize(
    ("op", "drift", "c", "field"),
    [("topk", 0.01, 10.0, "op"), ("max", -0.1, 10.0, "drift"), ("max", 0.1, 0.0, "c must")],
    ids=["operator", "drift", "c"],
)
def test_warm_start_refuses_what_it_cannot_start(op: str, drift: float, c: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        warm_start(op, 0.0, drift=drift, c=c, sigma_z=1.0)
