"""nlagg: private distributed nonlinear aggregation (PDMM max/min/top-K/median/quantile/trimmed mean).

The public names are re-exported lazily (:mod:`nlagg_node.lazy`): ``import nlagg_node``, and so
``nlagg --help``, loads neither pydantic, networkx nor numba; the first use of a name imports its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .config import OPERATORS as OPERATORS
    from .config import RunConfig as RunConfig
    from .config import load_config as load_config
    from .errors import ConfigError as ConfigError
    from .errors import NlaggError as NlaggError
    from .graphs import EdgeLayout as EdgeLayout
    from .graphs import GraphSpec as GraphSpec
    from .graphs import load_edge_list as load_edge_list
    from .graphs import normalize_edges as normalize_edges
    from .init import DualInitSpec as DualInitSpec
    from .init import draw_z0 as draw_z0
    from .init import perturb_value as perturb_value
    from .pdmm import Objective as Objective
    from .pdmm import dual_sum as dual_sum
    from .pdmm import linear_branch as linear_branch
    from .pdmm import paper_q as paper_q
    from .pdmm import x_update as x_update
    from .pdmm import z_update as z_update
    from .rng import rng_for as rng_for
    from .schedule import Phase as Phase
    from .schedule import plan_phases as plan_phases
    from .schedule import true_aggregate as true_aggregate
    from .sim import SimResult as SimResult
    from .sim import simulate as simulate
    from .warm import WarmStart as WarmStart
    from .warm import warm_start as warm_start

__all__, __getattr__ = lazy_exports(__name__, __file__)
