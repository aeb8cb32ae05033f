"""Matplotlib for every figure nlagg draws: the headless Agg backend and the per-rank colours.

Shared by the experiment figures (:mod:`adversary.reporting.plots`) and the testbed report
(:mod:`adversary.report`). Matplotlib is imported on the first call, not with this module.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pyplot", "rank_colors"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def rank_colors(n: int) -> list[Any]:
    """One viridis colour per rank 0..n-1 (rank 0 = largest value)."""
    cmap = pyplot().get_cmap("viridis")
    return [cmap(r / max(1, n - 1)) for r in range(n)]
