"""What a new user meets in the first hour (issue 45): conflicting options refused, one error line,
messages that name the real problem, nothing left behind, a first line before long work, --quiet and
panelled help everywhere, values completed, and sim's determined set with corrupted nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nlagg_node.cli import _register, app
from nlagg_node.errors import NlaggError
from nlagg_node.runtime.brokers import free_port
from tests.harness.cli import run_cli

runner = CliRunner()

LONG_COMMANDS = ["sim", "testbed", "attack", "experiment", "tune", "report", "node", "eavesdrop"]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nlagg: error: "), err
    return lines[0]


# 1. Conflicting options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "first", "second"),
    [
        pytest.param(
            ["sim", "--graph", "ring", "--graph-file", "{edges}"], "graph", "--graph-file", id="graph"
        ),
        pytest.param(
            ["tune", "--graph", "ring", "--graph-file", "{edges}"], "graph", "--graph-file", id="tune-graph"
        ),
        pytest.param(
            ["testbed", "--in-process", "--processes"], "--in-process", "--processes", id="in-process"
        ),
        pytest.param(
            ["sim", "--early-stop", "--no-early-stop"], "--early-stop", "--no-early-stop", id="switch"
        ),
        pytest.param(
            ["sim", "--values", "normal", "--values-file", "{edges}"], "values", "--values-file", id="values"
        ),
        pytest.param(["sim", "--corrupt", "1,1"], "corrupt='1,1'", "twice", id="corrupt-twice"),
        pytest.param(["sim", "--op", "max", "--op=min"], "--op max", "--op=min", id="option-twice"),
        pytest.param(
            ["sim", "--value-range", "0", "1", "--value-range", "2", "3"],
            "--value-range 0 1",
            "--value-range 2 3",
            id="pair-twice",
        ),
        pytest.param(
            ["sim", "--corrupt", "1", "--corrupt-count", "2"], "corrupt", "--corrupt-count", id="corrupt"
        ),
        pytest.param(
            ["sim", "--no-early-stop", "--stop-rule", "certificate"],
            "stop_rule",
            "--no-early-stop",
            id="stop-rule",
        ),
        pytest.param(
            ["sim", "--no-early-stop", "--stop-window", "50"],
            "stop_window",
            "--no-early-stop",
            id="stop-window",
        ),
        pytest.param(
            ["testbed", "--broker", "mqtt://127.0.0.1:1", "--broker-kind", "amqtt"],
            "broker_kind",
            "--broker",
            id="broker",
        ),
    ],
)
def test_conflicting_options_are_refused_naming_both(
    args: list[str],
    first: str,
    second: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    edges = tmp_path / "edges.csv"
    edges.write_text("0,1\n1,2\n")
    argv = [a.replace("{edges}", str(edges)) for a in args]
    code, out, err = run_cli([*argv, "--trials", "2"] if argv[0] == "sim" else argv, capsys, monkeypatch)
    assert code == 2
    assert out == ""
    line = _one_error_line(err)
    assert first in line
    assert second in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["sim", "--drift", "0.1"], "drift=0.1: needs --epochs", id="sim-drift"),
        pytest.param(["sim", "--cold-start"], "cold_start=True: needs --epochs", id="sim-cold"),
        pytest.param(["tune", "--drift", "0.1"], "drift=0.1: needs --epochs", id="tune-drift"),
        pytest.param(["testbed", "--drift", "0.1"], "drift=0.1: needs --every", id="testbed-drift"),
        pytest.param(["testbed", "--every", "5"], "every=5.0: needs --epochs", id="testbed-every"),
        pytest.param(
            ["testbed", "--every", "5", "--epochs", "2", "--depart", "1@9"],
            "depart='1@9': not with --every",
            id="testbed-epochs-depart",
        ),
        pytest.param(
            ["sim", "--epochs", "2", "--corrupt", "1"], "corrupt='1': not with --epochs", id="sim-epochs"
        ),
        pytest.param(
            ["deploy", "plan", "--run-id", "r", "--out", "p", "--cold-start"],
            "cold_start=True: needs --every",
            id="plan",
        ),
        pytest.param(
            ["eavesdrop", "--run-id", "r", "--keep-epochs", "2"],
            "keep_epochs=2: needs --continuous",
            id="eavesdrop",
        ),
        pytest.param(
            ["node", "--id", "0", "--config", "c.toml", "--value", "1", "--results-file", "r.jsonl"],
            "results_file='r.jsonl': needs --every",
            id="node-results",
        ),
        pytest.param(
            ["node", "--id", "0", "--config", "c.toml", "--value", "1", "--leave-by", "kill"],
            "leave_by='kill': needs --leave-after",
            id="node-leave-by",
        ),
        pytest.param(
            ["deploy", "compose", "--compose-dir", "d"], "compose_dir='d': needs --plan", id="compose-dir"
        ),
        pytest.param(
            ["deploy", "compose", "--plan", "p", "--n", "8"], "n=8: not with --plan", id="compose-n"
        ),
        pytest.param(
            ["deploy", "compose", "--plan", "p", "--tls"], "tls=True: not with --plan", id="compose-tls"
        ),
    ],
)
def test_an_option_without_the_one_it_needs_or_beside_one_that_makes_it_moot_is_refused(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 2
    assert out == ""
    assert expected in _one_error_line(err)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["sim", "--op", "max", "--k", "3"], "k=3: applies to --op topk or", id="k"),
        pytest.param(["sim", "--op", "median", "--quantile", "0.3"], "quantile=0.3: applies to", id="p"),
        pytest.param(["sim", "--op", "min", "--epsilon", "0.1"], "epsilon=0.1: applies to", id="epsilon"),
        pytest.param(["sim", "--sigma-s", "0.3"], "this run's init is 'proposed'", id="sigma-s"),
        pytest.param(["sim", "--prior-median", "1"], "prior_median=1.0: applies to --init prior", id="prior"),
        pytest.param(["sim", "--config", "{config}", "--k", "2"], "this run's op is 'median'", id="config"),
        pytest.param(["testbed", "--op", "max", "--k", "2"], "k=2: applies to", id="testbed"),
        pytest.param(["tune", "--op", "max", "--quantile", "0.2"], "quantile=0.2: applies to", id="tune"),
        pytest.param(
            ["deploy", "plan", "--run-id", "r", "--out", "{tmp}/plan", "--graph", "ring", "--radius", "0.5"],
            "radius=0.5: applies to --graph rgg only",
            id="radius",
        ),
    ],
)
def test_an_option_the_run_would_ignore_is_refused(
    args: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "run.toml"
    config.write_text('[run]\nop = "median"\n')
    argv = [a.replace("{config}", str(config)).replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run_cli(argv, capsys, monkeypatch)
    assert code == 2
    assert out == ""
    assert expected in _one_error_line(err)
    assert [p.name for p in tmp_path.iterdir()] == ["run.toml"]  # nothing written


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--op", "topk", "--k", "2", "--epsilon", "0.01"], id="topk"),
        pytest.param(["--op", "quantile", "--quantile", "0.7"], id="quantile"),
        pytest.param(["--init", "dp-laplace", "--sigma-s", "0.2"], id="dp"),
        pytest.param(["--init", "prior", "--prior-median", "0.5"], id="prior"),
    ],
)
def test_an_option_its_run_uses_is_taken(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli(["sim", *args, "--n", "5", "--trials", "2", "--json"], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads(out)["trials"] == 2


# 2. One error style, and messages that name the real problem -----------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(["sim", "--trials", "abc"], "trials='abc': expected an integer", id="int"),
        pytest.param(
            ["node", "--id", "0", "--config", "c.toml", "--value", "abc"], "value='abc'", id="float"
        ),
        pytest.param(["attack", "t.sqlite", "--drift", "-1"], "drift='-1': must be at least 0", id="min"),
        pytest.param(["sim", "--value-range", "15", "--trials", "10"], "is the next option", id="two-values"),
        pytest.param(["tune", "--tirals", "5"], "option='--tirals': no such option", id="no-such-option"),
        pytest.param(["node", "--config", "c.toml"], "id: missing; give --id", id="missing"),
        pytest.param(["attack"], "transcript: missing; give TRANSCRIPT", id="missing-argument"),
        pytest.param(["sim", "--op", "maximum"], "op='maximum'", id="choice"),
        pytest.param(["report", "{tmp}/nosuchdir"], "no such directory", id="no-run-dir"),
        pytest.param(
            ["sim", "--value-range", "15"], "option='--value-range': takes 2 values (LO HI)", id="nargs"
        ),
        pytest.param(["sim", "--op"], "option='--op': needs a value", id="no-value"),
        pytest.param(["sim", "--json=1"], "option='--json': is a switch", id="switch-value"),
        pytest.param(["sim", "extra"], "argument='extra': nlagg sim does not take it", id="extra"),
        pytest.param(
            ["simm"], "command='simm': no such command of nlagg (did you mean 'sim'?)", id="no-such-command"
        ),
        pytest.param(["sim", "--n", "0"], "n=0: must be at least 2", id="pydantic-bound"),
        pytest.param(["sim", "--values", "gauss"], "values='gauss': must be 'normal'", id="pydantic-literal"),
        pytest.param(
            ["eavesdrop", "--run-id", "r1", "--transcript", "{tmp}/nodir/t.sqlite"],
            "does not exist",
            id="no-folder",
        ),
        pytest.param(
            ["testbed", "--broker", "mqtts://127.0.0.1:1", "--ca-file", "{tmp}"],
            "is a directory",
            id="ca-folder",
        ),
    ],
)
def test_a_bad_value_gets_one_line_naming_it(
    args: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_cli([a.replace("{tmp}", str(tmp_path)) for a in args], capsys, monkeypatch)
    assert code == 2
    assert expected in _one_error_line(err)


# 3. Nothing left behind -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "name"),
    [pytest.param([], "t.sqlite", id="run"), pytest.param(["--continuous"], "store", id="continuous")],
)
def test_an_eavesdropper_that_never_connects_leaves_no_transcript(
    extra: list[str],
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = f"mqtt://127.0.0.1:{free_port()}"  # nothing listens there
    args = ["eavesdrop", "--broker", dead, "--run-id", "r1", "--timeout", "0.5", "--no-live"]
    code, _, err = run_cli([*args, "--transcript", str(tmp_path / name), *extra], capsys, monkeypatch)
    assert code == 1
    assert "cannot connect to broker" in _one_error_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("written", [False, True], ids=["empty", "checkpoint"])
def test_a_node_that_fails_keeps_only_a_state_dir_it_wrote_into(
    written: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nlagg_node.errors import BrokerUnreachableError

    state = tmp_path / "state" / "node0"

    def unreachable(opts: Any) -> None:
        state.mkdir(parents=True)  # as the node's checkpoint store makes it
        if written:  # a checkpoint saved before the failure: a restart resumes from it
            (state / "nlagg-r-node-0.json").write_text("{}")
        raise BrokerUnreachableError("mqtt://127.0.0.1:1", 10)

    monkeypatch.setattr("nlagg_node.deploy.start.start_node", unreachable)
    args = ["node", "--id", "0", "--config", "c.toml", "--value", "1", "--state-dir", str(state)]
    code, _, err = run_cli(args, capsys, monkeypatch)
    assert code == 1
    assert "cannot connect to broker" in _one_error_line(err)
    assert [p.name for p in tmp_path.rglob("*")] == (
        ["state", "node0", "nlagg-r-node-0.json"] if written else []
    )


def test_a_run_that_fails_to_start_leaves_no_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"mqtt://127.0.0.1:{free_port()}"
    args = ["testbed", "--broker", dead, "--n", "3", "--out", str(tmp_path / "runs" / "first")]
    code, _, err = run_cli(args, capsys, monkeypatch)
    assert code == 1
    assert "no MQTT broker answers" in _one_error_line(err)
    assert list(tmp_path.iterdir()) == []


# 4. A first line before the long work, silenced by --quiet ------------------------------------------


def _stop(seen: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    def long_work(*_args: Any, **_kwargs: Any) -> None:
        seen.append(capsys.readouterr().err)  # what the user has read when the long work starts
        raise NlaggError("stopped by the test")

    return long_work


def _run_dir(folder: Path) -> None:
    """A testbed's --out as ``nlagg report`` reads it: a transcript and its summary."""
    from adversary.simulated import simulate_transcript
    from nlagg_node.config import RunConfig

    simulate_transcript(RunConfig(n=4, trials=1, t_max=50), folder / "transcript.sqlite")
    (folder / "summary.json").write_text(json.dumps({"private_values": {str(i): 0.0 for i in range(4)}}))


