"""Every command given a hostile file answers with one line naming it and exit code 2, never a
traceback; ``nlagg attack`` never writes to the transcript it reads."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from adversary.simulated import write_sim_transcript
from nlagg_node.cli import main
from nlagg_node.config import RunConfig
from nlagg_node.sim import simulate


def _random_bytes(p: Path) -> None:
    data = np.random.default_rng(11).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    p.write_bytes(b"\xff\xfe" + data)  # starts with bytes no UTF-8 text has


def _json(p: Path) -> None:
    p.write_text('{"a": [1, 2], "b": null}\n')


def _empty_sqlite(p: Path) -> None:
    db = sqlite3.connect(p)
    db.execute("PRAGMA user_version = 7")  # writes the header: a valid, table-less SQLite file
    db.commit()
    db.close()


def _foreign_sqlite(p: Path) -> None:
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)")
    db.commit()
    db.close()


def _non_utf8_toml(p: Path) -> None:
    p.write_bytes(b'op = "m\xe4x"\nn = 5\n')  # Latin-1, not UTF-8


def _directory(p: Path) -> None:
    p.mkdir()


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _unreadable(p: Path) -> None:
    _json(p)
    os.chmod(p, 0)


HOSTILE: dict[str, Callable[[Path], None]] = {
    "random-bytes": _random_bytes,
    "json": _json,
    "empty-sqlite": _empty_sqlite,
    "foreign-sqlite": _foreign_sqlite,
    "non-utf8-toml": _non_utf8_toml,
    "directory": _directory,
    "empty-file": _empty,
    "unreadable": _unreadable,
}

DEAD = ["--broker", "mqtt://127.0.0.1:9"]  # nothing listens: a command that got this far would fail
DEAD_TLS = ["--broker", "mqtts://127.0.0.1:9"]

# (id, argv with {f} for the hostile path, hostile kinds that are valid input there)
COMMANDS: list[tuple[str, list[str], set[str]]] = [
    ("sim-config", ["sim", "--config", "{f}"], set()),
    ("sim-graph-file", ["sim", "--graph-file", "{f}", "--n", "4", "--trials", "2"], set()),
    ("sim-values-file", ["sim", "--values-file", "{f}", "--n", "4", "--trials", "2", "--t-max", "5"], set()),
    ("sim-transcript-out", ["sim", "--trials", "2", "--t-max", "5", "--transcript", "{f}"], {"directory"}),
    ("testbed-config", ["testbed", "--config", "{f}", *DEAD], set()),
    ("testbed-graph-file", ["testbed", "--graph-file", "{f}", "--n", "4", *DEAD], set()),
    ("testbed-values-file", ["testbed", "--values-file", "{f}", "--n", "4", *DEAD], set()),
    ("testbed-ca-file", ["testbed", "--n", "4", "--ca-file", "{f}", *DEAD_TLS], set()),
    ("testbed-out", ["testbed", "--n", "4", "--out", "{f}", *DEAD], {"directory"}),
    ("node-config", ["node", "--id", "0", "--config", "{f}", "--value", "1", *DEAD], set()),
    ("node-value-file", ["node", "--id", "0", "--config", "{cfg}", "--value-file", "{f}", *DEAD], set()),
    (
        "node-seed-file",
        ["node", "--id", "0", "--config", "{cfg}", "--value", "1", "--seed-file", "{f}", *DEAD],
        set(),
    ),
    (
        "node-password-file",
        ["node", "--id", "0", "--config", "{cfg}", "--value", "1", "--password-file", "{f}", *DEAD],
        {"json", "empty-file", "empty-sqlite", "foreign-sqlite"},  # any text can be a password
    ),
    ("eavesdrop-config", ["eavesdrop", "--run-id", "r", "--config", "{f}", *DEAD], set()),
    (
        "eavesdrop-transcript",
        ["eavesdrop", "--run-id", "r", "--transcript", "{f}", *DEAD],
        {"empty-sqlite", "empty-file"},  # a new transcript may be written there
    ),
    ("eavesdrop-ca-file", ["eavesdrop", "--run-id", "r", "--ca-file", "{f}", *DEAD_TLS], set()),
    ("attack", ["attack", "{f}"], set()),
    ("attack-truth", ["attack", "{good}", "--truth", "{f}"], set()),
    ("report", ["report", "{f}"], set()),
    ("report-transcript", ["report", "{run}"], set()),
    ("dashboard", ["dashboard", "{f}", "--port", "0"], set()),
    (
        "tune-graph-file",
        ["tune", "--graph-file", "{f}", "--n", "4", "--trials", "2", "--out", "{tmp}/t.toml"],
        set(),
    ),
    ("experiment-out", ["experiment", "min", "--trials", "10", "--out", "{f}"], {"directory"}),
    ("plan-out", ["deploy", "plan", "--run-id", "r", "--n", "4", "--out", "{f}"], {"directory"}),
    ("plan-graph", ["deploy", "plan", "--run-id", "r", "--out", "{tmp}/p", "--graph-file", "{f}"], set()),
    (
        "plan-sites-file",
        ["deploy", "plan", "--run-id", "r", "--n", "4", "--out", "{tmp}/p", "--sites-file", "{f}"],
        set(),
    ),
    ("compose", ["deploy", "compose", "--plan", "{f}"], set()),
    ("bundle", ["deploy", "bundle", "--plan", "{f}", "--node", "0", "--out", "{tmp}/b.tgz"], set()),
    ("truth", ["deploy", "truth", "--plan", "{f}", "--out", "{tmp}/s.json"], set()),
    ("deploy-node", ["deploy", "node", "{f}", "--dry-run"], set()),
    ("publish-config", ["deploy", "publish-config", "--config", "{f}", "--password-file", "{pw}"], set()),
    (
        "publish-password",
        ["deploy", "publish-config", "--config", "{cfg}", "--password-file", "{f}", *DEAD],
        {"json", "empty-file", "empty-sqlite", "foreign-sqlite"},
    ),
]

CASES = [
    pytest.param(argv, kind, id=f"{name}-{kind}")
    for name, argv, valid in COMMANDS
    for kind in HOSTILE
    if kind not in valid
]


@pytest.fixture(scope="module")
def good_transcript(tmp_path_factory: pytest.TempPathFactory) -> Path:
    res = simulate(RunConfig(op="max", n=6, graph="ring", trials=1, t_max=200, record="all", seed=3))
    return write_sim_transcript(res, tmp_path_factory.mktemp("good") / "t.sqlite", run_id="good")


@pytest.mark.parametrize(("argv", "kind"), CASES)
def test_hostile_file_gives_one_line_and_exit_2(
    argv: list[str],
    kind: str,
    good_transcript: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file: permissions cannot be tested")
    hostile = tmp_path / ("hostile.sqlite" if "sqlite" in kind else "hostile.toml")
    run = tmp_path / "run"
    run.mkdir()
    if argv[:2] == ["report", "{run}"]:
        hostile = run / "transcript.sqlite"
        (run / "summary.json").write_text('{"run_id": "good", "private_values": {}}')
    HOSTILE[kind](hostile)
    cfg = tmp_path / "run.toml"
    cfg.write_text('[run]\nop = "max"\nn = 4\ngraph = "ring"\n[network]\nrun_id = "r"\n')
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    fill = {"f": hostile, "cfg": cfg, "good": good_transcript, "run": run, "tmp": tmp_path, "pw": pw}
    args = [a.format(**fill) for a in argv]
    monkeypatch.setattr("sys.argv", ["nlagg", *args])
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        if kind == "unreadable":
            os.chmod(hostile, 0o600)
    out, err = capsys.readouterr()
    assert exc.value.code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nlagg: error: ")
    assert hostile.name in lines[0] or hostile.parent.name in lines[0]


def test_no_traceback_from_the_console_script(tmp_path: Path) -> None:
    """The same through a real process: what a user sees on the terminal."""
    bad = tmp_path / "bad.toml"
    _non_utf8_toml(bad)
    junk = tmp_path / "junk.sqlite"
    _random_bytes(junk)
    for args in (["sim", "--config", str(bad)], ["attack", str(junk)]):
        proc = subprocess.run(
            [sys.executable, "-m", "nlagg_node", *args], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("live", [False, True], ids=["closed", "writer-attached"])
def test_attack_never_writes_its_transcript(
    live: bool,
    good_transcript: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sha256 of the transcript unchanged, no file created beside it, even while a writer holds it."""
    path = tmp_path / "t.sqlite"
    path.write_bytes(good_transcript.read_bytes())
    writer = None
    if live:
        writer = sqlite3.connect(path)
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("SELECT COUNT(*) FROM messages").fetchone()
    before = {p.name: _digest(p) for p in tmp_path.iterdir()}
    monkeypatch.setattr("sys.argv", ["nlagg", "attack", str(path), "--json"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 0, capsys.readouterr().err
    assert '"exposed"' in capsys.readouterr().out
    assert _digest(path) == before["t.sqlite"]
    if writer is None:
        assert {p.name: _digest(p) for p in tmp_path.iterdir()} == before
    else:
        writer.close()


@pytest.mark.parametrize("kind", ["empty-sqlite", "foreign-sqlite"])
def test_attack_leaves_a_foreign_sqlite_file_as_it_was(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No table created, no switch to WAL: the file is byte for byte what it was."""
    path = tmp_path / "other.sqlite"
    HOSTILE[kind](path)
    before = _digest(path)
    monkeypatch.setattr("sys.argv", ["nlagg", "attack", str(path)])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert "not an nlagg transcript" in capsys.readouterr().err
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "delete"
