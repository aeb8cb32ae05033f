"""Each epoch's public configuration, derived as the nodes derive it (docs/continuous.md).

A continuous deployment publishes no per-epoch ``P/R/e{k}/config``: every node derives the
configuration of epoch k from public facts, the deployment's config (the plan's ``run.toml``),
the epoch, the latest public output before it and the declared drift
(:func:`nlagg_node.epochplan.epoch_config`). The continuous capture
(:mod:`adversary.capture.epochs`) derives the same from the same facts and gives it to each
epoch's eavesdropper, so that the transcript judges and replays the epoch as the nodes ran it.

Which epochs run warm is the nodes' rule (:mod:`nlagg_node.runtime.warmstart`): epoch k runs
warm when some node published epoch k-1's output on ``P/R/results/{i}``, from the median of those
outputs (:func:`~nlagg_node.epochplan.published_output`), and with none of k-1 (no node
finished it) from the latest earlier epoch's (:func:`~nlagg_node.runtime.warmstart.latest_published`,
at most :data:`~nlagg_node.epochplan.WARM_GAP` back); the capture reads the same topics. The
warm ``c`` does not depend on the output's value, so outputs that differ within the run's tolerance
give one configuration (a median's prior, at the output, moves by as little). With no published
output at all, the nodes run k cold, and so does the derived configuration.

A warm run is judged with its band too (:func:`judge_warm`): a node whose value lies beyond the
band runs a shell value instead (:meth:`nlagg_node.warm.WarmStart.used_value`), so what the warm
run reveals of it is that shell value, not its own; as in the simulator, such an exposure exposes
no value, and the node's interval becomes the side of the band its value lies on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nlagg_node.arrays import IntArray
from nlagg_node.config import RunConfig
from nlagg_node.epochplan import HeardOutput, epoch_config, epoch_start
from nlagg_node.runtime.epochdriver import rerun_run_id
from nlagg_node.runtime.outputs import epoch_run_id
from nlagg_node.runtime.public import build_config_msg, config_from_msg, run_edges
from nlagg_node.runtime.wire import ConfigMsg

__all__ = ["Band", "EpochConfigs", "judge_warm"]

Band = tuple[float, float]
"""A warm run's band ``(lo, hi)`` in the values' units (``-inf``/``inf`` where one-sided)."""


@dataclass(frozen=True)
class EpochConfigs:
    """The deployment's public ``cfg`` and declared ``drift`` (None: every epoch cold,
    ``--cold-start``), from which every epoch's :class:`ConfigMsg` follows; ``identities``: the
    nodes' public signing keys in a deployment whose messages are signed (each epoch's transcript
    checks them as the nodes do)."""

    cfg: RunConfig
    drift: float | None
    edges: IntArray | None = None  # None: the graph every node draws from ``cfg``
    identities: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.edges is None:
            object.__setattr__(self, "edges", run_edges(self.cfg))

    @classmethod
    def from_message(cls, msg: ConfigMsg, drift: float | None) -> EpochConfigs:
        """From the deployment's retained ``P/R/config`` (its graph is the message's edges)."""
        cfg, edges = config_from_msg(msg)
        keys = None if msg.identities is None else tuple(msg.identities)
        return cls(cfg, drift, edges, keys)

    def message(self, epoch: int, previous: HeardOutput | None, *, rerun: bool = False) -> ConfigMsg:
        """The public configuration of epoch ``epoch`` (``rerun``: of its cold rerun), given the
        latest output before it as its nodes published it (None: none was published)."""
        run_cfg = epoch_config(self.cfg, epoch, previous, self.drift, rerun=rerun)
        run = rerun_run_id(epoch) if rerun else epoch_run_id(epoch)
        assert self.edges is not None  # set at construction
        return build_config_msg(run_cfg, run, self.edges, self.identities)

    def band(self, epoch: int, previous: HeardOutput | None) -> Band | None:
        """The band of epoch ``epoch``'s warm run, given the latest output before it as its nodes
        published it (None: none was; the epoch runs cold)."""
        ws = epoch_start(self.cfg, epoch, previous, self.drift).warm
        if ws is None:
            return None
        if self.cfg.value_range is None:
            return ws.band_lo, ws.band_hi
        lo, hi = self.cfg.value_range
        return lo + ws.band_lo * (hi - lo), lo + ws.band_hi * (hi - lo)


def judge_warm(summary: dict[str, Any], band: Band) -> dict[str, Any]:
    """The summary of a warm run (the attack's report on its transcript) as it bears on the nodes'
    own values, given the run's ``band``: an exposure beyond the band is a shell value's (not
    counted exposed), and each node's interval ``[l, u]`` becomes the hull of where its value may
    lie: ``[l, u]`` within the band, and beyond the band on each side the interval reaches past."""
    lo, hi = band
    span = summary.get("value_range")
    tol = 1e-9 * max(1.0, float(span[1]) - float(span[0]) if span else 1.0)
    out = dict(summary)
    nodes, kept = [], set()
    for f in summary.get("nodes", []):
        low = -math.inf if f.get("lower") is None else float(f["lower"])
        up = math.inf if f.get("upper") is None else float(f["upper"])
        parts = []
        if max(low, lo) <= min(up, hi) + tol:
            parts.append((max(low, lo), min(up, hi)))
        if up > hi + tol:
            parts.append((hi, math.inf))
        if low < lo - tol:
            parts.append((-math.inf, lo))
        new_lo, new_up = min(p[0] for p in parts), max(p[1] for p in parts)
        g = dict(
            f, lower=None if math.isinf(new_lo) else new_lo, upper=None if math.isinf(new_up) else new_up
        )
        if f.get("status") == "exposed" and new_lo == new_up:
            kept.add(int(f["node"]))
        elif f.get("status") == "exposed":
            g.update(status="interval", value=None)
        nodes.append(g)
    out["nodes"] = nodes
    out["exposed"] = sorted(int(i) for i in summary.get("exposed", []) if int(i) in kept or not nodes)
    out["band"] = [None if math.isinf(lo) else lo, None if math.isinf(hi) else hi]
    return out