@pytest.mark.parametrize("quiet", [False, True], ids=["shown", "quiet"])
@pytest.mark.parametrize(
    ("args", "work", "first_line"),
    [
        pytest.param(["report", "{tmp}"], "adversary.attack.attack_transcript", "replaying", id="report"),
        pytest.param(["tune", "--out", "{tmp}/run.toml"], "nlagg_node.tune.tune", "settings x", id="tune"),
        pytest.param(["sim", "--trials", "2"], "nlagg_node.sim.simulate", "compiling", id="first-sim"),
        pytest.param(
            ["sim", "--trials", "2", "--epochs", "2"],
            "nlagg_node.sim.multiepoch.simulate_epochs",
            "compiling",
            id="first-sim-epochs",
        ),
    ],
)
def test_a_long_command_says_what_it_does_before_doing_it(
    args: list[str],
    work: str,
    first_line: str,
    quiet: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if args[0] == "report":
        _run_dir(tmp_path)
    seen: list[str] = []
    monkeypatch.setattr(work, _stop(seen, capsys))
    monkeypatch.setattr("nlagg_node.compile_cache.simulator_cached", lambda: False)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args] + (["--quiet"] if quiet else [])
    code, _, _ = run_cli(argv, capsys, monkeypatch)
    assert code == 1
    assert len(seen) == 1
    assert (first_line in seen[0]) is not quiet


