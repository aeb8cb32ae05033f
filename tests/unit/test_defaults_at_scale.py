"""Defaults at any n (issue 44): the one-sided start without a range and the cap t_max grow with n;
n <= 15 keeps the calibrated defaults."""

from __future__ import annotations

import pytest

from nlagg_node.config import NORMALIZED_DEFAULTS, OPERATOR_DEFAULTS, RunConfig, start_height
from nlagg_node.sim.values import run_values
from nlagg_node.valuechecks import start_problem

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
