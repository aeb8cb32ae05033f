"""The simulator's side of :mod:`nlagg_node.departure`: the same rule on the batched edge layout.

Every trial loses the same nodes at the same iterations. The kernel runs up to and including
iteration ``T`` of a departure, then :meth:`SimDepartures.apply` drops the departed nodes'
edge pairs from the layout and the duals (:func:`~nlagg_node.departure.kept_edges`), keeping
every other edge in its order, so each node still adds its duals in ascending neighbour order
and the numbers stay bit for bit those of the node loop. A departed node's value becomes NaN
for the kernel: its x is NaN from then on (it publishes nothing), it matches nothing and is
never off the target.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..arrays import FloatArray, IntArray
from ..config import RunConfig
from ..departure import check_departures, components, drop_pairs
from ..errors import ConfigError
from ..graphs import EdgeLayout
from ..schedule import distance_to, true_aggregate

__all__ = ["SimDepartures", "largest_truth", "survivor_mse", "survivor_truth"]


class SimDepartures:
    """Departures ``{node: T}`` of a batched run (every trial the same)."""

    def __init__(
        self, cfg: RunConfig, departures: Mapping[int, int], t_total: int, graphs: list[IntArray]
    ) -> None:
        check_departures(departures, cfg.n, t_total, cfg.op, cfg.early_stop, cfg.may_depart)
        self.n, self.trials = cfg.n, len(graphs)
        self.at = dict(sorted(departures.items(), key=lambda kv: (kv[1], kv[0])))
        self.gone: set[int] = set()
        self.pairs_kept = np.ones(sum(len(g) for g in graphs), dtype=bool)  # over the run's pairs
        self.components = [components(cfg.n, g, departures) for g in graphs]
        if cfg.op == "topk":
            small = [c for comps in self.components for c in comps if len(c) < cfg.k]
            if small:
                raise ConfigError(
                    "depart",
                    _shown(departures),
                    f"top-K with k={cfg.k} leaves component {small[0]} too few nodes",
                )

    def cuts(self, t0: int, t_len: int) -> list[int]:
        """Phase-local iterations after which the kernel must stop (``T + 1`` of each departure)."""
        return sorted({t + 1 - t0 for t in self.at.values() if t0 <= t < t0 + t_len - 1})

    def due(self, t_end: int) -> list[int]:
        """The nodes whose departure iteration is ``t_end - 1`` (the last iteration run)."""
        return [j for j, t in self.at.items() if t == t_end - 1 and j not in self.gone]

    def apply(
        self, nodes: list[int], layout: EdgeLayout, u: FloatArray, pair_start: IntArray
    ) -> tuple[EdgeLayout, FloatArray, IntArray]:
        """Drop the edge pairs of ``nodes`` (every trial); the new layout, duals and trial pair starts."""
        self.gone.update(nodes)
        new, kept_u, keep = drop_pairs(layout, u, self.gone)
        self.pairs_kept[np.flatnonzero(self.pairs_kept)[~keep]] = False
        counts = np.bincount(layout.dst[: layout.n_pairs][keep] // self.n, minlength=self.trials)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return new, kept_u, starts

    def full_order(self, z: FloatArray) -> FloatArray:
        """Per-edge values of the current layout on the run's layout, NaN for the departed edges."""
        both = np.concatenate([self.pairs_kept, self.pairs_kept])
        out = np.full(len(both), np.nan)
        out[both] = z
        return out

    def mask_values(self, s_eff: FloatArray) -> FloatArray:
        """``s_eff`` with NaN for the departed nodes of every trial (their x is NaN from then on)."""
        if not self.gone:
            return s_eff
        out = s_eff.reshape(self.trials, self.n).copy()
        out[:, sorted(self.gone)] = np.nan
        return np.ascontiguousarray(out.ravel())


def survivor_truth(
    cfg: RunConfig, s: FloatArray, comps: list[list[list[int]]]
) -> tuple[FloatArray, FloatArray]:
    """Each node's exact output interval, from the values of its own component (NaN for departed nodes).

    Shapes ``(B, n)``, or ``(B, n, k)`` for top-K.
    """
    shape = s.shape if cfg.op != "topk" else (*s.shape, cfg.k)
    lo, hi = np.full(shape, np.nan), np.full(shape, np.nan)
    for b, cs in enumerate(comps):
        for c in cs:
            tl, th = true_aggregate(cfg, s[b, c][None])
            lo[b, c], hi[b, c] = tl[0], th[0]
    return lo, hi


def largest_truth(
    lo: FloatArray, hi: FloatArray, comps: list[list[list[int]]]
) -> tuple[FloatArray, FloatArray]:
    """Per trial, the truth of its largest component (the first of the largest)."""
    first = [max(cs, key=len)[0] for cs in comps]
    rows = np.arange(len(comps))
    return lo[rows, first], hi[rows, first]


def survivor_mse(output: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """Mean squared distance of the survivors' outputs from their components' truth, per trial."""
    err = distance_to(output, lo, hi)
    sq = err**2 if err.ndim == 2 else (err**2).sum(axis=2)
    return np.asarray(np.nanmean(sq, axis=1), dtype=np.float64)


def _shown(departures: Mapping[int, int]) -> str:
    return ",".join(f"{j}@{t}" for j, t in departures.items())
