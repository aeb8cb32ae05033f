"""The public value range: the affine map, the refusals, real values, honest leakage (issue 10)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nlagg_node.config import RunConfig, load_config
from nlagg_node.errors import ConfigError
from nlagg_node.sim import simulate
from nlagg_node.sim.values import draw_values, read_values_file
from nlagg_node.threat import solvable
from nlagg_node.valuechecks import check_node_value, check_start, leak_warning, start_problem
from nlagg_node.valuemap import scale_for
from tests.harness.cli import run_cli

OPS = ["max", "min", "topk", "median", "quantile", "trimmed-mean", "average"]


@pytest.mark.parametrize("op", OPS, ids=OPS)
def test_output_is_exact_in_user_units(op: str) -> None:
    """Every operator commutes with the map: the output is the user's aggregate within 1e-9 (hi - lo)."""
    cfg = RunConfig(op=op, n=9, graph="ring", trials=4, value_range=(15.0, 35.0), seed=5, record="none")
    res = simulate(cfg)
    assert res.values.min() >= 15.0
    assert res.values.max() <= 35.0
    err = np.sqrt(res.mse.max()) / 20.0
    assert err <= 1e-9
    assert res.converged_iterations.min() >= 0


def test_identity_without_range_is_bit_for_bit() -> None:
    scale = scale_for(RunConfig())
    s = np.array([0.1, -2.5, 3.0])
    assert scale.to_protocol(s) is s
    assert scale.to_user(s) is s


def test_protocol_runs_on_the_unit_interval() -> None:
    cfg = RunConfig(op="max", n=5, graph="ring", trials=1, value_range=(-55.0, 125.0), record="all", t_max=50)
    res = simulate(cfg)
    sc = scale_for(cfg)
    assert sc.to_protocol(-55.0) == 0.0
    assert sc.to_protocol(125.0) == 1.0
    # the wire's x starts at the range's midpoint + mu_z / c = 0.5 + 0.6, in protocol units
    assert np.all(np.abs(res.recorded_x[0] - 1.1) < 0.01)


@pytest.mark.parametrize("value", [40.0, 14.999], ids=["above", "below"])
def test_value_outside_the_range_is_refused(value: float) -> None:
    cfg = RunConfig(value_range=(15.0, 35.0))
    with pytest.raises(ConfigError) as err:
        check_node_value(cfg, value)
    assert str(value) in str(err.value)
    assert "[15, 35]" in str(err.value)


def test_start_below_a_raw_value_is_refused_naming_mu_z_c_and_the_range() -> None:
    """The field case of the issue: temperatures without a range and x starting near mu_z / c = 3."""
    cfg = RunConfig(op="max")
    assert start_problem(cfg, 1.0) is None
    with pytest.raises(ConfigError) as err:
        check_start(cfg, 22.5)
    text = str(err.value)
    assert "mu_z=300" in text
    assert "c=100" in text
    assert "value_range unset" in text


def test_start_inside_a_declared_range_is_refused() -> None:
    cfg = RunConfig(op="min", value_range=(15.0, 35.0), c=1000.0, mu_z=300.0)  # starts at 0.2: inside
    why = start_problem(cfg)
    assert why is not None
    assert "mu_z=300" in why
    assert "[15, 35]" in why
    assert start_problem(RunConfig(op="min", value_range=(15.0, 35.0))) is None  # the defaults


def test_uniform_range_draws_over_the_range() -> None:
    s = draw_values("uniform-range", 3, 50, 15, (15.0, 35.0))
    assert s.shape == (50, 15)
    assert s.min() >= 15.0
    assert s.max() <= 35.0
    assert s.max() - s.min() > 15.0
    assert RunConfig(value_range=(1.0, 2.0)).values_value == "uniform-range"
    with pytest.raises(ConfigError):
        load_config(values="uniform-range")


@pytest.mark.parametrize(
    ("text", "trials", "expected"),
    [
        ("20.5, 21\n22 23.5\n", 2, [[20.5, 21.0], [22.0, 23.5]]),
        ("# one row for every trial\n20 21\n", 3, [[20.0, 21.0]] * 3),
        ("20\n21\n", 1, [[20.0, 21.0]]),
    ],
    ids=["csv-rows", "reused-row", "one-per-line"],
)
def test_values_file_layouts(tmp_path: Path, text: str, trials: int, expected: list[list[float]]) -> None:
    path = tmp_path / "values.csv"
    path.write_text(text)
    assert read_values_file(path, 2, trials).tolist() == expected


