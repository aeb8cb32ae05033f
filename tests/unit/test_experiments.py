"""Experiments, the index page, the analysis commands and the testbed report, on small trial counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from adversary.analysis.experiments import EXPERIMENTS, panel_config, run_all, run_experiment
from adversary.report import render_testbed_report
from adversary.simulated import write_sim_transcript
from nlagg_node.cli import _register, app
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError
from nlagg_node.sim import simulate

runner = CliRunner()


def test_every_figure_of_the_paper_has_an_experiment() -> None:
    assert list(EXPERIMENTS) == [
        "mse",
        "nmi-max",
        "nmi-median",
        "topology",
        "dp",
        "min",
        "topk",
        "quantile",
        "trimmed-mean",
    ]
    assert len(EXPERIMENTS["nmi-max"].panels) == 4
    assert len(EXPERIMENTS["nmi-median"].panels) == 4


def test_panel_config_records_about_300_iterations_and_keeps_operator_defaults() -> None:
    cfg = panel_config({"op": "max"}, 10, 0)
    default = RunConfig(op="max").resolved()
    assert (cfg.c, cfg.mu_z, cfg.t_max) == (default.c, default.mu_z, default.t_max)
    step = int(cfg.record.split(":")[1])
    assert 250 <= default.t_max_value // step <= 350


def test_one_experiment_writes_figures_and_numbers(tmp_path: Path) -> None:
    doc = run_experiment("min", trials=40, out=tmp_path, seed=1)
    for suffix in ("png", "pdf", "json"):
        assert (tmp_path / f"min.{suffix}").stat().st_size > 1000
    panel = json.loads((tmp_path / "min.json").read_text())["panels"][0]
    assert panel["leakage_probability"][-1] == 1.0  # the minimum's holder always leaks
    assert panel["ideal_bound"][-1] == 1.0
    assert max(panel["leakage_probability"][:-1]) < 0.5
    nmi_final = doc["panels"][0]["nmi_final"][-1]
    assert nmi_final is not None
    assert nmi_final > 0.9


def test_index_lists_every_experiment_run(tmp_path: Path) -> None:
    page = run_all(trials=30, out=tmp_path, names=["quantile", "trimmed-mean"])
    text = page.read_text()
    assert "quantile.png" in text
    assert "trimmed-mean.png" in text
    assert "What to see" in text


def test_all_experiments_with_few_trials(tmp_path: Path) -> None:
    page = run_all(trials=30, out=tmp_path)
    for name in EXPERIMENTS:
        assert (tmp_path / f"{name}.png").is_file()
        assert name in page.read_text()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "nope"}, "experiment"),
        ({"name": "min", "trials": 3}, "trials"),
        ({"name": "min", "bootstrap": 1}, "bootstrap"),
    ],
    ids=["unknown-name", "too-few-trials", "one-resample"],
)
def test_bad_experiment_arguments(tmp_path: Path, kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        run_experiment(out=tmp_path, **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_cli_experiment_and_attack(tmp_path: Path) -> None:
    _register()
    result = runner.invoke(app, ["experiment", "min", "--trials", "30", "--out", str(tmp_path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "min.png").is_file()
    res = simulate(RunConfig(op="max", trials=1, t_max=2500, record="all", seed=5))
    path = write_sim_transcript(res, tmp_path / "t.sqlite")
    result = runner.invoke(app, ["attack", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert '"-inf"' not in result.output  # numbers and null only
    doc = json.loads(result.output)
    assert doc["exposed"] == [int(np.argmax(res.values[0]))]
    for node in doc["nodes"]:
        assert node["t"] is None or node["t"] >= 0
        assert node["lower"] is None or isinstance(node["lower"], float)
    assert doc["precision"] == 1.0
    assert doc["recall"] == 1.0
    human = runner.invoke(app, ["attack", str(path)], env={"COLUMNS": "200"})
    holder = next(ln for ln in human.output.splitlines() if ln.startswith(f"│ {doc['exposed'][0]} "))
    assert "unavoidable" in holder  # the maximizer's exposure, in the shared vocabulary
    bad = runner.invoke(app, ["attack", str(tmp_path / "missing.sqlite")])
    assert bad.exit_code != 0


def test_testbed_report_from_a_run_directory(tmp_path: Path) -> None:
    res = simulate(RunConfig(op="median", trials=1, t_max=1500, record="all", seed=2))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_sim_transcript(res, run_dir / "transcript.sqlite", run_id="r1", corrupted=[0])
    summary = {
        "run_id": "r1",
        "exact": True,
        "messages_captured": 0,
        "private_values": {str(i): float(v) for i, v in enumerate(res.values[0])},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = render_testbed_report(run_dir)
    text = page.read_text()
    assert "precision 1" in text
    assert "unavoidable" in text  # the median's holder
    beyond = text.count(">beyond the ideal world<")  # the holder's "unavoidable" row is not counted
    assert f"{beyond} honest node(s) leaked beyond the ideal world" in text
    assert (run_dir / "report.png").is_file()
    with pytest.raises(ConfigError) as err:
        render_testbed_report(tmp_path / "empty")
    assert err.value.field == "run_dir"


MAX_GROUPS = {"output": [0], "near": [1, 2], "far": list(range(3, 15))}
MEDIAN_GROUPS = {"output": [7], "near": [5, 6, 8, 9], "far": [0, 1, 2, 3, 4, *range(10, 15)]}


@pytest.mark.parametrize(
    ("bound", "groups"),
    [
        pytest.param([1.0, *[0.05] * 14], MAX_GROUPS, id="max"),
        pytest.param([0.0] * 7 + [1.0] + [0.0] * 7, MEDIAN_GROUPS, id="median"),
        pytest.param([0.1] * 15, None, id="average-colorbar"),
    ],
)
def test_figures_colour_ranks_by_group(bound: list[float], groups: dict[str, list[int]] | None) -> None:
    from adversary.reporting.plots import rank_groups

    got = rank_groups(np.array(bound))
    assert (None if got is None else {g.name: g.ranks for g in got}) == groups


def test_figure_labels_are_mathtext() -> None:
    from adversary.reporting.plots import params_line, tex

    assert tex("c = 1, mu_z = 10") == r"$c$ = 1, $\mu_z$ = 10"
    assert tex("DP Gaussian, sigma_s = 0.1") == r"DP Gaussian, $\sigma_s$ = 0.1"
    assert tex("median, symmetric init") == "median, symmetric init"
    assert params_line({"c": 100.0, "mu_z": 300.0}) == r"($c$ = 100, $\mu_z$ = 300)"
