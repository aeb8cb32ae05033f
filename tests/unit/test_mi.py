"""The KSG estimator: known answers and equality with npeet-plus (the oracle)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import digamma

from adversary.analysis.mi import (
    leakage_probability,
    mse_curve,
    mutual_information,
    mutual_information_many,
    nmi_curves,
    nmi_with_bootstrap,
    self_information,
)
from nlagg_node.errors import ConfigError

npeet_plus = pytest.importorskip("npeet_plus")


def _pairs(n: int = 800) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    s = rng.standard_normal(n)
    return {
        "independent": (s, rng.standard_normal(n)),
        "correlated": (s, 0.8 * s + 0.6 * rng.standard_normal(n)),
        "identical": (s, s.copy()),
        "constant": (s, np.full(n, 2.0)),
        "clipped-like-max": (s, np.maximum(s, 0.3)),
        "few-levels": (s, np.round(rng.standard_normal(n))),
        "wide-scale": (s, 300.0 + 1e3 * rng.standard_normal(n)),
    }


@pytest.mark.parametrize("case", list(_pairs()), ids=list(_pairs()))
@pytest.mark.parametrize("k", [1, 3, 5], ids=["k1", "k3", "k5"])
def test_equals_npeet_with_the_same_jitter(case: str, k: int) -> None:
    x, y = _pairs()[case]
    np.random.seed(2024)
    expected = npeet_plus.mi(x.reshape(-1, 1), y.reshape(-1, 1), k=k)
    got = mutual_information(x, y, k, rng=np.random.RandomState(2024))
    assert got == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("shared_x", [False, True], ids=["one-x-per-pair", "one-x-for-all"])
def test_many_equals_npeet_called_pair_by_pair(shared_x: bool) -> None:
    # 40 pairs: several parallel blocks; consecutive rows drift slowly, as successive iterations
    # of one state do, so each y sort starts from the previous row's nearly right order.
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((40, 400))
    if shared_x:
        xs[:] = xs[0]
    drift = np.cumsum(0.01 * rng.standard_normal((40, 400)), axis=0)
    ys = xs * np.linspace(0, 2, 40)[:, None] + rng.standard_normal(400) + drift
    np.random.seed(9)
    expected = [npeet_plus.mi(a.reshape(-1, 1), b.reshape(-1, 1)) for a, b in zip(xs, ys, strict=True)]
    got = mutual_information_many(xs[0] if shared_x else xs, ys, rng=np.random.RandomState(9))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_one_pair_equals_npeet_to_the_bit() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal(1000)
    y = np.maximum(x, 0.2) + 0.1 * rng.standard_normal(1000)
    np.random.seed(11)
    expected = npeet_plus.mi(x.reshape(-1, 1), y.reshape(-1, 1))
    assert mutual_information(x, y, rng=np.random.RandomState(11)) == expected


def test_multidimensional_side_information_equals_npeet() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal(500)
    y = np.column_stack([x + rng.standard_normal(500), rng.standard_normal(500)])
    np.random.seed(3)
    expected = npeet_plus.mi(x.reshape(-1, 1), y)
    assert mutual_information(x, y, rng=np.random.RandomState(3)) == pytest.approx(expected, abs=1e-9)


def test_independent_variables_give_about_zero() -> None:
    rng = np.random.default_rng(1)
    assert abs(mutual_information(rng.standard_normal(2000), rng.standard_normal(2000), rng=rng)) < 0.03


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.9], ids=["rho0.3", "rho0.6", "rho0.9"])
def test_bivariate_gaussian_matches_closed_form(rho: float) -> None:
    rng = np.random.default_rng(2)
    n = 3000
    a = rng.standard_normal(n)
    b = rho * a + math.sqrt(1 - rho**2) * rng.standard_normal(n)
    exact = -0.5 * math.log2(1 - rho**2)
    assert mutual_information(a, b, rng=rng) == pytest.approx(exact, abs=0.04)


def test_x_equal_s_gives_the_normalizer() -> None:
    s = np.random.default_rng(4).standard_normal(1000)
    exact_without_jitter = (digamma(1000) - digamma(3)) / math.log(2)
    assert mutual_information(s, s, jitter=0.0) == pytest.approx(exact_without_jitter, abs=1e-12)
    assert mutual_information(s, s, rng=np.random.default_rng(0)) == pytest.approx(8.152868, abs=1e-5)
    assert self_information(1000) == pytest.approx(8.152868, abs=1e-6)
    assert self_information(1000, jitter=False) == pytest.approx(exact_without_jitter, abs=1e-12)


def test_nmi_curves_reach_one_when_the_state_equals_the_value() -> None:
    rng = np.random.default_rng(8)
    s = -np.sort(-rng.standard_normal((600, 4)), axis=1)
    x = np.stack([rng.standard_normal((600, 4)), s, np.broadcast_to(s[:, :1], s.shape)])
    nmi = nmi_curves(s, x, seed=1)
    assert nmi.shape == (3, 4)
    assert np.all(np.abs(nmi[0]) < 0.05)
    np.testing.assert_allclose(nmi[1], 1.0, atol=1e-12)
    assert nmi[2, 0] == pytest.approx(1.0, abs=1e-12)
    assert np.all(nmi[2, 1:] < 0.9)


def test_subsampling_band_brackets_the_estimate_without_duplicate_bias() -> None:
    rng = np.random.default_rng(9)
    s = rng.standard_normal((400, 2))
    x = np.stack([s + 0.5 * rng.standard_normal((400, 2)), rng.standard_normal((400, 2))])
    band = nmi_with_bootstrap(s, x, resamples=8, seed=2)
    assert band.lower is not None
    assert band.upper is not None
    assert np.all(band.lower <= band.upper)
    assert np.all(band.lower <= band.nmi + 0.02)
    assert np.all(band.upper >= band.nmi - 0.02)
    assert np.all(band.upper[1] < 0.05)  # independent pair: no upward bias from duplicated trials
    with pytest.raises(ConfigError) as err:
        nmi_with_bootstrap(s, x, fraction=1.0)
    assert err.value.field == "fraction"


def test_leakage_probability_and_mse() -> None:
    matched = np.array([[True, False], [True, True], [True, False], [True, False]])
    np.testing.assert_allclose(leakage_probability(matched), [1.0, 0.25])
    x = np.array([[[1.0, 3.0]], [[2.0, 2.0]]])  # R=2, B=1, n=2
    np.testing.assert_allclose(mse_curve(x, np.array([2.0])), [1.0, 0.0])


@pytest.mark.parametrize(
    ("x", "y", "k", "field"),
    [
        (np.zeros(5), np.zeros(4), 3, "y"),
        (np.zeros(4), np.zeros(4), 4, "k"),
        (np.array([0.0, np.nan, 1.0, 2.0, 3.0]), np.zeros(5), 1, "x"),
    ],
    ids=["unpaired", "k-too-large", "nan"],
)
def test_bad_input_names_the_field(x: np.ndarray, y: np.ndarray, k: int, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        mutual_information(x, y, k)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("x", "y", "field"),
    [
        (np.zeros((2, 6)), np.array([np.zeros(6), [0.0, 1.0, np.inf, 2.0, 3.0, 4.0]]), "y"),
        (np.array([np.arange(6.0), [0.0, np.nan, 1.0, 2.0, 3.0, 4.0]]), np.zeros((2, 6)), "x"),
        (np.array([0.0, np.nan, 1.0, 2.0, 3.0, 4.0]), np.zeros((2, 6)), "x"),
    ],
    ids=["y-row", "x-row", "shared-x"],
)
def test_many_names_the_field_with_a_non_finite_sample(x: np.ndarray, y: np.ndarray, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        mutual_information_many(x, y, 1)
    assert err.value.field == field


def test_nmi_curves_equal_npeet_called_in_documented_order() -> None:
    rng = np.random.default_rng(0)
    s = rng.standard_normal((300, 3))
    x = np.stack([s + rng.standard_normal((300, 3)) * a for a in (0.1, 1.0, 3.0)])
    got = nmi_curves(s, x, rng=np.random.RandomState(5))
    np.random.seed(5)
    norm = [npeet_plus.mi(s[:, r : r + 1], s[:, r : r + 1]) for r in range(3)]
    ref = [[npeet_plus.mi(s[:, r : r + 1], x[t][:, r : r + 1]) / norm[r] for r in range(3)] for t in range(3)]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
