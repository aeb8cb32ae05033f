"""Epoch stores for the tests: epochs of a simulated median deployment under ``P/R``."""

from __future__ import annotations

from adversary.epochs import epoch_summary
from adversary.simulated import simulate_transcript
from adversary.transcript import EpochStore
from nlagg_node.config import RunConfig

__all__ = ["add_epoch"]


def add_epoch(store: EpochStore, k: int, *, close: bool) -> dict[str, object]:
    """Epoch k of a median deployment (n = 8) in the store; closed with its summary, or left open."""
    cfg = RunConfig(op="median", n=8, t_max=150, seed=40 + k, early_stop=False)
    simulate_transcript(cfg, store.transcript_path(k), run_id=f"e{k}", prefix="P/R")
    store.open_epoch(k)
    summary = epoch_summary(store.transcript_path(k))
    if close:
        store.close_epoch(k, summary)
    return summary
