"""The command line against a broker that is not there: one line naming it (the rest of the command line
in-process: tests/unit/test_cli_sim.py)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from tests.harness.cli import run_cli


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["eavesdrop", "--run-id", "r", "--timeout", "1"],
            "cannot connect to broker {url} after [0-9]+ tries: .*; no connection within 1 s$",
        ),
        (["node", "--id", "0", "--value", "0.5"], "cannot connect to broker {url} after 10 tries: "),
    ],
    ids=["eavesdrop-timeout", "node-gives-up"],
)
def test_an_unreachable_broker_is_one_line_naming_it(
    command: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"mqtt://127.0.0.1:{port}"
    cfg = tmp_path / "run.toml"
    cfg.write_text('[run]\nop = "max"\nn = 3\ngraph = "ring"\n[network]\nrun_id = "r"\n')
    where = (
        ["--transcript", str(tmp_path / "t.sqlite")] if command[0] == "eavesdrop" else ["--config", str(cfg)]
    )
    code, _, err = run_cli([*command, "--broker", url, *where], capsys, monkeypatch)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith("nlagg: error: ")
    assert re.search(expected.format(url=re.escape(url)), line), line
