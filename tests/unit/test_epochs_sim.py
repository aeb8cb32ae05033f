"""Privacy over time in the simulator (nlagg_node.sim.multiepoch): K epochs, warm starts, the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nlagg_node.config import RunConfig, load_config
from nlagg_node.epochplan import walk_values, warms
from nlagg_node.sim import simulate
from nlagg_node.sim.multiepoch import read_epoch_values, simulate_epochs
from nlagg_node.tune import EpochPlan, Setting, evaluate_epochs
from tests.harness.cli import run_cli


def _cfg(op: str = "max", trials: int = 24) -> RunConfig:
    return load_config(op=op, n=9, trials=trials, value_range=(10.0, 20.0), record="none", seed=3)


def test_one_epoch_is_the_single_run() -> None:
    cfg = _cfg()
    one = simulate_epochs(cfg, 1, 0.01)
    single = simulate(cfg)
    assert np.array_equal(one.exposed[0], single.exposed)
    assert np.array_equal(one.output[0], single.output[:, 0])
    assert np.array_equal(one.iterations[0], single.phase_iterations.sum(axis=1))


def test_the_walk_stays_in_the_range_with_steps_bounded_by_the_drift() -> None:
    cfg = _cfg()
    vals = walk_values(cfg, 30, 0.05)
    steps = np.abs(np.diff(vals, axis=0))
    assert vals.min() >= 10.0
    assert vals.max() <= 20.0
    assert steps.max() <= 0.05 * 10.0 + 1e-12
    assert steps.mean() > 0.1  # about D / 2 of the span, not stuck


@pytest.mark.parametrize("op", ["max", "median"], ids=str)
def test_cumulative_leakage_is_the_direct_count_over_the_trials(op: str) -> None:
    res = simulate_epochs(_cfg(op, trials=40), 4, 0.02)
    first_rank = res.rank[0]
    n = res.values.shape[2]
    for r in range(n):
        node = np.argmax(first_rank == r, axis=1)  # node of rank r in each trial, first epoch
        hit = [bool(res.exposed[:, b, node[b]].any()) for b in range(res.values.shape[1])]
        assert res.cumulative_leakage_probability()[r] == sum(hit) / len(hit)
    assert np.array_equal(res.leakage_probability(), res.leakage_by_epoch().mean(axis=0))
    assert (res.cumulative_leakage_probability() >= res.leakage_by_epoch().max(axis=0)).all()


def test_a_jump_beyond_the_drift_falls_back_to_a_cold_rerun_and_stays_exact() -> None:
    cfg = _cfg(trials=6)
    vals = np.repeat(walk_values(cfg, 1, 0.0), 3, axis=0)
    vals[1, 2, 0] = 20.0  # trial 2: node 0 jumps to the top of the range in epoch 1
    vals[2] = vals[1]
    res = simulate_epochs(cfg, 3, 0.01, values=vals)
    assert res.fell_back[1].tolist() == [b == 2 for b in range(6)]
    assert not res.fell_back[2].any()  # the next epoch starts beyond the new output
    assert res.exact.all()
    assert res.output[1, 2] == pytest.approx(20.0, abs=1e-8)
    assert res.iterations[1, 2] > res.iterations[1, 0]  # the warm run and the cold rerun


def test_the_median_falls_back_only_when_the_median_itself_moved_too_far() -> None:
    """A node that moves far on its side runs a shell value: nothing to fall back from."""
    cfg = _cfg("median", trials=4)
    vals = np.repeat(walk_values(cfg, 1, 0.0), 3, axis=0)
    vals[1, 0, np.argmin(vals[1, 0])] = 10.0  # the lowest node jumps to the bottom: the median stays
    vals[2, 1] = np.clip(vals[1, 1] + 3.0, 10.0, 20.0)  # trial 1: every value up by 0.3 of the range
    res = simulate_epochs(cfg, 3, 0.01, values=vals)
    assert res.fell_back.tolist() == [[False] * 4, [False] * 4, [b == 1 for b in range(4)]]
    assert res.exact.all()


def test_warm_starts_shorten_later_epochs_and_cold_start_does_not() -> None:
    cfg = _cfg()
    warm = simulate_epochs(cfg, 3, 0.005)
    cold = simulate_epochs(cfg, 3, 0.005, warm=False)
    assert warm.exact.all()
    assert np.array_equal(warm.iterations[0], cold.iterations[0])
    assert warm.iterations_by_epoch()[2] < 0.6 * cold.iterations_by_epoch()[2]


@pytest.mark.parametrize(
    ("op", "init", "warm"),
    [
        ("max", "proposed", True),
        ("median", "prior", True),
        ("median", "none", False),
        ("topk", "proposed", False),
    ],
    ids=["max", "median-prior", "baseline", "topk"],
)
def test_only_the_private_initialization_of_a_warm_operator_warm_starts(
    op: str, init: str, warm: bool
) -> None:
    cfg = load_config(op=op, n=7, trials=2, value_range=(0.0, 1.0), record="none", init=init, k=2)
    assert warms(cfg) is warm
    assert simulate_epochs(cfg, 2, 0.01).warm is warm


def test_epoch_values_file_holds_one_row_per_epoch_or_per_epoch_and_trial(tmp_path: Path) -> None:
    path = tmp_path / "v.csv"
    path.write_text("1,2,3\n4,5,6\n")
    assert read_epoch_values(path, 3, 2, 2).tolist() == [[[1, 2, 3], [1, 2, 3]], [[4, 5, 6], [4, 5, 6]]]
    assert read_epoch_values(path, 3, 1, 2).tolist() == [[[1, 2, 3], [4, 5, 6]]]
    with pytest.raises(Exception, match="epochs=3 rows"):
        read_epoch_values(path, 3, 3, 2)


def test_sim_epochs_json_reports_the_figures_per_epoch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["sim", "--op", "median", "--n", "7", "--trials", "5", "--value-range", "0", "1"]
    code, out, _ = run_cli(
        [*args, "--epochs", "3", "--drift", "0.01", "--json", "--quiet"], capsys, monkeypatch
    )
    assert code == 0
    doc = json.loads(out)
    assert (doc["epochs"], doc["drift"], doc["warm_start"]) == (3, 0.01, True)
    assert len(doc["leakage_probability"]) == len(doc["cumulative_leakage_probability"]) == 7
    assert len(doc["iterations_by_epoch"]) == 3
    assert "output_by_epoch" not in doc  # five trials: no one output per epoch


def test_sim_epochs_json_of_one_trial_reports_each_epochs_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["sim", "--op", "max", "--n", "7", "--trials", "1", "--value-range", "0", "1", "--seed", "4"]
    code, out, _ = run_cli(
        [*args, "--epochs", "3", "--drift", "0.01", "--json", "--quiet"], capsys, monkeypatch
    )
    assert code == 0
    cfg = load_config(op="max", n=7, trials=1, value_range=(0.0, 1.0), seed=4)
    assert json.loads(out)["output_by_epoch"] == simulate_epochs(cfg, 3, 0.01).output[:, 0].tolist()


def test_tune_over_epochs_bounds_the_cumulative_exposure() -> None:
    base = _cfg(trials=20)
    e = evaluate_epochs(base, Setting("proposed", 1000.0, 600.0, 1.0, 7000), EpochPlan(3, 0.005))
    assert e.leak == max(e.leak_by_rank)
    assert e.exact
    assert e.iterations_median is not None
