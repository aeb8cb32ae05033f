"""The passive adversary: eavesdropper capture, transcript attack and leakage measurement.

The analysis API is re-exported lazily: importing :mod:`adversary` loads neither numba nor
matplotlib; the first use of a name imports its module. The names are listed once, in the
``TYPE_CHECKING`` block below (see :mod:`nlagg_node.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlagg_node.lazy import lazy_exports

if TYPE_CHECKING:
    from .analysis.experiments import EXPERIMENTS as EXPERIMENTS
    from .analysis.experiments import run_all as run_all
    from .analysis.experiments import run_experiment as run_experiment
    from .analysis.mi import leakage_probability as leakage_probability
    from .analysis.mi import mse_curve as mse_curve
    from .analysis.mi import mutual_information as mutual_information
    from .analysis.mi import mutual_information_batch as mutual_information_batch
    from .analysis.mi import mutual_information_many as mutual_information_many
    from .analysis.mi import nmi_curves as nmi_curves
    from .analysis.mi import nmi_with_bootstrap as nmi_with_bootstrap
    from .analysis.mi import self_information as self_information
    from .attack import AttackReport as AttackReport
    from .attack import Halted as Halted
    from .attack import NodeFinding as NodeFinding
    from .attack import attack_arrays as attack_arrays
    from .attack import attack_transcript as attack_transcript
    from .attack import score as score
    from .bounds import IdealBound as IdealBound
    from .bounds import ideal_leakage as ideal_leakage
    from .epochs import EpochsReport as EpochsReport
    from .epochs import attack_epochs as attack_epochs
    from .epochs import combine_intervals as combine_intervals
    from .report import render_testbed_report as render_testbed_report
    from .simulated import attack_simulation as attack_simulation
    from .simulated import simulate_transcript as simulate_transcript
    from .simulated import write_sim_transcript as write_sim_transcript

__all__, __getattr__ = lazy_exports(__name__, __file__)
