"""What an experiment is made of: its panels, and the measurements of one simulated panel.

Shared by the runner (:mod:`adversary.analysis.experiments`), the figures
(:mod:`adversary.reporting.plots`) and the pages (:mod:`adversary.report`), so none of them imports
another for its types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

from nlagg_node.arrays import FloatArray

__all__ = ["Experiment", "ExperimentDoc", "Panel", "PanelDoc", "PanelResult", "PanelSummary"]


@dataclass(frozen=True)
class Panel:
    """One subplot: a label and the run-config fields that differ from the paper's setup."""

    label: str
    params: dict[str, Any]
    series: str = ""  # for MSE panels: the curve's name within the panel


@dataclass(frozen=True)
class Experiment:
    """One figure of the paper."""

    name: str
    title: str
    caption: str
    kind: str  # "nmi", "mse" or "trajectory+nmi"
    panels: tuple[Panel, ...]
    expect: str  # what the reader should see (docs/experiments.md)


class PanelSummary(TypedDict):
    """The numbers of one panel in ``<experiment>.json``: per rank, rounded to 4 digits (None: not finite)."""

    config: dict[str, Any]  # the RunConfig fields of the panel
    leakage_probability: list[float | None]
    nmi_final: list[float | None]
    nmi_peak: list[float | None]
    ideal_bound: list[float | None]
    gap_peak: list[float | None]  # peak NMI minus the ideal-world bound
    final_mse: float
    seconds: dict[str, float]  # wall time per stage


class PanelDoc(PanelSummary):
    """One panel in ``<experiment>.json``: its summary and its NMI curves."""

    label: str
    series: str
    recorded_t: list[int]
    nmi: list[list[float]]  # (R, n)
    nmi_lower: NotRequired[list[list[float]]]  # bootstrap band, with --bootstrap
    nmi_upper: NotRequired[list[list[float]]]


class ExperimentDoc(TypedDict):
    """``<experiment>.json``: what ``run_experiment`` wrote and returns."""

    experiment: str
    title: str
    caption: str
    expect: str
    trials: int
    seed: int
    panels: list[PanelDoc]
    files: list[str]
    wall_seconds: float


@dataclass
class PanelResult:
    """Measurements of one simulated configuration."""

    config: dict[str, Any]
    recorded_t: list[int]
    nmi: FloatArray  # (R, n)
    leak: FloatArray  # (n,)
    mse: FloatArray  # (R,)
    final_mse: float
    bound: FloatArray  # (n,)
    trajectory: FloatArray  # (R, n) trial 0, by rank
    phase_ends: list[int]
    seconds: dict[str, float] = field(default_factory=dict)
    nmi_lower: FloatArray | None = None  # bootstrap band, (R, n)
    nmi_upper: FloatArray | None = None

    def summary(self) -> PanelSummary:
        final = self.nmi[-1]
        peak = self.nmi.max(axis=0)
        return {
            "config": self.config,
            "leakage_probability": _round(self.leak),
            "nmi_final": _round(final),
            "nmi_peak": _round(peak),
            "ideal_bound": _round(self.bound),
            "gap_peak": _round(peak - self.bound),
            "final_mse": self.final_mse,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }


def _round(a: FloatArray) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), 4) for v in a]
