"""Ideal-world bounds: the leakage any exact protocol must allow (paper Sec. III, V-C).

Under passive corruption plus global eavesdropping, an exact protocol reveals, besides
the corrupted nodes' own values, what the paper lists per functionality:

* max / min: the output and who holds it (Prop. 1), so the holder leaks fully;
* top-K: the K values and their holders;
* median / quantile: the output, its holder, and for every node whether it lies
  below or above (Prop. 2 and Sec. III-D);
* trimmed mean: the K largest and K smallest values with their holders, and the
  sum of every connected component of honest nodes (average consensus, [Jane2020TIFS]).

The experiments label nodes by rank (rank 0 holds the largest value), so the bound of
rank r is ``I(S_(r); W_r) / I(S_(r); S_(r))`` where ``W_r`` is what the ideal world
reveals that bears on the rank-r node, estimated by Monte Carlo over the trials with
the same KSG estimator (and normalizer) as the achieved NMI curves, so the two are
directly comparable and the optimality gap is one number per rank:

* the rank-r node leaks fully (bound 1) if it holds an output value, or, for the
  trimmed mean, if it is the only non-extreme node of its honest component (the
  component sum minus known extremes is then its value);
* otherwise ``W_r`` stacks the output value(s) (for the trimmed mean: the 2K extreme
  values and the sum of the rank-r node's honest component minus those extremes in
  it), followed by the corrupted nodes' values in decreasing order. The side
  (above/below the output) is implied by the rank label itself.

Trials in which the rank-r node is corrupted are left out of rank r's estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nlagg_node.arrays import BoolArray, FloatArray, IntArray
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError
from nlagg_node.schedule import true_aggregate

from .analysis.mi import mutual_information, mutual_information_batch


@dataclass(frozen=True)
class IdealBound:
    """Ideal-world leakage per rank (rank 0 = largest value).

    Attributes
    ----------
    nmi
        ``I(S_(r); W_r) / I(S_(r); S_(r))``; 1 where the rank leaks fully; NaN for a
        rank that is corrupted in every trial.
    bits
        ``I(S_(r); W_r)`` in bits (``inf`` for full leakage).
    full
        Ranks that leak fully.
    samples
        Trials used per rank (those where the rank-r node is honest).
    method
        One line on how the numbers were obtained.
    """

    nmi: FloatArray
    bits: FloatArray
    full: BoolArray
    samples: IntArray
    method: str

    def gap(self, achieved: FloatArray) -> FloatArray:
        """Optimality gap per rank: achieved NMI (e.g. the final or peak value) minus the bound."""
        return np.asarray(np.asarray(achieved, dtype=np.float64) - self.nmi, dtype=np.float64)


def _components_without(n: int, edges: IntArray, removed: set[int]) -> IntArray:
    """Label of each node's connected component after deleting ``removed`` (-1 for removed)."""
    label = np.full(n, -1, dtype=np.int64)
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in np.asarray(edges).tolist():
        if a not in removed and b not in removed:
            adj[a].append(b)
            adj[b].append(a)
    comp = 0
    for start in range(n):
        if start in removed or label[start] >= 0:
            continue
        stack = [start]
        label[start] = comp
        while stack:
            a = stack.pop()
            for b in adj[a]:
                if label[b] < 0:
                    label[b] = comp
                    stack.append(b)
        comp += 1
    return label


def _output_ranks(cfg: RunConfig, desc: FloatArray) -> tuple[list[int], FloatArray]:
    """Ranks that hold an output value, and the output values (B, m) the ideal world reveals."""
    n = cfg.n
    if cfg.op == "max":
        return [0], desc[:, :1]
    if cfg.op == "min":
        return [n - 1], desc[:, n - 1 :]
    if cfg.op == "topk":
        return list(range(cfg.k)), desc[:, : cfg.k]
    if cfg.op == "trimmed-mean":
        ext = [*range(cfg.k), *range(n - cfg.k, n)]
        return ext, desc[:, ext]
    if cfg.op in ("median", "quantile"):
        lo, hi = true_aggregate(cfg, desc)
        ranks = [r for r in range(n) if np.all(desc[:, r] == lo) and np.all(lo == hi)]
        outs = np.stack([lo, hi], axis=1) if np.any(lo != hi) else lo[:, None]
        return ranks, outs
    raise ConfigError(
        "op", cfg.op, "no ideal-world bound for this operator (use max, min, topk, median, ...)"
    )


