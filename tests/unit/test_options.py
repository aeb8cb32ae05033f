"""One declaration per run option: the commands, the argv builders, the node files and the plan spec
agree with it (command line -> options -> argv -> options is the identity), and the CLI niceties."""

from __future__ import annotations

import io
import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nlagg_node.cli import _register, app, main
from nlagg_node.cli._command import parse_command
from nlagg_node.options import (
    ComposeOptions,
    EavesdropOptions,
    NodeOptions,
    PlanOptions,
    SimOptions,
    TestbedOptions,
    to_argv,
)

ROUND_TRIPS = [
    pytest.param(
        ["sim"],
        SimOptions,
        "--op median --n 9 --graph ring --trials 7 --t-max 300 --c 2.5 --value-range -1 4 --no-early-stop"
        " --corrupt 0,3 --transcript t.sqlite --json --quiet --force --record all --depart 2@40",
        id="sim",
    ),
    pytest.param(
        ["testbed"],
        TestbedOptions,
        "--n 5 --corrupt-count 2 --processes --may-depart --neighbour-timeout 9.5 --broker-kind amqtt"
        " --run-id tb-1 --out o -v --init-channel sealed",
        id="testbed",
    ),
    pytest.param(
        ["deploy", "plan"],
        PlanOptions,
        "--out p --run-id r1 --n 6 --value-cmd 'echo 3' --tls --sites 2 --site-broker mqtt://a:1"
        " --site-broker mqtt://b:2 --no-may-depart --replay",
        id="plan",
    ),
    pytest.param(
        ["deploy", "compose"],
        ComposeOptions,
        "--out c --n 4 --value 1.5 --corrupt 1 --plan-dir x",
        id="compose",
    ),
    pytest.param(
        ["node"],
        NodeOptions,
        "--id 3 --config run.toml --value-file v.txt --corrupt --leave-after 5 --leave-by kill --state-dir s"
        " --json --departure-timeout 2.0",
        id="node",
    ),
    pytest.param(
        ["eavesdrop"],
        EavesdropOptions,
        "--run-id r --broker mqtt://a:1 --broker mqtt://b:2 --no-live --events --broker-cluster"
        " --timeout 30.0",
        id="eavesdrop",
    ),
]


@pytest.mark.parametrize(("path", "cls", "line"), ROUND_TRIPS)
def test_command_line_to_options_to_argv_and_back(path: list[str], cls: type[Any], line: str) -> None:
    _register()
    args = shlex.split(line)
    opts = parse_command(app, path, cls, args)
    assert opts != parse_command(app, path, cls, _required(args))  # the options were read
    again = parse_command(app, path, cls, to_argv(opts))
    assert again == opts


def _required(args: list[str]) -> list[str]:
    """Only the options a command requires (run id, out, id, config), at the values of ``args``."""
    keep = {"--out", "--run-id", "--id", "--config"}
    return [word for flag, value in itertools.pairwise(args) if flag in keep for word in (flag, value)]


def test_node_argv_is_what_the_node_command_parses() -> None:
    from nlagg_node.argv import node_argv

    _register()
    argv = node_argv(
        2, "run.toml", "mqtts://h:8883", value=-0.5, ca_file="ca.pem", as_json=True, corrupt=True
    )
    assert argv[:2] == ["nlagg", "node"]
    opts = parse_command(app, ["node"], NodeOptions, argv[2:])
    assert opts == NodeOptions(
        id=2,
        config="run.toml",
        broker="mqtts://h:8883",
        value=-0.5,
        ca_file="ca.pem",
        as_json=True,
        corrupt=True,
    )


def test_a_node_file_starts_the_node_it_describes(tmp_path: Path) -> None:
    from nlagg_node.config import load_config
    from nlagg_node.deploy import PlanSpec, build_plan, load_node_file, write_plan
    from nlagg_node.deploy.nodefile import node_file_argv, node_file_options

    run = load_config(None, n=5, graph="ring")
    write_plan(build_plan(PlanSpec(run=run, run_id="r1", seed=3, corrupt="4", replay=True)), tmp_path / "p")
    node = load_node_file(tmp_path / "p" / "nodes" / "4.toml")
    _register()
    parsed = parse_command(app, ["node"], NodeOptions, node_file_argv(node)[2:])
    assert parsed == node_file_options(node)
    assert (parsed.id, parsed.corrupt, parsed.seed, parsed.value_file) == (4, True, 3, "values/4.txt")


def test_plan_spec_comes_from_the_plan_options() -> None:
    from nlagg_node.deploy import plan_spec

    _register()
    opts = parse_command(app, ["deploy", "plan"], PlanOptions, ["--out", "p", "--run-id", "r", "--n", "4"])
    spec = plan_spec(opts, "mqtt://b:1883")
    assert (spec.run.n, spec.run.op, spec.run_id, spec.broker_url) == (4, "max", "r", "mqtt://b:1883")
    assert (spec.run.early_stop, spec.run.may_depart) == (True, True)  # devices may leave: the plan's default


def _help(*command: str) -> str:
    _register()
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(
    "command", [("sim",), ("testbed",), ("deploy", "plan"), ("deploy", "compose")], ids=lambda c: "-".join(c)
)
def test_long_help_is_grouped_in_panels(command: tuple[str, ...]) -> None:
    text = _help(*command)
    for panel in ("Graph", "Protocol", "Stopping", "Values", "Adversary", "Output"):
        assert f"─ {panel} ─" in text, panel


def test_shell_completion_is_installable() -> None:
    assert "--install-completion" in _help()


def test_help_sends_nobody_to_the_readme() -> None:
    for command in (("sim",), ("testbed",), ("deploy", "plan"), ("node",), ("deploy", "compose")):
        assert "README" not in _help(*command)


def test_the_cli_reference_page_is_current() -> None:
    from nlagg_node.cli.reference import cli_reference

    page = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    assert page.read_text(encoding="utf-8") == cli_reference(), (
        "docs/cli.md is stale: python -m nlagg_node.cli.reference > docs/cli.md"
    )


class _Terminal(io.StringIO):
    """Standard output that says it is a terminal (rich colours only a terminal)."""

    def isatty(self) -> bool:
        return True


COLOUR = re.compile(r"\x1b\[(?:\d+;)*(?:3\d|9\d)(?:;\d+)*m")  # a foreground colour, not bold


@pytest.mark.parametrize(("no_color", "coloured"), [(False, True), (True, False)], ids=["tty", "NO_COLOR"])
def test_results_honour_no_color(no_color: bool, coloured: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    out = _Terminal()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.argv", ["nlagg", "sim", "--n", "4", "--trials", "2", "--t-max", "20"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0
    assert "leakage probability" in out.getvalue()
    assert bool(COLOUR.search(out.getvalue())) == coloured
