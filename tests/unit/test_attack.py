"""The transcript attack on simulated runs of every operator, and through the transcript file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_transcript, score
from adversary.simulated import attack_simulation, simulate_transcript, truth_path, write_sim_transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError
from nlagg_node.sim import SimResult, simulate

CASES: dict[str, dict[str, object]] = {
    "max": {"op": "max"},
    "min": {"op": "min"},
    "topk": {"op": "topk", "k": 3},
    "median": {"op": "median"},
    "quantile": {"op": "quantile", "quantile": 5 / 7},
    "trimmed-mean": {"op": "trimmed-mean", "k": 2},
    "trimmed-mean-plain": {"op": "trimmed-mean", "k": 2, "init_channel": "plain"},
    "max-leaky": {"op": "max", "c": 1.0, "mu_z": 10.0},
    "median-nonprivate": {"op": "median", "init": "none"},
    "max-dp": {"op": "max", "init": "dp-laplace"},
    # the rest run early stopping (the default); these the fixed schedule, every iteration published
    "max-fixed": {"op": "max", "early_stop": False},
    "topk-fixed": {"op": "topk", "k": 3, "early_stop": False},
}


def _run(name: str, trials: int = 2) -> SimResult:
    params = dict(CASES[name])
    op = str(params["op"])
    t_max = {"max": 2500, "min": 2500, "topk": 1500, "trimmed-mean": 1000}.get(op, 1500)
    params.setdefault("t_max", t_max)
    return simulate(RunConfig(trials=trials, record="all", seed=3, **params))


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_precision_is_one_and_intervals_hold(name: str) -> None:
    res = _run(name)
    for trial in range(2):
        report = attack_simulation(res, trial, corrupted=[1])
        assert report.precision == 1.0
        assert report.interval_soundness == 1.0
        assert report.findings[1].status == "corrupted"
        if res.config.op in ("max", "min"):
            assert report.recall == 1.0
            assert report.iteration_agreement == 1.0
        truth = {int(i) for i in np.flatnonzero(res.first_match[trial] >= 0) if i != 1}
        found = {f.node for f in report.findings if f.status == "exposed" and f.how == "=s"}
        assert found <= truth  # a matching-event claim is only made for a true matching event


def test_max_exposes_the_maximum_and_bounds_the_rest_just_above_it() -> None:
    res = _run("max")
    report = attack_simulation(res, 0)
    top = int(np.argmax(res.values[0]))
    assert set(report.exposed) == {top}
    assert report.exposed[top].value == res.values[0, top]
    assert report.exposed[top].t == res.first_match[0, top]
    for f in report.findings:
        if f.node != top:
            assert f.lower == -np.inf
            assert res.values[0, f.node] < f.upper
            assert f.upper == pytest.approx(res.values[0, top], abs=0.05)
            assert f.side in ("below", "unknown")


def test_median_places_unexposed_nodes_on_their_side() -> None:
    res = _run("median")
    report = attack_simulation(res, 0)
    med = float(np.median(res.values[0]))
    for f in report.findings:
        if f.status == "interval":
            assert f.side in ("above", "below")
            assert (res.values[0, f.node] > med) == (f.side == "above")


@pytest.mark.parametrize(
    ("name", "ranks"),
    [("trimmed-mean-plain", list(range(15))), ("trimmed-mean", [0, 1, 13, 14])],
    ids=["plain", "sealed"],
)
def test_trimmed_mean_exposes_every_value_only_with_plaintext_duals(name: str, ranks: list[int]) -> None:
    # With z^(0) of the average part captured in plaintext, x_i (1 + c d_i) + v_i is s_i; sealed
    # (the default channel), only the four trimmed extremes' matching events remain.
    res = _run(name)
    report = attack_simulation(res, 0)
    assert sorted(int(res.rank[0, i]) for i in report.exposed) == ranks
    assert report.precision == 1.0


def test_transcript_file_gives_the_same_findings(tmp_path: Path) -> None:
    res = _run("median", trials=1)
    path = write_sim_transcript(res, tmp_path / "t.sqlite", corrupted=[2])
    assert truth_path(path).is_file()
    from_file = attack_transcript(path)
    direct = attack_simulation(res, 0, corrupted=[2])
    assert from_file.findings == direct.findings
    assert from_file.precision == 1.0
    assert from_file.recall == direct.recall
    with pytest.raises(ConfigError) as err:
        write_sim_transcript(res, path)
    assert err.value.field == "transcript"


def test_missing_initial_duals_leave_nodes_unexposed() -> None:
    from adversary.attack import attack_arrays
    from adversary.simulated import trial_x, trial_z0
    from nlagg_node.schedule import phase_c

    res = _run("max", trials=1)
    z0 = {g: np.full_like(z, np.nan) for g, z in trial_z0(res, 0).items()}
    cfg = res.config
    report = attack_arrays(
        cfg.n,
        res.graphs[0],
        res.phases,
        [phase_c(cfg, p) for p in res.phases],
        cfg.theta,
        z0,
        trial_x(res, 0),
    )
    assert report.exposed == {}
    assert all(f.lower == -np.inf and f.upper == np.inf for f in report.findings)


def test_record_all_is_required_and_truth_shape_checked() -> None:
    res = simulate(RunConfig(op="max", trials=1, t_max=50, record="every:10"))
    with pytest.raises(ConfigError) as err:
        attack_simulation(res, 0)
    assert err.value.field == "record"
    full = simulate(RunConfig(op="max", trials=1, t_max=50, record="all"))
    with pytest.raises(ConfigError) as err2:
        score(attack_simulation(full, 0), np.zeros(3))
    assert err2.value.field == "true_values"


def test_simulate_transcript_is_trial_zero_of_the_batch(tmp_path: Path) -> None:
    cfg = RunConfig(op="min", trials=3, t_max=800, seed=9, record="all")
    batch = simulate(cfg)
    path = simulate_transcript(cfg, tmp_path / "one.sqlite", corrupted=[4])
    from_file = attack_transcript(path)
    direct = attack_simulation(batch, 0, corrupted=[4])
    assert from_file.findings == direct.findings
    assert from_file.precision == 1.0
    assert from_file.recall == 1.0


def test_the_attack_sizes_its_arrays_by_what_the_transcript_holds(tmp_path: Path) -> None:
    """A small transcript whose config announces n = 10000 and 7000 iterations (70 million cells):
    the arrays follow the iterations captured, not the config (issue 31: 1.9 GB for 512 KB)."""
    from adversary.live import PublicRun, replay_exposures
    from adversary.transcript import Transcript
    from adversary.transcript.arrays import load_transcript_arrays
    from nlagg_node.runtime.node import build_config_msg, run_edges
    from nlagg_node.runtime.wire import XMsg, encode, topics

    cfg = RunConfig(op="max", n=10_000, graph="ring", trials=1, early_stop=False, t_max=7000)
    tp = topics("nlagg", "big")
    path = tmp_path / "t.sqlite"
    with Transcript(path, run_id="big") as tr:
        tr.add(tp.config, encode(build_config_msg(cfg, "big", run_edges(cfg))), retained=True)
        for i in range(0, 300, 3):
            tr.add(tp.x(i), encode(XMsg(node=i, t=0, phase="max", x=1.0)))
    data = load_transcript_arrays(path)
    assert data["t_total"] == 7000
    assert data["x"].shape == (10_000, 1)
    arrays = (data["edges"], data["phases"], data["cs"], data["theta"], data["z0"], data["x"])
    run = PublicRun(data["n"], *arrays)
    assert replay_exposures(run).branch.shape == (10_000, 1)
    report = attack_transcript(path)
    assert report.output is None  # the schedule's last iteration was not captured
    assert report.extra["expected_x"] == 10_000 * 7000
