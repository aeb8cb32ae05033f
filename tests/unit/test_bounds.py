"""Ideal-world bounds on small cases computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adversary.bounds import ideal_leakage, side_information
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError


def _uniform(trials: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((trials, n))


def test_max_of_two_uniforms() -> None:
    # (S_(1), S_(0)) is uniform on {a < b} with density 2: h(joint) = -ln 2 and both
    # marginals (densities 2(1 - a) and 2b) have h = 1/2 - ln 2, so
    # I(S_(1); S_(0)) = 1 - ln 2 nats = 0.4427 bits. The maximum's holder leaks fully.
    bound = ideal_leakage(RunConfig(op="max", n=2), _uniform(4000, 2))
    assert bound.full.tolist() == [True, False]
    assert bound.nmi[0] == 1.0
    assert bound.bits[1] == pytest.approx((1 - math.log(2)) / math.log(2), abs=0.04)


def test_min_of_two_uniforms_mirrors_max() -> None:
    bound = ideal_leakage(RunConfig(op="min", n=2), _uniform(4000, 2, seed=1))
    assert bound.full.tolist() == [False, True]
    assert bound.bits[0] == pytest.approx((1 - math.log(2)) / math.log(2), abs=0.04)


def test_median_of_three_uniforms() -> None:
    # Joint density of (median a, max b) is 6a on {a < b}; max has density 3b^2 and the
    # integral of 6a(1-a) ln(1-a) is -5/6, so I(S_(0); S_med) = 3/2 - ln 3 nats = 0.5791 bits.
    bound = ideal_leakage(RunConfig(op="median", n=3), _uniform(4000, 3, seed=2))
    assert bound.full.tolist() == [False, True, False]
    expected = (1.5 - math.log(3)) / math.log(2)
    assert bound.bits[0] == pytest.approx(expected, abs=0.05)
    assert bound.bits[2] == pytest.approx(expected, abs=0.05)


def test_top2_of_three_reveals_the_last_one_only_partially() -> None:
    bound = ideal_leakage(RunConfig(op="topk", n=3, k=2), _uniform(3000, 3, seed=3))
    assert bound.full.tolist() == [True, True, False]
    assert 0.0 < bound.nmi[2] < 1.0


def test_trimmed_mean_of_three_reveals_everything() -> None:
    # With K = 1 of n = 3 the extremes are revealed and the sum gives the middle value.
    bound = ideal_leakage(RunConfig(op="trimmed-mean", n=3, k=1), _uniform(500, 3, seed=4))
    assert bound.full.all()
    np.testing.assert_allclose(bound.nmi, 1.0)


def test_trimmed_mean_honest_component_of_one_node_leaks_fully() -> None:
    # Ring 0-1-2-3-4-0 with nodes 1 and 3 corrupted: node 2 is an honest component of its own.
    values = np.tile([5.0, 4.0, 3.0, 2.0, 1.0], (200, 1)) + 0.01 * _uniform(200, 5, seed=5)
    ring = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [0, 4]])
    cfg = RunConfig(op="trimmed-mean", n=5, k=1)
    bound = ideal_leakage(cfg, values, corrupted=[1, 3], graphs=[ring] * 200)
    assert bound.samples.tolist() == [200, 0, 200, 0, 200]
    assert bound.full[[0, 2, 4]].all()
    assert np.isnan(bound.nmi[[1, 3]]).all()


def test_corrupted_values_join_the_side_information() -> None:
    values = _uniform(50, 4, seed=6)
    sides, masks = side_information(RunConfig(op="max", n=4), values, corrupted=[3])
    assert sides[0] is None
    side = sides[1]
    assert side is not None
    assert side.shape == (int(masks[1].sum()), 2)  # max value + the corrupted node's value
    honest = masks[1]
    np.testing.assert_allclose(side[:, 1], values[honest, 3])


def test_gap_is_achieved_minus_bound() -> None:
    bound = ideal_leakage(RunConfig(op="max", n=2), _uniform(500, 2, seed=7))
    np.testing.assert_allclose(bound.gap(np.array([1.0, 0.5])), [0.0, 0.5 - bound.nmi[1]])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"corrupted": [7]}, "corrupted"), ({"values": np.zeros((10, 3))}, "values")],
    ids=["corrupt-id-out-of-range", "wrong-n"],
)
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"values": _uniform(10, 4), **kwargs}
    with pytest.raises(ConfigError) as err:
        ideal_leakage(RunConfig(op="max", n=4), **args)  # type: ignore[arg-type]
    assert err.value.field == field
