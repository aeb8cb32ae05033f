"""Warm starts (nlagg_node.warm): the initialization from the last output, and the safety rule."""

from __future__ import annotations

import math

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
    assert (ws.band_lo, ws.band_hi) == (-math.inf, 0.505)
    assert ws.c == 1000.0
    assert ws.init.center == 0.5
    assert ws.init.mu_z == 1000.0 * (2 * 0.005 + 4.0 / 1000.0)
    assert ws.start == pytest.approx(0.514, abs=1e-12)


def test_min_mirrors_max_without_a_range() -> None:
    ws = warm_start("min", -1.5, drift=0.1, c=100.0, sigma_z=0.0)
    assert (ws.kind, ws.last_output, ws.band_lo, ws.band_hi) == ("from-below", -1.5, -1.6, math.inf)
    assert ws.init.mean_per_sign() == 100.0 * warm_margin(0.1, 100.0, 0.0) - 100.0 * -1.5
    assert ws.start == pytest.approx(-1.5 - 0.21, abs=1e-12)


@pytest.mark.parametrize(("op", "drift", "c"), [("median", 0.005, 200.0), ("quantile", 0.05, 30.0)], ids=str)
def test_median_and_quantile_take_the_prior_at_the_last_output(op: str, drift: float, c: float) -> None:
    ws = warm_start(op, 0.7, drift=drift, c=30.0, sigma_z=0.0, value_range=(0.0, 1.0))
    assert (ws.kind, ws.init.prior_median, ws.c, ws.init.c) == ("prior", 0.7, c, c)
    assert ws.init.mean_per_sign() == -c * 0.7
    assert (ws.band_lo, ws.band_hi) == (0.7 - drift, 0.7 + drift)


def test_warm_c_keeps_the_window_inside_the_drift_band_within_a_cap() -> None:
    assert warm_c("median", 0.001, 30.0) == 30.0 * WARM_C_FACTOR
    assert warm_c("median", 0.5, 30.0) == 30.0
    assert warm_c("median", 0.0, 30.0) == 30.0 * WARM_C_FACTOR
    assert warm_c("max", 0.001, 1000.0) == 1000.0


@pytest.mark.parametrize("drift", [0.005, 0.0], ids=["drift", "static"])
def test_every_x_starts_beyond_every_value_it_may_run_with(drift: float) -> None:
    """Eq. (condition_P) at t = 0: x_i^(0) above the band and above its shell (a value outside
    the band runs a shell value)."""
    ws = warm_start("max", 0.8, drift=drift, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    top = ws.band_hi + ws.shell  # above every shell value
    assert ws.used_value(1.0, 0.999) < top
    signs = np.array([1.0, -1.0, 1.0, -1.0, 1.0])
    for node in range(200):
        u = signs * draw_z0(ws.init, signs, rng_for(7, "z0", node))
        cd = np.array([1000.0 * len(signs)])
        x0 = x_update(Objective.maximum(), np.array([u.sum()]), np.array([-np.inf]), cd)
        assert x0[0] > top


def test_a_value_outside_the_band_runs_a_random_shell_value_on_its_side() -> None:
    ws = warm_start("median", 0.5, drift=0.01, c=30.0, sigma_z=0.0, value_range=(0.0, 1.0))
    assert ws.used_value(0.51, 0.3) == 0.51  # on the band's edge: its own value
    assert ws.used_value(0.9, 0.25) == 0.51 + 0.01 * 0.625
    assert ws.used_value(0.1, 0.25) == 0.49 - 0.01 * 0.625
    draws = [ws.used_value(0.52, u) for u in np.linspace(0.0, 0.999, 50)]
    assert all(0.515 <= v < 0.52 for v in draws)
    assert not ws.falls_back(0.51 + 1e-9)  # in the band within a tolerance
    assert ws.falls_back(min(draws))


@pytest.mark.parametrize(
    ("op", "values", "falls_back"),
    [
        ("max", [0.3, 0.505, 0.45], False),
        ("max", [0.3, 0.52, 0.45], True),
        ("min", [0.7, 0.495, 0.6], False),
        ("min", [0.7, 0.2, 0.6], True),
        ("median", [0.1, 0.502, 0.9], False),
        ("median", [0.1, 0.8, 0.9], True),
        ("median", [0.0, 0.499, 0.1], True),
    ],
    ids=["max-held", "max-moved", "min-held", "min-moved", "median-held", "median-up", "median-down"],
)
def test_the_output_check_falls_back_exactly_when_the_aggregate_left_the_band(
    op: str, values: list[float], falls_back: bool
) -> None:
    ws = warm_start(op, 0.5, drift=0.005, c=30.0, sigma_z=0.0, value_range=(0.0, 1.0))
    used = [ws.used_value(v, 0.5) for v in values]
    out = {"max": max, "min": min}.get(op, lambda v: sorted(v)[1])(used)
    truth = {"max": max, "min": min}.get(op, lambda v: sorted(v)[1])(values)
    assert ws.falls_back(out) is falls_back
    if not falls_back:
        assert out == truth  # the declaration held: the warm run's output is exact


@pytest.mark.parametrize(
    ("op", "drift", "c", "field"),
    [("topk", 0.01, 10.0, "op"), ("max", -0.1, 10.0, "drift"), ("max", 0.1, 0.0, "c must")],
    ids=["operator", "drift", "c"],
)
def test_warm_start_refuses_what_it_cannot_start(op: str, drift: float, c: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        warm_start(op, 0.0, drift=drift, c=c, sigma_z=1.0)


def test_a_declared_range_ends_the_band_and_the_shell() -> None:
    """No value lies above the range: near its top the start is just beyond it, below a cold start's."""
    ws = warm_start("max", 0.98, drift=0.1, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    assert (ws.band_hi, ws.shell) == (1.0, 0.0)
    assert ws.start == pytest.approx(1.0 + 4.0 / 1000.0, abs=1e-12)
    assert not ws.falls_back(1.0 + 1e-9)
    low = warm_start("min", 0.05, drift=0.04, c=1000.0, sigma_z=1.0, value_range=(0.0, 1.0))
    assert low.band_lo == pytest.approx(0.01)
    assert low.shell == pytest.approx(0.01)
