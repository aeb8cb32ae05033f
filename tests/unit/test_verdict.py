"""One verdict vocabulary (issue 33, items 1-2): the function, the testbed's use, the far-beyond warning."""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.lab.summary import capture_outcome
from nlagg_node.verdict import BEYOND, beyond_ideal, far_beyond_warning, ideal_nodes, output_holders, verdict


@pytest.mark.parametrize(
    ("exposed", "ideal", "corrupted", "expected"),
    [
        pytest.param(True, True, False, "unavoidable", id="exposed-ideal"),
        pytest.param(True, False, False, "beyond the ideal world", id="exposed-beyond"),
        pytest.param(False, False, False, "protected", id="interval"),
        pytest.param(False, True, False, "protected", id="holder-not-learned"),
        pytest.param(True, True, True, "corrupted", id="corrupted"),
    ],
)
def test_verdict(exposed: bool, ideal: bool, corrupted: bool, expected: str) -> None:
    assert verdict(exposed=exposed, ideal=ideal, corrupted=corrupted) == expected


@pytest.mark.parametrize(
    ("op", "distances", "span", "expected"),
    [
        pytest.param("max", {3: 3.8e-14, 5: 0.2}, 1.0, {3}, id="rounding"),
        pytest.param("max", {3: 2.4e-5, 5: 0.2}, 1.0, {3}, id="not-converged-nearest"),
        pytest.param("topk", {1: 0.0, 2: 0.0, 4: 0.3}, 20.0, {1, 2}, id="topk-at-output"),
        pytest.param("topk", {4: 0.3}, 1.0, set(), id="topk-none"),
        pytest.param("median", {}, 1.0, set(), id="nothing-exposed"),
        pytest.param("max", {3: float("nan")}, 1.0, set(), id="no-output"),
    ],
)
def test_output_holders(op: str, distances: dict[int, float], span: float, expected: set[int]) -> None:
    assert output_holders(op, distances, span) == expected


def test_beyond_ideal_counts_only_beyond() -> None:
    assert beyond_ideal(["unavoidable", BEYOND, "protected", "corrupted", BEYOND]) == 2


def test_testbed_calls_the_trimmed_means_extremes_unavoidable() -> None:
    cfg = RunConfig(op="trimmed-mean", n=15, k=2)
    values = np.linspace(-1.0, 1.0, 15)[::-1].copy()  # node i has rank i
    exposed = [0, 1, 7, 13, 14]
    events = [{"node": i, "t": 3, "value": float(values[i]), "how": "=s"} for i in exposed]
    out = capture_outcome(cfg, values, set(), events, {}, 0, {})
    got = {int(k): e["verdict"] for k, e in out["exposures"].items()}
    assert got == {0: "unavoidable", 1: "unavoidable", 7: BEYOND, 13: "unavoidable", 14: "unavoidable"}


def test_ideal_nodes_follow_the_values_not_the_ids() -> None:
    assert ideal_nodes(RunConfig(op="max", n=4), [0.1, 3.0, 2.0, -1.0]) == {1}
    assert ideal_nodes(RunConfig(op="median", n=5), [5.0, 1.0, 3.0, 2.0, 4.0]) == {2}


def test_far_beyond_warning_names_the_ranks() -> None:
    cfg = RunConfig(op="quantile", n=15, quantile=0.75, init="from-above", trials=1000)
    leak = [1.0, 0.97, 0.99, 1.0, 1.0, 0.1, *[0.0] * 9]  # rank 3 holds the 0.75 quantile of 15
    line = far_beyond_warning(cfg, leak)
    assert line is not None
    assert "rank(s) 0-2, 4 with probability 0.97-1.00 over 1000 trials" in line
    assert "exposes rank(s) 3" in line
    assert far_beyond_warning(cfg, [0.4] * 15) is None


def test_far_beyond_warning_says_how_few_trials_it_rests_on() -> None:
    """One trial's leak is 0 or 1: the line says it was one trial, not a probability of 1."""
    cfg = RunConfig(op="median", n=15, init="from-above", trials=1)
    line = far_beyond_warning(cfg, [1.0] * 7 + [0.0] * 8)
    assert line is not None
    assert "with probability 1.00-1.00 over 1 trial," in line
