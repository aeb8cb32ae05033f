"""Figures of the experiments (matplotlib, Agg backend): PNG for the index page, PDF for print."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .figure import pyplot, rank_colors
from .panels import Experiment, PanelResult

MSE_FLOOR = 1e-20


def draw_nmi(ax: Any, res: PanelResult, title: str, *, legend: bool = True) -> None:
    """NMI against iteration, one line per rank, leakage probability in the legend.

    The ideal-world bound of each rank is marked by a triangle at the right edge; bootstrap
    bands, when measured, are shaded.
    """
    t = np.asarray(res.recorded_t)
    n = res.nmi.shape[1]
    colors = rank_colors(n)
    for r in range(n):
        ax.plot(t, res.nmi[:, r], color=colors[r], lw=1.0, label=f"{r} ({res.leak[r]:.3f})")
        if res.nmi_lower is not None and res.nmi_upper is not None:
            ax.fill_between(t, res.nmi_lower[:, r], res.nmi_upper[:, r], color=colors[r], alpha=0.15, lw=0)
    t_end = float(t[-1]) if len(t) else 1.0
    finite = np.isfinite(res.bound)
    ax.scatter(
        np.full(int(finite.sum()), t_end * 1.02),
        res.bound[finite],
        marker="<",
        s=14,
        c=[colors[r] for r in np.flatnonzero(finite)],
        clip_on=False,
        zorder=3,
    )
    ax.set_xlim(0, t_end * 1.04)
    ax.set_ylim(-0.05, 1.08)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("NMI  I(S_i; X_i^(t)) / I(S_i; S_i)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(
            title="rank (leak prob.)",
            fontsize=5.5,
            title_fontsize=6,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
        )


def draw_trajectory(ax: Any, res: PanelResult, title: str) -> None:
    """x_i^(t) of the first trial, by rank, with the phase boundaries dashed."""
    t = np.asarray(res.recorded_t)
    colors = rank_colors(res.trajectory.shape[1])
    for r in range(res.trajectory.shape[1]):
        ax.plot(t, res.trajectory[:, r], color=colors[r], lw=0.9)
    for end in res.phase_ends[:-1]:
        ax.axvline(end + 0.5, color="grey", ls="--", lw=0.7)
    finite = res.trajectory[np.isfinite(res.trajectory)]
    if finite.size:
        lo, hi = np.percentile(finite, [1, 99])
        pad = 0.1 * max(hi - lo, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("x_i^(t) (trial 0)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def draw_mse(ax: Any, results: Sequence[PanelResult], names: Sequence[str], title: str) -> None:
    """MSE against iteration, one line per approach (floored at 1e-20 for the log axis)."""
    for res, name in zip(results, names, strict=True):
        ax.semilogy(
            res.recorded_t,
            np.maximum(res.mse, MSE_FLOOR),
            lw=1.2,
            label=f"{name} (final {res.final_mse:.2g})",
        )
    ax.set_xlabel("iteration t")
    ax.set_ylabel("MSE")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)


def draw_experiment(exp: Experiment, results: Sequence[PanelResult], out: Path) -> list[Path]:
    """Draw one experiment's figure; return the PNG and PDF paths."""
    plt = pyplot()
    panels = exp.panels
    if exp.kind == "mse":
        labels = list(dict.fromkeys(p.label for p in panels))
        fig, axes = plt.subplots(1, len(labels), figsize=(5.0 * len(labels), 3.6), squeeze=False)
        for ax, label in zip(axes[0], labels, strict=True):
            idx = [k for k, p in enumerate(panels) if p.label == label]
            draw_mse(ax, [results[k] for k in idx], [panels[k].series for k in idx], f"{label} consensus")
    elif exp.kind == "trajectory+nmi":
        res = results[0]
        fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), squeeze=False)
        draw_trajectory(axes[0][0], res, f"(a) {panels[0].label}: trajectories")
        draw_nmi(axes[0][1], res, f"(b) {panels[0].label}: NMI per rank")
    else:
        cols = 2 if len(panels) <= 4 else 3
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.6 * cols, 3.6 * rows), squeeze=False)
        for k, (panel, res) in enumerate(zip(panels, results, strict=True)):
            draw_nmi(axes[k // cols][k % cols], res, f"({chr(97 + k)}) {panel.label}")
        for k in range(len(panels), rows * cols):
            axes[k // cols][k % cols].axis("off")
    fig.suptitle(exp.title, fontsize=11)
    fig.tight_layout()
    files = [out / f"{exp.name}.png", out / f"{exp.name}.pdf"]
    fig.savefig(files[0], dpi=110)
    fig.savefig(files[1])
    plt.close(fig)
    return files
