"""Transcripts of simulated runs for the tests that read them (the dashboard's model and server)."""

from __future__ import annotations

from pathlib import Path

from adversary.simulated import simulate_transcript
from nlagg_node.config import RunConfig

__all__ = ["finished_max_run"]


def finished_max_run(folder: Path) -> Path:
    """A finished max run on 8 nodes, node 0 corrupted, as a transcript (no ground truth beside it)."""
    path = folder / "max.sqlite"
    simulate_transcript(RunConfig(op="max", n=8, t_max=400, seed=3), path, corrupted=[0])
    path.with_name(path.name + ".truth.json").unlink()
    return path
