"""The run's public configuration document (``P/R/config``): building it, reading it, comparing it.

Every participant derives the same document from the same :class:`~nlagg_node.config.RunConfig`; a
node refuses to run when the broker's retained document differs in anything its numbers depend on
(:func:`config_mismatch`), so a stale or mistyped config fails with one line instead of diverging.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..arrays import IntArray
from ..config import RunConfig
from ..errors import ConfigMismatchError
from ..graphs import normalize_edges, sample_graphs
from ..schedule import phase_c, plan_phases
from .wire import ConfigMsg

__all__ = ["ConfigMismatchError", "build_config_msg", "config_from_msg", "config_mismatch", "run_edges"]


# RunConfig fields the node's numbers depend on (its stop included), and the channel its z^(0)
# travel on: a retained config that differs in one is refused.
_MATH_FIELDS = (
    "op",
    "n",
    "t_max",
    "c",
    "theta",
    "init",
    "mu_z",
    "sigma_z",
    "sigma_s",
    "k",
    "quantile",
    "epsilon",
    "prior_median",
    "avg_c",
    "avg_sigma_z",
    "avg_t_max",
    "value_range",
    "init_channel",
    "early_stop",
    "stop_window",
    "stop_rule",
    "tolerance",
    "may_depart",
)


def config_mismatch(mine: ConfigMsg, retained: ConfigMsg) -> ConfigMismatchError | None:
    """The first difference that matters between two public configs (None when they agree)."""
    where = f"the broker's retained config of run {retained.run_id!r}"
    for key in _MATH_FIELDS:
        if mine.run.get(key) != retained.run.get(key):
            return ConfigMismatchError(
                f"config.{key}", mine.run.get(key), f"{where} has {retained.run.get(key)!r}"
            )
    if mine.n != retained.n or mine.edges != retained.edges:
        return ConfigMismatchError("config.edges", f"{len(mine.edges)} edges", f"{where} has another graph")
    if mine.identities != retained.identities:
        return ConfigMismatchError(
            "config.identities", _keys(mine.identities), f"{where} has {_keys(retained.identities)}"
        )
    if mine.launcher is not None and mine.launcher != retained.launcher:
        return ConfigMismatchError("config.launcher", mine.launcher, f"{where} has {retained.launcher!r}")
    if mine.instance is not None and mine.instance != retained.instance:
        return ConfigMismatchError(
            "config.instance", mine.instance, f"{where} is of another start of the run: {retained.instance!r}"
        )
    if mine.phases != retained.phases:
        return ConfigMismatchError(
            "config.phases", [p["name"] for p in mine.phases], f"{where} has another schedule"
        )
    return None


def _keys(identities: list[str] | None) -> str:
    return "no identities" if identities is None else f"identities {[k[:8] for k in identities]}"


def run_edges(cfg: RunConfig) -> IntArray:
    """The graph of trial 0 of ``cfg``: the one the simulator and every testbed node build."""
    return sample_graphs(cfg.graph_spec(), cfg.seed, 1)[0]


_PRIVATE_FIELDS = {"seed", "trials", "record", "graph_file", "values_file"}


def build_config_msg(
    cfg: RunConfig,
    run_id: str,
    edges: IntArray,
    identities: Sequence[str] | None = None,
    *,
    instance: str | None = None,
    launcher: str | None = None,
) -> ConfigMsg:
    """The public ``P/R/config`` document: resolved parameters, the edge list, the phase schedule,
    and the nodes' public identities when they sign (:mod:`nlagg_node.protocol.identity`), with the
    run ``instance`` and the ``launcher`` key that signs it (:mod:`nlagg_node.protocol.instance`).

    Leaves out the seed (it would reveal every node's z^(0)), the values file, the graph file's
    folder and simulator-only fields. The value range is public: the eavesdropper maps what it
    learns back to the user's units.
    """
    cfg = cfg.resolved()
    run = cfg.model_dump(mode="json", exclude=_PRIVATE_FIELDS)
    if cfg.graph == "file" and cfg.graph_file is not None:
        # The file's name only: its edges are in this very message, and naming it keeps the message
        # valid for readers that rebuild a RunConfig from it (config_from_msg).
        run["graph_file"] = cfg.graph_file.name
    phases = [
        {
            "name": ph.name,
            "group": ph.group,
            "t_len": ph.t_len,
            "c": phase_c(cfg, ph),
            "objective": ph.objective.kind,
            "bypass": ph.bypass,
        }
        for ph in plan_phases(cfg)
    ]
    pairs = [[int(a), int(b)] for a, b in np.asarray(edges).tolist()]
    keys = None if identities is None else list(identities)
    return ConfigMsg(
        run_id=run_id,
        n=cfg.n,
        edges=pairs,
        run=run,
        phases=phases,
        identities=keys,
        instance=instance,
        launcher=launcher,
    )


def config_from_msg(msg: ConfigMsg) -> tuple[RunConfig, IntArray]:
    """Rebuild the run configuration (seed 0, graph from the message's edges) and the canonical edges."""
    from ..config import validate_config

    # A config without early_stop predates early stopping: it ran the fixed schedule.
    cfg = validate_config({"early_stop": False, **msg.run, "trials": 1, "record": "none"})
    return cfg, normalize_edges(msg.n, msg.edges, source="config.edges")
