"""Figures of the experiments and of a testbed run (matplotlib, Agg): PNG for pages, PDF for print.

Lines are coloured by rank group, not by 15 shades nobody can tell apart: the ranks whose value
the output reveals (NMI bound ~1: the maximizer for max, the median holder, ...) in red, the ranks
next to them (within :data:`NEAR` ranks) in orange, the rest in blue. Where no rank is revealed
(average consensus) a labelled colorbar maps colour to rank. Labels are mathtext, panels state
their (c, mu_z).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..analysis.panels import Experiment, PanelResult
from .figure import pyplot, rank_colors

MSE_FLOOR = 1e-20
NEAR = 2
"""Ranks at most this far from an output rank form the "near" group."""
REVEALED = 0.9
"""An ideal NMI bound at least this high marks a rank whose value the output reveals."""

FONT = 8.5
X_LABEL = r"iteration $t$"
NMI_LABEL = r"NMI  $I(S_i; X_i^{(t)})\,/\,I(S_i; S_i)$"
X_TRAJ_LABEL = r"$x_i^{(t)}$"
_GROUP_STYLE = {
    "output": {"color": "#d62728", "lw": 1.8, "alpha": 1.0, "zorder": 4},
    "near": {"color": "#ff7f0e", "lw": 1.1, "alpha": 0.9, "zorder": 3},
    "far": {"color": "#1f77b4", "lw": 0.7, "alpha": 0.55, "zorder": 2},
}


def _pyplot() -> Any:
    plt = pyplot()
    plt.rcParams.update({"font.size": FONT, "legend.fontsize": FONT - 0.5, "axes.titlesize": FONT + 0.5})
    return plt


@dataclass(frozen=True)
class RankGroup:
    """Ranks drawn alike, with the legend text of the group."""

    name: str  # output, near or far
    ranks: list[int]

    @property
    def style(self) -> dict[str, Any]:
        return _GROUP_STYLE[self.name]

    def label(self, leak: NDArray[np.float64] | None = None) -> str:
        what = {"output": "the output", "near": "next to it", "far": "far from it"}[self.name]
        text = f"{_span(self.ranks)}: {what}"
        if leak is not None and len(self.ranks):
            worst = float(np.nanmax(leak[self.ranks]))
            text += f" (leak prob. {'= ' if len(self.ranks) == 1 else '<= '}{worst:.3f})"
        return text


def _span(ranks: Sequence[int]) -> str:
    """``rank 0``, ``ranks 1-2``, ``ranks 0, 13-14``."""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def rank_groups(bound: NDArray[np.float64]) -> list[RankGroup] | None:
    """Output / near / far ranks from the ideal bound per rank; None when no rank is revealed."""
    n = len(bound)
    out = [r for r in range(n) if np.isfinite(bound[r]) and bound[r] >= REVEALED]
    if not out:
        return None
    near = [r for r in range(n) if r not in out and min(abs(r - o) for o in out) <= NEAR]
    far = [r for r in range(n) if r not in out and r not in near]
    named = (("output", out), ("near", near), ("far", far))
    return [RankGroup(name, ranks) for name, ranks in named if ranks]


def _colorbar(ax: Any, n: int) -> None:
    plt = _pyplot()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    bar = plt.colorbar(ScalarMappable(Normalize(0, n - 1), "viridis"), ax=ax, pad=0.02, fraction=0.05)
    bar.set_label("rank (0 = largest value)")


def tex(label: str) -> str:
    """A panel label with its parameters in mathtext (``mu_z`` -> $\\mu_z$, ``c = 1`` -> $c$ = 1)."""
    label = re.sub(r"\b(mu|sigma)_([zs])\b", lambda m: f"$\\{m.group(1)}_{m.group(2)}$", label)
    return re.sub(r"(?<![\w$])c\b(?=\s*[=,)])", "$c$", label)


def params_line(config: dict[str, Any]) -> str:
    """``($c$ = 100, $\\mu_z$ = 300)``: what a panel ran with."""
    return f"($c$ = {float(config['c']):g}, $\\mu_z$ = {float(config['mu_z']):g})"


def _lines(
    ax: Any, t: Any, ys: NDArray[np.float64], bound: NDArray[np.float64], leak: NDArray[np.float64] | None
) -> list[RankGroup] | None:
    """One line per rank (columns of ``ys``), coloured by group; legend handles on the first of each."""
    groups = rank_groups(bound)
    n = ys.shape[1]
    if groups is None:
        colors = rank_colors(n)
        for r in range(n):
            ax.plot(t, ys[:, r], color=colors[r], lw=0.9)
        _colorbar(ax, n)
        return None
    for g in groups:
        for k, r in enumerate(g.ranks):
            ax.plot(t, ys[:, r], label=g.label(leak) if k == 0 else None, **g.style)
    return groups


def draw_nmi(ax: Any, res: PanelResult, title: str, *, legend: bool = True) -> None:
    """NMI against iteration per rank, coloured by rank group, leakage probability in the legend.

    The ideal-world bound of each rank is marked by a triangle at the right edge; bootstrap
    bands, when measured, are shaded.
    """
    t = np.asarray(res.recorded_t)
    groups = _lines(ax, t, res.nmi, res.bound, res.leak)
    if res.nmi_lower is not None and res.nmi_upper is not None:
        for r in range(res.nmi.shape[1]):
            ax.fill_between(t, res.nmi_lower[:, r], res.nmi_upper[:, r], color="grey", alpha=0.12, lw=0)
    t_end = float(t[-1]) if len(t) else 1.0
    finite = np.flatnonzero(np.isfinite(res.bound))
    ax.scatter(
        np.full(len(finite), t_end * 1.02),
        res.bound[finite],
        marker="<",
        s=18,
        color="black",
        clip_on=False,
        zorder=5,
        label="ideal-world bound" if groups is not None else None,
    )
    ax.set_xlim(0, t_end * 1.04)
    ax.set_ylim(-0.05, 1.08)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(NMI_LABEL)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if legend and groups is not None:
        ax.legend(loc="best", framealpha=0.9)


def _ylim_with_start(ax: Any, x: NDArray[np.float64]) -> None:
    """Limits from the 1-99 % range of x, widened to keep the start (x^(0), near mu_z / c)."""
    finite = x[np.isfinite(x)]
    if not finite.size:
        return
    lo, hi = (float(v) for v in np.percentile(finite, [1, 99]))
    start = x[:, 0] if x.ndim == 2 and x.shape[1] else np.array([])
    start = start[np.isfinite(start)]
    if start.size:
        lo, hi = min(lo, float(start.min())), max(hi, float(start.max()))
    pad = 0.08 * max(hi - lo, 1e-3)
    ax.set_ylim(lo - pad, hi + pad)


def draw_trajectory(ax: Any, res: PanelResult, title: str) -> None:
    """x_i^(t) of the first trial per rank, coloured by rank group, phase boundaries dashed."""
    t = np.asarray(res.recorded_t)
    groups = _lines(ax, t, res.trajectory, res.bound, None)
    for end in res.phase_ends[:-1]:
        ax.axvline(end + 0.5, color="grey", ls="--", lw=0.7)
    _ylim_with_start(ax, res.trajectory.T)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(X_TRAJ_LABEL + " (trial 0)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if groups is not None:
        ax.legend(loc="best", framealpha=0.9)


def draw_mse(ax: Any, results: Sequence[PanelResult], names: Sequence[str], title: str) -> None:
    """MSE against iteration, one line per approach (floored at 1e-20 for the log axis)."""
    for res, name in zip(results, names, strict=True):
        ax.semilogy(
            res.recorded_t,
            np.maximum(res.mse, MSE_FLOOR),
            lw=1.3,
            label=f"{tex(name)} (final {res.final_mse:.2g})",
        )
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel("MSE")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend()


def draw_experiment(exp: Experiment, results: Sequence[PanelResult], out: Path) -> list[Path]:
    """Draw one experiment's figure; return the PNG and PDF paths."""
    plt = _pyplot()
    panels = exp.panels
    if exp.kind == "mse":
        labels = list(dict.fromkeys(p.label for p in panels))
        fig, axes = plt.subplots(1, len(labels), figsize=(5.6 * len(labels), 4.0), squeeze=False)
        for ax, label in zip(axes[0], labels, strict=True):
            idx = [k for k, p in enumerate(panels) if p.label == label]
            proposed = results[idx[0]].config
            draw_mse(
                ax,
                [results[k] for k in idx],
                [panels[k].series for k in idx],
                f"{label} consensus, proposed {params_line(proposed)}",
            )
    elif exp.kind == "trajectory+nmi":
        res = results[0]
        fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.4), squeeze=False)
        head = f"{tex(panels[0].label)} {params_line(res.config)}"
        draw_trajectory(axes[0][0], res, f"(a) {head}: trajectories")
        draw_nmi(axes[0][1], res, f"(b) {head}: NMI per rank")
    else:
        cols = 2 if len(panels) <= 4 else 3
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
        for k, (panel, res) in enumerate(zip(panels, results, strict=True)):
            title = f"({chr(97 + k)}) {tex(panel.label)}"
            if not re.search(r"\bc = ", panel.label):  # the label does not already say them
                title += f"\n{params_line(res.config)}"
            draw_nmi(axes[k // cols][k % cols], res, title)
        for k in range(len(panels), rows * cols):
            axes[k // cols][k % cols].axis("off")
    fig.suptitle(tex(exp.title), fontsize=FONT + 3)
    fig.tight_layout()
    files = [out / f"{exp.name}.png", out / f"{exp.name}.pdf"]
    fig.savefig(files[0], dpi=110)
    fig.savefig(files[1])
    plt.close(fig)
    return files


def draw_testbed(
    path_png: Path,
    x: NDArray[np.float64],
    rank: NDArray[np.int64],
    bound: NDArray[np.float64],
    exposed: Sequence[tuple[int, int]],
    title: str,
) -> list[Path]:
    """The report figure of one run: x_i^(t) per node coloured by its value's rank group,
    exposures (node, t) marked; writes the PNG and a PDF beside it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10.5, 4.6))
    t = np.arange(x.shape[1])
    by_rank = np.full_like(x, np.nan)
    by_rank[rank] = x  # row r holds the node of rank r
    groups = _lines(ax, t, by_rank.T, bound, None)
    for node, when in exposed:
        ax.plot([when], [x[node, when]], "kx", ms=8, mew=1.8, zorder=6)
    if exposed:
        ax.plot([], [], "kx", ms=8, mew=1.8, label=r"value exposed ($x_i^{(t)} = s_i$)")
    _ylim_with_start(ax, x)
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(X_TRAJ_LABEL + " as captured")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if groups is not None or exposed:
        ax.legend(loc="best", framealpha=0.9)
    fig.tight_layout()
    files = [path_png, path_png.with_suffix(".pdf")]
    fig.savefig(files[0], dpi=110)
    fig.savefig(files[1])
    plt.close(fig)
    return files
