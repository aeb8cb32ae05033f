"""``nlagg sim``'s summary judges split runs per component and names the trials off the tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nlagg_node.config import RunConfig
from nlagg_node.lab.summary import departure_outcome
from nlagg_node.sim import simulate
from nlagg_node.sim.output import summarize

TWO_CLIQUES = "0,1\n1,2\n2,3\n0,2\n1,3\n3,4\n4,5\n5,6\n6,7\n5,7\n7,8\n6,8\n"  # joined through node 4


def test_a_split_run_is_judged_against_each_components_own_aggregate(tmp_path: Path) -> None:
    (tmp_path / "g.csv").write_text(TWO_CLIQUES)
    cfg = RunConfig(op="max", n=9, graph="file", graph_file=tmp_path / "g.csv", may_depart=True, trials=3)
    result = simulate(cfg, departures={4: 300})
    summary = summarize(result)
    # Against the survivors' overall maximum, the half without it would never converge.
    assert (result.converged_iterations < 0).any()
    assert summary["converged_fraction"] == 1.0
    parts = summary["per_component"]
    assert [p["members"] for p in parts] == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert all(p["exact"] and p["converged_fraction"] == 1.0 for p in parts)
    assert summary["max_error"] <= cfg.tolerance
    assert summary["unconverged_count"] == 0


def test_trials_off_the_tolerance_are_listed_worst_first() -> None:
    summary = summarize(simulate(RunConfig(op="max", trials=4, t_max=100, early_stop=False, seed=1)))
    listed = summary["unconverged_trials"]
    assert summary["unconverged_count"] == 4
    assert sorted(e["trial"] for e in listed) == [0, 1, 2, 3]
    errors = [e["error"] for e in listed]
    assert errors == sorted(errors, reverse=True)
    assert summary["max_error"] == errors[0] > summary["tolerance"]


def test_a_component_with_one_unknown_member_left_is_counted_determined() -> None:
    # n = 5, K = 2: the four trimmed extremes are exposed (matching events), so the average
    # phase's sum gives the fifth value away although no x of it matched.
    result = simulate(RunConfig(op="trimmed-mean", k=2, n=5, graph="complete", trials=2, seed=2))
    summary = summarize(result)
    assert np.all(result.matched.sum(axis=1) == 4)
    assert summary["leakage_probability"][2] == 0.0
    assert summary["determined_probability"] == [1.0] * 5
    assert summary["determined_mean"] == 5.0


def test_the_testbed_judges_each_component_of_a_split_run_on_its_own() -> None:
    cfg = RunConfig(op="max", n=5, graph="file", graph_file=Path("unused.csv"), may_depart=True)
    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 4]])
    truth = np.array([[1.0], [1.0], [np.nan], [4.0], [4.0]])
    outputs = {0: [1.0], 1: [1.0], 3: [4.0], 4: [3.5]}  # node 4 did not reach its part's maximum
    parts = departure_outcome(cfg, {2: 10}, edges, (truth, truth), outputs)["components"]
    assert [p["members"] for p in parts] == [[0, 1], [3, 4]]
    assert [p["exact"] for p in parts] == [True, False]
    assert [p["converged_fraction"] for p in parts] == [1.0, 0.5]
    assert [p["max_error"] for p in parts] == [0.0, 0.5]
