"""One command-line vocabulary: the same option names, defaults shown, one --out rule (--version and
the entry points in a real process: tests/integration/test_cli_entry_points.py)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from typer.testing import CliRunner

from nlagg_node.cli import _register, app
from nlagg_node.cli.epochtestbed import exposure_text
from nlagg_node.config import DEFAULT_BROKER
from tests.harness.cli import run_cli

runner = CliRunner()
PANEL_BORDERS = str.maketrans(dict.fromkeys("│╭╮╰╯─", " "))


def help_text(*command: str) -> str:
    _register()
    result = runner.invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.translate(PANEL_BORDERS).split())  # a panel's wrapped cell reads on


@pytest.mark.parametrize("command", [("sim",), ("testbed",)], ids=["sim", "testbed"])
def test_run_options_show_their_defaults(command: tuple[str, ...]) -> None:
    text = help_text(*command)
    for shown in (
        "number of nodes [default: 15]",
        "[default: max]",
        "[default: rgg]",
        "[default: 0]",
        "--sigma-z",
        "--theta",
        "--values",
        "median/quantile: 10",
    ):
        assert shown in text, shown


def test_sim_shows_trial_default_and_plan_shows_its_defaults() -> None:
    assert "Monte Carlo trials [default: 1000]" in help_text("sim")
    plan = help_text("deploy", "plan")
    assert "[default: 15]" in plan
    assert "[default: max]" in plan


@pytest.mark.parametrize(
    "command",
    [("node",), ("eavesdrop",), ("deploy", "plan"), ("deploy", "publish-config")],
    ids=["node", "eavesdrop", "plan", "publish-config"],
)
def test_broker_has_one_default(command: tuple[str, ...]) -> None:
    assert f"[default: {DEFAULT_BROKER}]" in help_text(*command)


@pytest.mark.parametrize("command", ["node", "testbed", "eavesdrop"])
def test_verbose_is_explained(command: str) -> None:
    _register()
    output = runner.invoke(app, [command, "--help"], terminal_width=200).output
    line = next(ln for ln in output.splitlines() if "--verbose" in ln)  # plain or in a rich panel
    assert "-v" in line.replace(",", " ").split()
    assert "log the protocol's progress" in line


def test_help_keeps_bracketed_text() -> None:
    text = help_text("node")
    assert "TOML with [run] and optional [network]" in text


def test_transcript_is_one_name() -> None:
    assert "--transcript" in help_text("eavesdrop")
    assert "--db" not in help_text("eavesdrop")
    assert "TRANSCRIPT" in help_text("attack")


def test_help_states_the_run_configs_defaults() -> None:
    # The help texts read nlagg_node.defaults (no pydantic at start-up); RunConfig must agree.
    from nlagg_node.config import RunConfig
    from nlagg_node.defaults import RUN_DEFAULTS

    assert {name: getattr(RunConfig(), name) for name in RUN_DEFAULTS} == RUN_DEFAULTS


@pytest.mark.parametrize(
    ("command", "existing"),
    [
        pytest.param(["sim", "--trials", "2", "--t-max", "10"], "summary.json", id="sim"),
        pytest.param(["testbed", "--n", "4", "--t-max", "10"], "manifest.json", id="testbed"),
        pytest.param(["experiment", "min", "--trials", "10"], "min.json", id="experiment"),
    ],
)
def test_out_never_replaces_an_earlier_run_without_force(
    command: list[str],
    existing: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / existing).write_text("{}")
    code, _, err = run_cli([*command, "--out", str(out)], capsys, monkeypatch)
    assert code == 2
    assert existing in err
    assert "--force" in err
    assert (out / existing).read_text() == "{}"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["sim", "--trials", "2", "--t-max", "10"], id="sim"),
        pytest.param(["testbed", "--n", "4", "--t-max", "10"], id="testbed"),
        pytest.param(["experiment", "min", "--trials", "10"], id="experiment"),
        pytest.param(["deploy", "plan", "--run-id", "r1", "--n", "4"], id="deploy-plan"),
    ],
)
def test_out_that_cannot_be_a_folder_is_named(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    out = blocker / "out"  # its parent is a file: no folder can be made there
    code, _, err = run_cli([*command, "--out", str(out)], capsys, monkeypatch)
    assert code == 2
    assert err.strip() == f"nlagg: error: out={str(out)!r}: cannot create this directory (Not a directory)"
    assert blocker.read_text() == "mine\n"


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"], ids=["zero", "negative", "nan"])
def test_testbed_refuses_a_neighbour_timeout_that_is_not_positive(
    timeout: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before anything starts: it used to reach node 0, which failed on its departure timeout.
    code, out, err = run_cli(["testbed", "--n", "4", "--neighbour-timeout", timeout], capsys, monkeypatch)
    assert code == 2
    expected = f"neighbour_timeout={float(timeout)!r}: must be a positive number of seconds"
    assert err.strip() == f"nlagg: error: {expected}"
    assert out == ""


def test_tune_never_replaces_its_run_toml_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run.toml"
    out.write_text("# mine\n")
    code, _, err = run_cli(["tune", "--n", "4", "--trials", "2", "--out", str(out)], capsys, monkeypatch)
    assert code == 2
    assert str(out) in err
    assert "--force" in err
    assert out.read_text() == "# mine\n"


def test_force_replaces_a_sim_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    db = tmp_path / "t.sqlite"
    args = ["sim", "--trials", "2", "--t-max", "10", "--out", str(out), "--transcript", str(db), "--json"]
    assert run_cli(args, capsys, monkeypatch)[0] == 0
    code, _, err = run_cli(args, capsys, monkeypatch)
    assert code == 2
    assert "--force" in err
    assert run_cli([*args, "--force"], capsys, monkeypatch)[0] == 0
    assert (out / "arrays.npz").is_file()


def _printed_summary(**fields: object) -> str:
    """What ``nlagg testbed`` prints for a summary of a 3-node max run, with ``fields`` replaced."""
    from rich.console import Console

    from nlagg_node.cli.testbed import print_summary
    from nlagg_node.lab.summary import TestbedSummary

    summary: dict[str, object] = {
        "run_id": "r",
        "op": "max",
        "n": 3,
        "graph": "ring",
        "edges": 3,
        "private_values": {"0": 2.0, "1": 1.0, "2": 0.5},
        "final_x": {"0": 2.0, "1": 2.0, "2": 1.9},
        "corrupted": [],
        "exposures": {},
        "exposed_nodes": [],
        "true_value": 2.0,
        "true_interval": [[2.0, 2.0]],
        "exact": True,
        "tolerance": 1e-9,
        "value_range": None,
        "mse": 0.0,
        "iterations": 10,
        "rounds_per_second": 100.0,
        "wall_seconds": 1.0,
        "broker": "mosquitto",
        "messages_captured": 60,
        "messages_rejected": 0,
        "transcript": None,
        **fields,
    }
    console = Console(record=True, width=240)
    print_summary(console, cast(TestbedSummary, summary))  # a partial summary: the keys the table reads
    return console.export_text()


def test_testbed_table_explains_what_was_learned() -> None:
    """The maximizer's exposure is unavoidable, any other beyond the ideal world; a legend; a hint."""
    exposures = {
        "0": {"t": 5, "value": 2.0, "how": "=s", "correct": True, "verdict": "unavoidable"},
        "1": {"t": 9, "value": 1.0, "how": "=s", "correct": True, "verdict": "beyond the ideal world"},
    }
    lines = _printed_summary(exposures=exposures, exposed_nodes=[0, 1], exact=False, mse=0.003).splitlines()
    row = {ln.split("│")[1].strip(): ln for ln in lines if ln.count("│") >= 4 and ln.split("│")[1].strip()}
    assert "unavoidable" in row["0"]
    assert "beyond the ideal world" in row["1"]
    assert "unavoidable" not in row["1"]
    assert "an interval only" in row["2"]
    text = " ".join(lines)
    assert "eavesdropper learned:" in text
    assert "NOT exact" in text
    assert "raise --t-max" in text
    assert "(beyond the ideal world: [1])" in text
    assert "true aggregate 2.0: NOT exact" in text