def test_a_privacy_warning_survives_quiet(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [
        "sim",
        "--op",
        "average",
        "--init-channel",
        "plain",
        "--trials",
        "2",
        "--n",
        "4",
        "--quiet",
        "--json",
    ]
    code, out, err = run_cli(args, capsys, monkeypatch)
    assert code == 0
    assert "exposes every value" in err
    assert "exposes every value" in json.loads(out)["warnings"][0]


# 5. --quiet and panelled help everywhere, values completed ------------------------------------------


def _help(*command: str) -> str:
    _register()
    result = runner.invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", LONG_COMMANDS)
def test_every_long_command_has_quiet_and_panelled_help(command: str) -> None:
    text = _help(command)
    assert "--quiet" in text
    assert "╭─ " in text  # rich panels
    assert "``" not in text  # a docstring's literal reads `x`
    assert "<bool>" not in text  # a switch takes no value


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param("nlagg sim --op m", ["max", "min", "median"], id="op"),
        pytest.param("nlagg tune --op tr", ["trimmed-mean"], id="tune-op"),
        pytest.param("nlagg testbed --graph e", ["erdos-renyi"], id="graph"),
        pytest.param("nlagg sim --init from", ["from-above", "from-below"], id="init"),
        pytest.param("nlagg deploy plan --stop-rule ", ["certificate", "tolerance"], id="stop-rule"),
        pytest.param("nlagg testbed --broker-kind ", ["auto", "mosquitto", "amqtt"], id="broker-kind"),
        pytest.param("nlagg sim --init-channel s", ["sealed"], id="init-channel"),
        pytest.param("nlagg node --leave-by k", ["kill"], id="leave-by"),
        pytest.param("nlagg experiment nmi", ["nmi-max", "nmi-median"], id="experiment"),
    ],
)
def test_the_shell_completes_option_values(words: str, expected: list[str]) -> None:
    _register()
    env = {
        "_NLAGG_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split(" ")) - 1),
    }
    result = runner.invoke(app, [], env=env, prog_name="nlagg")
    assert result.output.split() == expected