def side_information(
    cfg: RunConfig,
    values: FloatArray,
    corrupted: Sequence[int] = (),
    graphs: Sequence[IntArray] | None = None,
) -> tuple[list[FloatArray | None], list[BoolArray]]:
    """The ideal world's side information ``W_r`` per rank, and the trials where rank r is honest.

    Returns one ``(trials_r, d)`` array per rank (``None`` for ranks that leak fully)
    and one boolean mask of honest trials per rank.
    """
    cfg = cfg.resolved()
    B, n = values.shape
    if n != cfg.n:
        raise ConfigError("values", f"shape {values.shape}", f"config has n={cfg.n}")
    bad = [c for c in corrupted if not 0 <= int(c) < n]
    if bad:
        raise ConfigError("corrupted", bad, f"node ids must lie in 0..{n - 1}")
    order = np.argsort(-values, axis=1, kind="stable")  # order[b, r] = node id of rank r
    desc = np.take_along_axis(values, order, axis=1)
    cset = {int(c) for c in corrupted}
    is_corrupt = np.isin(order, list(cset)) if cset else np.zeros((B, n), dtype=bool)
    corrupt_vals = -np.sort(-values[:, sorted(cset)], axis=1) if cset else np.empty((B, 0), dtype=np.float64)
    full_ranks, outputs = _output_ranks(cfg, desc)
    sides: list[FloatArray | None] = []
    masks: list[BoolArray] = []
    for r in range(n):
        honest = ~is_corrupt[:, r]
        masks.append(honest)
        if r in full_ranks:
            sides.append(None)
            continue
        feats = [outputs, corrupt_vals]
        if cfg.op == "trimmed-mean":
            own, alone = _component_sums(cfg, values, order, r, cset, graphs)
            if alone[honest].all():
                sides.append(None)
                continue
            feats.insert(1, own[:, None])
        sides.append(np.hstack(feats)[honest])
    return sides, masks


def _component_sums(
    cfg: RunConfig,
    values: FloatArray,
    order: IntArray,
    r: int,
    corrupted: set[int],
    graphs: Sequence[IntArray] | None,
) -> tuple[FloatArray, BoolArray]:
    """Sum of the rank-r node's honest component minus its known extremes, and whether it is alone."""
    B, n = values.shape
    if corrupted and graphs is None:
        raise ConfigError(
            "graphs", None, "the trimmed-mean bound with corrupted nodes needs each trial's graph"
        )
    k = cfg.k
    extreme_ranks = [*range(k), *range(n - k, n)]
    own = np.empty(B)
    alone = np.zeros(B, dtype=bool)
    whole = np.zeros(n, dtype=np.int64)
    for b in range(B):
        label = _components_without(n, graphs[b], corrupted) if corrupted and graphs is not None else whole
        node = int(order[b, r])
        members = label == label[node]
        extremes = np.zeros(n, dtype=bool)
        extremes[order[b, extreme_ranks]] = True
        rest = members & ~extremes
        own[b] = values[b, rest].sum()
        alone[b] = int(rest.sum()) == 1
    return own, alone


def ideal_leakage(
    cfg: RunConfig,
    values: FloatArray,
    corrupted: Sequence[int] = (),
    graphs: Sequence[IntArray] | None = None,
    *,
    k: int = 3,
    seed: int = 0,
) -> IdealBound:
    """Monte Carlo ideal-world bound per rank from the private values of many trials.

    Parameters
    ----------
    cfg
        The run (operator, n, K, quantile level).
    values
        ``(B, n)`` private values of B independent trials (``SimResult.values``).
    corrupted
        Node ids of the passively corrupted nodes (the same in every trial).
    graphs
        Each trial's edges (``SimResult.graphs``); needed for the trimmed mean with
        corrupted nodes, whose honest components depend on the graph.
    k
        KSG neighbour count.
    seed
        Seed of the estimator's jitter.
    """
    from nlagg_node.rng import rng_for

    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ConfigError("values", f"shape {v.shape}", "expected (trials, n)")
    sides, masks = side_information(cfg, v, corrupted, graphs)
    desc = -np.sort(-v, axis=1)
    n = v.shape[1]
    rng = rng_for(seed, "ideal-bound")
    nmi = np.full(n, np.nan)
    bits = np.full(n, np.nan)
    full = np.array([side is None for side in sides])
    samples = np.array([int(m.sum()) for m in masks], dtype=np.int64)
    for r in range(n):
        s = desc[masks[r], r]
        if len(s) <= k:
            continue
        side = sides[r]
        if side is None:
            nmi[r], bits[r] = 1.0, np.inf
            continue
        norm = float(mutual_information_batch(s[None], s[None], k, rng=rng)[0])
        bits[r] = mutual_information(s, side, k, rng=rng)
        nmi[r] = bits[r] / norm
    method = (
        f"KSG (k={k}) Monte Carlo over {v.shape[0]} trials: I(S_(r); W_r) / I(S_(r); S_(r)), "
        f"W_r = output value(s) of {cfg.op}"
        + (" + own honest component sum" if cfg.op == "trimmed-mean" else "")
        + (f" + values of corrupted nodes {sorted(int(c) for c in corrupted)}" if corrupted else "")
        + "; output holders leak fully (1)"
    )
    return IdealBound(nmi=nmi, bits=bits, full=full, samples=samples, method=method)
