"""Transcripts for the tests that read them: a simulated run's, and what a captured one holds."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.wire import split_x_batch

__all__ = ["captured_by_kind", "finished_max_run", "x_payloads"]


def x_payloads(
    topic: str, payload: bytes, run: str, prefix: str = "nlagg"
) -> dict[tuple[int, int], bytes] | None:
    """The x payloads one published message carries, by ``(node, t)``: a host's batch's items, each as
    its node would publish it alone, or a lone x; None: the message carries no x."""
    batch = split_x_batch(topic, payload, prefix, run)
    if batch is not None:
        return {(item.msg.node, item.msg.t): item.payload for item in batch[0]}
    if topic.endswith("/x"):
        doc = json.loads(payload)
        return {(doc["node"], doc["t"]): payload}
    return None


def finished_max_run(folder: Path) -> Path:
    """A finished max run on 8 nodes, node 0 corrupted, as a transcript (no ground truth beside it)."""
    path = folder / "max.sqlite"
    simulate_transcript(RunConfig(op="max", n=8, t_max=400, seed=3), path, corrupted=[0])
    path.with_name(path.name + ".truth.json").unlink()
    return path


def captured_by_kind(db: Path) -> tuple[dict[str, int], dict[int, list[str]], list[tuple[str, str]]]:
    """Valid rows per kind, every node's captured status states in order, and every invalid row."""
    with Transcript(db) as tr:
        invalid = tr.rejected()
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        kinds = dict(
            con.execute("SELECT kind, COUNT(*) FROM messages WHERE valid = 1 GROUP BY kind").fetchall()
        )
        states: dict[int, list[str]] = {}
        for node, state in con.execute(
            "SELECT node, phase FROM messages WHERE valid = 1 AND kind = 'status' ORDER BY id"
        ):
            states.setdefault(int(node), []).append(str(state))
    return {str(k): int(v) for k, v in kinds.items()}, states, invalid