def test_completed_values_are_the_ones_the_config_accepts() -> None:
    from typing import get_args

    from nlagg_node.config import InitName, Operator, StopRule, ValueDist
    from nlagg_node.defaults import OPERATORS
    from nlagg_node.graphs import GraphKind
    from nlagg_node.options.opt import GRAPHS, INITS, STOP_RULES, VALUE_DISTRIBUTIONS

    pairs = [(OPERATORS, Operator), (GRAPHS, GraphKind), (INITS, InitName), (STOP_RULES, StopRule)]
    pairs.append((VALUE_DISTRIBUTIONS, ValueDist))
    for choices, literal in pairs:
        assert set(choices) == set(get_args(literal))


# 7. sim counts what corrupted nodes give away -------------------------------------------------------


def test_sim_determined_counts_the_corrupted_nodes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["sim", "--op", "average", "--n", "3", "--graph", "complete", "--trials", "4", "--json"]
    code, out, _ = run_cli(base, capsys, monkeypatch)
    assert code == 0
    honest = json.loads(out)
    # Corrupting 0 and 1 leaves node 2 alone in its honest component: the average phase's sum gives it.
    code, out, _ = run_cli([*base, "--corrupt", "0,1"], capsys, monkeypatch)
    assert code == 0
    corrupted = json.loads(out)
    assert honest["corrupted"] == []
    assert min(honest["determined_probability"]) < 1.0
    assert corrupted["corrupted"] == [0, 1]
    assert corrupted["determined_probability"] == [1.0, 1.0, 1.0]
    assert corrupted["determined_mean"] == 3.0
