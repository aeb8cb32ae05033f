"""Issue 33, item 6: a transcript is whole in its own file once its writer closes (even with a reader
attached), is read without creating files beside it, and an attack on a cut one says so."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from adversary.attack import attack_transcript, incomplete_note
from adversary.reporting.dashboard.state import DashboardState
from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node import load_config


def simulated(tmp_path: Path, early_stop: bool = False) -> Path:
    cfg = load_config(op="max", n=5, graph="ring", trials=1, t_max=60, seed=3, early_stop=early_stop)
    return simulate_transcript(cfg, tmp_path / "sim.sqlite", run_id="files")


def beside(path: Path) -> list[str]:
    """SQLite's files beside ``path``."""
    return sorted(p.name for p in path.parent.glob(path.name + "-*"))


def test_the_main_file_holds_everything_though_a_reader_was_attached_at_close(tmp_path: Path) -> None:
    source = simulated(tmp_path)
    with contextlib.closing(sqlite3.connect(source)) as db:
        rows = db.execute("SELECT topic, payload, retained FROM messages ORDER BY id").fetchall()
    live = tmp_path / "live" / "transcript.sqlite"
    live.parent.mkdir()
    writer = Transcript(live, run_id="files", prefix="nlagg")
    writer.set_meta("note", "captured while a dashboard reads")
    writer.commit()
    reader = Transcript.open_read_only(live)  # a dashboard, attached through the writer's close
    for topic, payload, retained in rows:
        writer.add(topic, payload, retained=bool(retained))
    writer.commit()
    assert reader.count() == len(rows)
    writer.close()
    reader.close()
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(live, copy)  # the main file alone: what is left in a -wal is lost
    with Transcript.open_read_only(copy) as alone:
        assert alone.count() == len(rows)


@pytest.mark.parametrize("reader", ["attack", "dashboard"])
def test_reading_a_finished_transcript_leaves_no_file_beside_it(tmp_path: Path, reader: str) -> None:
    path = simulated(tmp_path)
    assert beside(path) == []  # the writer left WAL mode at its close
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode = WAL")  # as a writer that could not leave it does
    assert beside(path) == []
    if reader == "attack":
        attack_transcript(path)
    else:
        state = DashboardState(path)
        assert state.run_id == "files"
        state.db.close()
    assert beside(path) == []


@pytest.mark.parametrize("early_stop", [False, True], ids=["fixed-schedule", "early-stop"])
def test_attack_says_when_the_transcript_lacks_x_the_nodes_published(
    tmp_path: Path, early_stop: bool
) -> None:
    path = simulated(tmp_path, early_stop)
    assert incomplete_note(attack_transcript(path)) is None
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM messages WHERE kind = 'x' AND t >= 20")
    note = incomplete_note(attack_transcript(path))
    assert note is not None
    assert note.startswith("transcript incomplete: 100 of ")
