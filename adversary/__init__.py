"""The passive adversary: eavesdropper capture, transcript attack and leakage measurement.

The analysis API is re-exported lazily (importing :mod:`adversary` loads neither numba nor
matplotlib; the first use of a name imports its module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .attack import AttackReport, NodeFinding, attack_arrays, attack_transcript, score
    from .bounds import IdealBound, ideal_leakage
    from .experiments import EXPERIMENTS, run_all, run_experiment
    from .mi import (
        leakage_probability,
        mse_curve,
        mutual_information,
        mutual_information_batch,
        nmi_curves,
        nmi_with_bootstrap,
        self_information,
    )
    from .report import render_testbed_report
    from .simulated import attack_simulation, simulate_transcript, write_sim_transcript

_EXPORTS = {
    "EXPERIMENTS": "experiments",
    "AttackReport": "attack",
    "IdealBound": "bounds",
    "NodeFinding": "attack",
    "attack_arrays": "attack",
    "attack_simulation": "simulated",
    "attack_transcript": "attack",
    "ideal_leakage": "bounds",
    "leakage_probability": "mi",
    "mse_curve": "mi",
    "mutual_information": "mi",
    "mutual_information_batch": "mi",
    "nmi_curves": "mi",
    "nmi_with_bootstrap": "mi",
    "render_testbed_report": "report",
    "run_all": "experiments",
    "run_experiment": "experiments",
    "score": "attack",
    "simulate_transcript": "simulated",
    "self_information": "mi",
    "write_sim_transcript": "simulated",
}

__all__ = [
    "EXPERIMENTS",
    "AttackReport",
    "IdealBound",
    "NodeFinding",
    "attack_arrays",
    "attack_simulation",
    "attack_transcript",
    "ideal_leakage",
    "leakage_probability",
    "mse_curve",
    "mutual_information",
    "mutual_information_batch",
    "nmi_curves",
    "nmi_with_bootstrap",
    "render_testbed_report",
    "run_all",
    "run_experiment",
    "score",
    "self_information",
    "simulate_transcript",
    "write_sim_transcript",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'adversary' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
