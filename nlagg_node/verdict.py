"""One vocabulary for what an adversary learned about a node, judged against the ideal world.

The ideal world is a trusted party that takes every private value and announces only the result.
Every exact protocol reveals at least what it reveals: the output's holders (paper Prop. 1, 2 and
Sec. III-D), for top-K the K largest, for the trimmed mean the K largest and K smallest. A node's
value the adversary learned is then

* ``unavoidable``: the ideal world exposes it too;
* ``beyond the ideal world``: the protocol leaked more than any exact protocol must;
* ``protected``: the adversary did not learn it (at most an interval);
* ``corrupted``: the adversary holds it by corruption.

``sim``, ``testbed``, ``attack``, ``report`` and the dashboard all label nodes with :func:`verdict`,
and count what leaked beyond with :func:`beyond_ideal`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
from numpy.typing import ArrayLike

from .pdmm import order_of

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = [
    "AT_OUTPUT",
    "BEYOND",
    "CORRUPTED",
    "FAR_BEYOND",
    "PROTECTED",
    "UNAVOIDABLE",
    "Verdict",
    "beyond_ideal",
    "far_beyond_warning",
    "ideal_nodes",
    "ideal_ranks",
    "output_holders",
    "verdict",
]

Verdict = Literal["unavoidable", "beyond the ideal world", "protected", "corrupted"]
UNAVOIDABLE: Final = "unavoidable"
BEYOND: Final = "beyond the ideal world"
PROTECTED: Final = "protected"
CORRUPTED: Final = "corrupted"

AT_OUTPUT = 1e-6
"""Distance to the output, as a fraction of the value range, within which a value is the output's."""

FAR_BEYOND = 0.5
"""Leakage probability above which a rank the ideal world does not expose draws a warning."""


def verdict(*, exposed: bool, ideal: bool, corrupted: bool = False) -> Verdict:
    """The verdict on one node: what the adversary learned (``exposed``) beside the ideal world.

    Parameters
    ----------
    exposed : the adversary determined the node's value exactly.
    ideal : the ideal world exposes the node's value too (it holds an output value).
    corrupted : the adversary holds the value by corruption (this wins over the rest).
    """
    if corrupted:
        return CORRUPTED
    if not exposed:
        return PROTECTED
    return UNAVOIDABLE if ideal else BEYOND


def output_holders(op: str, distances: Mapping[int, float], span: float = 1.0) -> set[int]:
    """The exposed nodes that hold the output, from each one's distance to the run's output alone.

    Used where the values' ranks are unknown (``nlagg attack`` reads only the transcript). What a
    transcript shows as the output is a node's final x, exact only to the run's tolerance, so the
    holder's value may differ from it: every value within :data:`AT_OUTPUT` of the range ``span``
    is the output's, and for an operator with one output (max, min, median, quantile) the exposed
    value nearest to it is its holder's too (the ideal world exposes that one node, Prop. 1 and 2).
    """
    known = {i: d for i, d in distances.items() if not math.isnan(d)}
    holders = {i for i, d in known.items() if d <= AT_OUTPUT * span}
    if op in ("max", "min", "median", "quantile") and known and not holders:
        holders = {min(known, key=lambda i: known[i])}
    return holders


def beyond_ideal(verdicts: Iterable[str]) -> int:
    """How many nodes leaked beyond the ideal world (the headline count)."""
    return sum(v == BEYOND for v in verdicts)


def ideal_ranks(cfg: RunConfig) -> list[int]:
    """Ranks (0 = largest) whose value every exact protocol exposes: the output's holders."""
    n = cfg.n
    if cfg.op == "max":
        return [0]
    if cfg.op == "min":
        return [n - 1]
    if cfg.op == "topk":
        return list(range(cfg.k))
    if cfg.op == "trimmed-mean":
        return [*range(cfg.k), *range(n - cfg.k, n)]
    if cfg.op in ("median", "quantile"):
        # the k-th smallest (for an even n's median the lower middle, which the run pins), from the top
        return [n - order_of(n, cfg.level)]
    return []


def ideal_nodes(cfg: RunConfig, values: ArrayLike) -> set[int]:
    """Node ids whose value the ideal world exposes, for one draw of the private ``values``."""
    order = np.argsort(-np.asarray(values, dtype=np.float64), kind="stable")  # order[r] = node of rank r
    return {int(order[r]) for r in ideal_ranks(cfg)}


def _ranks_text(ranks: Sequence[int]) -> str:
    """``0-3, 13-14``: sorted ranks with consecutive runs joined."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(str(a[0]) if len(a) == 1 else f"{a[0]}-{a[-1]}" for a in runs)


def far_beyond_warning(cfg: RunConfig, leakage_probability: Sequence[float]) -> str | None:
    """One line when ranks the ideal world keeps private leak with probability above :data:`FAR_BEYOND`."""
    allowed = set(ideal_ranks(cfg))
    bad = [r for r, p in enumerate(leakage_probability) if r not in allowed and p > FAR_BEYOND]
    if not bad:
        return None
    probs = [leakage_probability[r] for r in bad]
    allowed_text = f"rank(s) {_ranks_text(sorted(allowed))}" if allowed else "no single value"
    trials = f"{cfg.trials} trial" + ("s" if cfg.trials != 1 else "")
    return (
        f"warning: --op {cfg.op} --init {cfg.init} leaks rank(s) {_ranks_text(bad)} with probability"
        f" {min(probs):.2f}-{max(probs):.2f} over {trials}, far beyond the ideal world (which exposes"
        f" {allowed_text});"
        " see `nlagg tune` for a setting that keeps them private"
    )
