"""nlagg: private distributed nonlinear aggregation (PDMM max/min/top-K/median/quantile/trimmed mean)."""

from .config import OPERATORS, RunConfig, load_config
from .errors import ConfigError, NlaggError
from .graphs import EdgeLayout, GraphSpec, load_edge_list, normalize_edges
from .init import DualInitSpec, draw_z0, perturb_value
from .pdmm import Objective, dual_sum, linear_branch, paper_q, x_update, z_update
from .rng import rng_for
from .schedule import Phase, plan_phases, true_aggregate
from .sim import SimResult, simulate

__all__ = [
    "OPERATORS",
    "ConfigError",
    "DualInitSpec",
    "EdgeLayout",
    "GraphSpec",
    "NlaggError",
    "Objective",
    "Phase",
    "RunConfig",
    "SimResult",
    "draw_z0",
    "dual_sum",
    "linear_branch",
    "load_config",
    "load_edge_list",
    "normalize_edges",
    "paper_q",
    "perturb_value",
    "plan_phases",
    "rng_for",
    "simulate",
    "true_aggregate",
    "x_update",
    "z_update",
]
