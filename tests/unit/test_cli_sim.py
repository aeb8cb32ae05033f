"""``nlagg sim``: JSON summary, run directories that replay exactly, one-line errors with exit code 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.harness.cli import run_cli


def test_json_summary_has_the_documented_fields(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_cli(
        ["sim", "--op", "max", "--trials", "30", "--t-max", "2000", "--c", "10", "--mu-z", "100", "--json"],
        capsys,
        monkeypatch,
    )
    assert code == 0
    summary = json.loads(out)
    for key in (
        "op",
        "n",
        "trials",
        "t_max",
        "seed",
        "mse",
        "leakage_probability",
        "converged_fraction",
        "tolerance",
        "iterations_to_converge",
        "wall_seconds",
    ):
        assert key in summary
    assert len(summary["leakage_probability"]) == 15
    assert summary["leakage_probability"][0] == 1.0


def test_out_dir_replays_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = [
        "sim",
        "--op",
        "median",
        "--trials",
        "20",
        "--t-max",
        "500",
        "--seed",
        "7",
        "--record",
        "log:20",
        "--out",
        str(out),
        "--json",
    ]
    assert run_cli(args, capsys, monkeypatch)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 7
    assert manifest["config"]["c"] == 10.0
    first = np.load(out / "arrays.npz")
    replay = tmp_path / "replay"
    assert (
        run_cli(
            ["sim", "--config", str(out / "manifest.json"), "--out", str(replay), "--json"],
            capsys,
            monkeypatch,
        )[0]
        == 0
    )
    second = np.load(replay / "arrays.npz")
    for key in ("values", "recorded_x", "z0_median", "graph_edges", "first_match"):
        assert np.array_equal(first[key], second[key])


def test_config_file_is_overridden_by_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('[run]\nop = "min"\ntrials = 5\nt_max = 100\nn = 6\n')
    code, out, _ = run_cli(["sim", "--config", str(cfg), "--n", "8", "--json"], capsys, monkeypatch)
    summary = json.loads(out)
    assert code == 0
    assert summary["op"] == "min"
    assert summary["n"] == 8
    assert summary["trials"] == 5


BAD = [
    pytest.param(["--c", "0"], "c=0.0", id="c-nonpositive"),
    pytest.param(["--theta", "1.5"], "theta=1.5", id="theta-out-of-range"),
    pytest.param(["--op", "quantile", "--quantile", "1.2"], "quantile=1.2", id="quantile-out-of-range"),
    pytest.param(["--op", "topk", "--k", "15"], "k=", id="k-too-large"),
    pytest.param(["--n", "1"], "n=1", id="n-too-small"),
    pytest.param(["--mu-z", "nan"], "mu_z=nan", id="nan"),
    pytest.param(["--op", "mean"], "op='mean'", id="unknown-operator"),
    pytest.param(["--record", "sometimes"], "record=", id="bad-record-spec"),
    pytest.param(["--tolerance", "inf"], "tolerance=inf", id="tolerance-infinite"),
    pytest.param(["--tolerance", "0"], "tolerance=0.0", id="tolerance-zero"),
    # Cross-field checks: the value is shown once, not quoted twice ("values=\"'uniform-range'\"").
    pytest.param(["--values", "uniform-range"], "values='uniform-range': needs", id="range-missing"),
    pytest.param(["--value-range", "5", "1"], "value_range=[5.0, 1.0]: needs", id="range-reversed"),
    pytest.param(["--op", "topk", "--k", "15", "--n", "15"], "k=15: must be smaller", id="k-shown-as-number"),
]


@pytest.mark.parametrize(("args", "field"), BAD)
def test_bad_input_exits_2_with_one_line_naming_the_field(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(["sim", "--trials", "2", "--t-max", "10", *args], capsys, monkeypatch)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert field in err


@pytest.mark.parametrize(
    ("name", "content", "field"),
    [
        pytest.param("g.csv", "0,1\n2,3\n", "not connected", id="disconnected"),
        pytest.param("g.csv", "0,1\n1\n", "expected 'i,j'", id="malformed"),
        pytest.param("g.csv", "1,30000000\n", "node ids must lie in 0..9999", id="csv-huge-id"),
        pytest.param("g.json", '{"n": 1e11, "edges": [[0, 1]]}', "must lie in 2..10000", id="json-huge-n"),
        pytest.param("g.csv", "0,1\nhunter2-secret,xyz\n", "not integer ids", id="no-echo-csv"),
        pytest.param("g.json", '{"edges": [["hunter2-secret", 1]]}', "pair [i, j]", id="no-echo-json"),
        pytest.param("g.json", "hunter2-secret", "not valid JSON", id="no-echo-not-json"),
    ],
)
def test_bad_graph_file_exits_2(
    tmp_path: Path,
    name: str,
    content: str,
    field: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = tmp_path / name
    graph.write_text(content)
    code, _, err = run_cli(
        ["sim", "--graph-file", str(graph), "--n", "4", "--trials", "2", "--t-max", "10"], capsys, monkeypatch
    )
    assert code == 2
    assert field in err
    assert len(err.strip().splitlines()) == 1
    assert "hunter2" not in err  # the file's contents are never echoed


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        pytest.param("t_max = 1e11", "t_max=", id="t_max-1e11"),
        pytest.param("n = 20000000", "n=", id="n-2e7"),
        pytest.param("op = 'topk'\nk = 50\nn = 100\nt_max = 1000000", "t_max=", id="topk-too-long"),
        pytest.param("n = 5000\nt_max = 100000", "n=", id="node-iterations"),
    ],
)
def test_size_blowups_exit_2_with_one_line(
    tmp_path: Path, toml: str, field: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "run.toml"
    conf.write_text(toml + "\n")
    code, _, err = run_cli(["sim", "--config", str(conf), "--trials", "1"], capsys, monkeypatch)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert field in err


def test_graph_file_in_a_config_is_relative_to_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = tmp_path / "plan"
    plan.mkdir()
    (plan / "graph.csv").write_text("0,1\n1,2\n2,3\n")
    (plan / "run.toml").write_text(
        'op = "max"\nn = 4\ngraph = "file"\ngraph_file = "graph.csv"\ntrials = 2\nt_max = 50\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["sim", "--config", str(plan / "run.toml"), "--json"], capsys, monkeypatch)
    assert code == 0
    assert json.loads(out)["graph"] == "file"


@pytest.mark.parametrize(
    ("make", "args", "expected"),
    [
        pytest.param(
            lambda d: (d / "run.yaml").write_text("op: max\n"),
            ["--config", "{d}/run.yaml"],
            "use a TOML (.toml) or JSON (.json) file",
            id="yaml-config",
        ),
        pytest.param(
            lambda d: (d / "cfg").mkdir(), ["--config", "{d}/cfg"], "is a directory", id="dir-config"
        ),
        pytest.param(
            lambda d: None, ["--graph", "file"], "graph='file': give the edge list", id="graph-file-unset"
        ),
        pytest.param(
            lambda d: (d / "g.csv").write_text("0,1\n1,2\n2,7\n"),
            ["--graph-file", "{d}/g.csv", "--n", "3"],
            "id 7 out of range for n=3",
            id="graph-id-out-of-range",
        ),
        pytest.param(
            lambda d: (d / "run.json").write_text('{"op": "max", "tirals": 5}'),
            ["--config", "{d}/run.json"],
            "(in ",
            id="config-key-names-the-file",
        ),
    ],
)
def test_input_messages_say_what_is_wrong(
    make: Callable[[Path], object],
    args: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make(tmp_path)
    argv = ["sim", "--trials", "2", "--t-max", "10", *(a.format(d=tmp_path) for a in args)]
    code, _, err = run_cli(argv, capsys, monkeypatch)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert expected in err


def test_a_start_that_leaks_far_beyond_the_ideal_world_warns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From above, the 0.75 quantile's x crosses every larger value: ranks 0-2 leak, the ideal world
    exposes rank 3 alone (its holder); the warning and the ideal-world column say so (issue 33)."""
    args = ["sim", "--op", "quantile", "--quantile", "0.75", "--init", "from-above", "--trials", "40"]
    code, out, err = run_cli([*args, "--json"], capsys, monkeypatch)
    assert code == 0, err
    summary = json.loads(out)
    assert summary["ideal_world"] == [0.0, 0.0, 0.0, 1.0, *[0.0] * 11]
    (line,) = summary["warnings"]
    assert "leaks rank(s) 0-2" in line
    assert "far beyond the ideal world (which exposes rank(s) 3)" in line
    assert err.strip() == line