@pytest.mark.parametrize(
    ("tolerance", "value_range", "said"),
    [
        pytest.param(1e-9, None, "true aggregate 2.0: exact (MSE", id="default-precision"),
        pytest.param(1e-4, None, "true aggregate 2.0: exact to 0.0001 (MSE", id="looser-precision"),
        pytest.param(
            1e-4, [0.0, 4.0], "true aggregate 2.0: exact to 0.0001 of the range (MSE", id="of-a-range"
        ),
    ],
)
def test_testbed_verdict_names_a_non_default_tolerance(
    tolerance: float, value_range: list[float] | None, said: str
) -> None:
    """'exact' means within the run's tolerance; one other than the default is named beside it."""
    assert said in _printed_summary(tolerance=tolerance, value_range=value_range)


def test_testbed_table_gives_an_interval_of_exact_outputs() -> None:
    """Where every point between two values is exact (an odd n's median with one node departed),
    the line says so."""
    values = {"0": 3.0, "1": -1.0, "2": 0.5, "3": -0.25}
    text = _printed_summary(
        op="median",
        n=4,
        edges=4,
        private_values=values,
        final_x=dict.fromkeys(values, 0.0),
        true_value=[-0.25],
        true_interval=[[-0.25, 0.5]],
    )
    assert "true aggregate any of [-0.25, 0.5]: exact" in text


@pytest.mark.parametrize(
    "command",
    [("sim",), ("testbed",), ("node",), ("tune",), ("deploy", "plan")],
    ids=["sim", "testbed", "node", "tune", "plan"],
)
def test_value_range_shows_its_two_numbers(command: tuple[str, ...]) -> None:
    assert "--value-range LO HI" in help_text(*command)


@pytest.mark.parametrize(
    ("exposed", "ideal", "said"),
    [
        ([], [3], "exposed none"),
        ([3], [3], "exposed 3 (holding the output: unavoidable)"),
        ([3, 5], [3], "exposed 3, 5 (beyond the ideal world: 5)"),
    ],
    ids=["none", "unavoidable", "beyond"],
)
def test_an_epochs_exposures_are_judged_against_the_ideal_world(
    exposed: list[int], ideal: list[int], said: str
) -> None:
    assert exposure_text(exposed, ideal) == said