def test_values_file_with_wrong_row_count_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    path.write_text("1 2 3\n4 5 6\n")
    with pytest.raises(ConfigError, match="2 rows"):
        read_values_file(path, 3, 5)


def test_sim_values_file_outside_the_range_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "v.txt"
    path.write_text("20 21 40\n")
    args = ["sim", "--n", "3", "--graph", "ring", "--trials", "2", "--values-file", str(path)]
    code, _, err = run_cli([*args, "--value-range", "15", "35"], capsys, monkeypatch)
    assert code == 2
    assert (
        err.strip()
        == "nlagg: error: value=40.0: outside value_range [15, 35]; fix the sensor or declare a wider range"
    )


@pytest.mark.parametrize(
    ("args", "leak"),
    [(["--init", "none"], 1.0), (["--init-channel", "plain"], 1.0), ([], 0.0)],
    ids=["init-none", "plain-channel", "auto-sealed"],
)
def test_average_leakage_in_sim_json(
    args: list[str], leak: float, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero or public duals expose every value; sealed (``--init-channel auto``, issue 14) every rank
    stays at the ideal-world level: with no corrupted node the ideal world reveals only the output,
    the mean of all 15 values, which determines none of them (0.0 for every rank)."""
    code, out, err = run_cli(
        ["sim", "--op", "average", *args, "--trials", "20", "--json"], capsys, monkeypatch
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["n"] == 15
    assert summary["leakage_probability"] == [leak] * 15
    assert summary["matching_probability"] == [0.0] * 15  # none of it is a matching event
    assert summary["sigma_z"] == 100.0  # the README's sigma_z of the average
    if leak:
        assert err.count("\n") == 1
        assert "exposes every value" in err
        assert any("exposes every value" in w for w in summary["warnings"])
    else:
        assert err == ""
        assert summary["warnings"] == []


def test_trimmed_mean_counts_every_value_the_attack_recovers() -> None:
    cfg = RunConfig(
        op="trimmed-mean", n=9, graph="ring", k=2, trials=3, t_max=300, avg_t_max=50, record="none",
        init_channel="plain",
    )  # fmt: skip
    res = simulate(cfg)
    assert res.exposed.all()  # the average part's z^(0) is public: every value is solved
    assert np.all(res.leakage_probability() == 1.0)
    assert leak_warning(cfg) is not None


def test_known_dual_mask_hides_the_nodes_on_unknown_edges() -> None:
    """The plug-in point of a sealed initialization: a node with an unknown dual stays hidden."""
    src = np.array([0, 1, 1, 2])
    dst = np.array([1, 2, 0, 1])
    known = np.array([True, False, True, False])  # edge 1-2 unknown in both directions
    assert solvable(src, dst, 3, known).tolist() == [True, False, False]


@pytest.mark.parametrize(
    ("op", "init", "warns"),
    [
        ("max", "none", True),
        ("max", "proposed", False),
        ("median", "proposed", False),
        ("average", "proposed", False),
        ("average", "proposed-plain", True),
        ("average", "none", True),
    ],
    ids=["max-none", "max-proposed", "median-proposed", "average-proposed", "average-plain", "average-none"],
)
def test_warning_for_pairs_that_leak_every_value(op: str, init: str, warns: bool) -> None:
    # Sealed (the default channel for averages) and random, the average's duals stay unknown; in
    # plaintext, or zero, the eavesdropper knows them.
    channel = "plain" if init.endswith("-plain") else "auto"
    init = init.removesuffix("-plain")
    cfg = RunConfig(op=op, init=init, value_range=(0.0, 10.0), init_channel=channel)
    assert (leak_warning(cfg) is not None) == warns


def test_exposures_are_reported_in_user_units(tmp_path: Path) -> None:
    from adversary.attack import attack_transcript
    from adversary.simulated import simulate_transcript

    cfg = RunConfig(op="max", n=6, graph="ring", trials=1, t_max=400, value_range=(15.0, 35.0), seed=2)
    path = simulate_transcript(cfg, tmp_path / "t.sqlite")
    report = attack_transcript(path)
    truth = simulate(cfg).values[0]
    top = int(np.argmax(truth))
    assert report.exposed[top].value == pytest.approx(truth[top], abs=1e-9 * 20)
    assert report.precision == 1.0
    assert report.interval_soundness == 1.0
    assert report.value_range == (15.0, 35.0)
