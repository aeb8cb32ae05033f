"""Phases of a run, what each node ends with, and the exact aggregate to compare against.

max, min, median, quantile and average are one phase. top-K is ``k`` rounds of max
consensus with the duals carried over (Algorithm 2): from round 2 on, a node whose
value lies within epsilon of a value it already identified bypasses the max
(eq. (topk_xi)). The trimmed mean runs top-K largest, top-K smallest and average
consensus, each part with its own fresh duals, and combines them (Sec. V-C).
Iteration numbers ``t`` count across phases.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from .arrays import FloatArray
from .config import PROPOSED_INIT, RunConfig
from .init import DualInit, DualInitSpec, ValueNoise
from .pdmm import Objective, is_flat, order_of, paper_q
from .threat import sealed_groups, secret_groups

Bypass = Literal["none", "max", "min"]


@dataclass(frozen=True)
class Phase:
    """One stretch of iterations with one objective.

    Attributes
    ----------
    name
        Published in every x message (``max-2``, ``average``, ...).
    group
        Dual set the phase works on; a phase whose group differs from the previous
        one starts fresh duals drawn from ``init`` (a z^(0) exchange).
    bypass
        ``max``/``min``: nodes whose value is within epsilon of an earlier round's
        result of the same group use the linear branch (top-K rounds >= 2).
    round_index
        0 for the first round of a group; round r of a max (min) group finds the
        (r+1)-th largest (smallest) value.
    """

    name: str
    objective: Objective
    t_len: int
    group: str
    init: DualInitSpec
    bypass: Bypass = "none"
    round_index: int = 0


@dataclass(frozen=True)
class Schedule:
    """Where every phase of a run lies in its iterations: the one phase table every driver reads (the
    node loop, the simulator, the replay, the transcript's rules). A phase that stops early leaves a
    gap: the next one still starts at its usual iteration.

    Attributes
    ----------
    starts
        The first iteration of every phase, then the run's ``t_total``.
    """

    starts: tuple[int, ...]

    @classmethod
    def of(cls, phases: Sequence[Phase]) -> Schedule:
        """The schedule of ``phases`` run one after the other, each for its ``t_len``."""
        return cls((0, *accumulate(p.t_len for p in phases)))

    @property
    def t_total(self) -> int:
        """The iterations of the whole run (every phase to its ``t_len``)."""
        return self.starts[-1]

    def start(self, p: int) -> int:
        """The first iteration of phase ``p``."""
        return self.starts[p]

    def end(self, p: int) -> int:
        """The first iteration after phase ``p``."""
        return self.starts[p + 1]

    def phase_of(self, t: int) -> int:
        """The index of the phase iteration ``t`` (``0 <= t < t_total``) belongs to."""
        return bisect.bisect_right(self.starts, t) - 1

    def phase_end(self, t: int) -> int:
        """The first iteration after the phase of ``t``."""
        return self.starts[self.phase_of(t) + 1]


def _init_for(cfg: RunConfig, default: DualInit, c: float, sigma_z: float | None = None) -> DualInitSpec:
    """The dual distribution of a group: ``proposed`` means ``default`` (``PROPOSED_INIT`` per operator).

    The prior median is public and given in the user's units; the duals live on the protocol's
    scale (:mod:`nlagg_node.valuechecks`), so it is mapped there.
    """
    from .valuemap import scale_for

    name = cfg.init
    kind: DualInit
    if name in ("none", "dp-gauss", "dp-laplace"):
        kind = "zero"
    elif name == "proposed":
        kind = default
    else:
        kind = name  # type: ignore[assignment]
    sz = cfg.sigma_z_value if sigma_z is None else sigma_z
    scale = scale_for(cfg)
    prior = scale.protocol_float(cfg.prior_median_value)
    center = 0.0 if scale.identity else 0.5  # one-sided starts: midpoint of the range +- mu_z / c
    return DualInitSpec(kind=kind, mu_z=cfg.mu_z_value, sigma_z=sz, c=c, prior_median=prior, center=center)


def _proposed(cfg: RunConfig) -> DualInit:
    return PROPOSED_INIT[cfg.op]  # type: ignore[return-value]


def plan_phases(cfg: RunConfig) -> list[Phase]:
    """The phases of a run, in order."""
    t, c = cfg.t_max_value, cfg.c_value
    op = cfg.op
    if op == "max":
        return [Phase("max", Objective.maximum(), t, "max", _init_for(cfg, "from-above", c))]
    if op == "min":
        return [Phase("min", Objective.minimum(), t, "min", _init_for(cfg, "from-below", c))]
    if op in ("median", "quantile"):
        obj = Objective.median() if op == "median" else Objective.quantile(paper_q(cfg.quantile))
        if is_flat(cfg.n, cfg.level):
            obj = obj.pinned_low(cfg.n)
        return [Phase(op, obj, t, op, _init_for(cfg, _proposed(cfg), c))]
    avg_init = _init_for(cfg, "symmetric", cfg.avg_c, cfg.avg_sigma_z)
    if op == "average":
        return [Phase("average", Objective.average(), t, "average", _init_for(cfg, "symmetric", c))]
    up = _init_for(cfg, "from-above", c)
    rounds = [
        Phase(f"max-{r + 1}", Objective.maximum(), t, "max", up, "max" if r else "none", r)
        for r in range(cfg.k)
    ]
    if op == "topk":
        return rounds
    down = _init_for(cfg, "from-below", c)
    lows = [
        Phase(f"min-{r + 1}", Objective.minimum(), t, "min", down, "min" if r else "none", r)
        for r in range(cfg.k)
    ]
    # The average part has its own step c (uniformly convex, fast) and a large sigma_z.
    return [*rounds, *lows, Phase("average", Objective.average(), cfg.avg_t_max, "average", avg_init)]


def phase_c(cfg: RunConfig, phase: Phase) -> float:
    """The step parameter of a phase (the trimmed mean's average part uses ``avg_c``)."""
    return cfg.avg_c if (cfg.op == "trimmed-mean" and phase.group == "average") else cfg.c_value


def value_noise(cfg: RunConfig) -> ValueNoise:
    return {"dp-gauss": "gauss", "dp-laplace": "laplace"}.get(cfg.init, "none")  # type: ignore[return-value]


def bypassed(phase: Phase, s: FloatArray, identified: FloatArray, epsilon: float) -> NDArray[np.bool_]:
    """Nodes that bypass the max/min this round: ``|s_i - x_hat| <= epsilon`` for an earlier result.

    ``identified`` has shape ``(rounds_so_far, *s.shape)``: each node's own final x of
    the earlier rounds of this group.
    """
    if phase.bypass == "none" or len(identified) == 0:
        return np.zeros(s.shape, dtype=bool)
    return np.asarray((np.abs(identified - s[None]) <= epsilon).any(axis=0))


def effective_values(phase: Phase, s: FloatArray, skip: NDArray[np.bool_]) -> FloatArray:
    """The ``s`` the x-update sees: ``-inf`` (max) or ``+inf`` (min) for bypassing nodes."""
    if phase.bypass == "none":
        return s
    return np.where(skip, -np.inf if phase.bypass == "max" else np.inf, s)


def combine(cfg: RunConfig, phases: list[Phase], finals: list[FloatArray]) -> FloatArray:
    """Each node's output from its final x of every phase.

    Returns shape ``(..., k)`` for top-K (the k identified values), ``(...)`` otherwise.
    The trimmed mean is ``(n mean - sum of the k largest and k smallest) / (n - 2k)``.
    """
    if cfg.op == "topk":
        return np.stack(finals, axis=-1)
    if cfg.op != "trimmed-mean":
        return finals[-1]
    k, n = cfg.k, cfg.n
    extremes = np.sum(np.stack(finals[: 2 * k], axis=-1), axis=-1)
    return np.asarray((n * finals[-1] - extremes) / (n - 2 * k))


def phase_targets(cfg: RunConfig, phases: list[Phase], s: FloatArray) -> list[tuple[FloatArray, FloatArray]]:
    """The exact solution set ``[lo, hi]`` of every phase, per trial (``s`` has shape ``(trials, n)``).

    The median of an even number of values, or a quantile with ``n p`` an integer, is the lower
    of the two values its loss is flat between: the run pins it (:meth:`Objective.pinned_low`),
    for any number of nodes left after departures. Where the run's own ``n`` is not flat but the
    survivors' number is (a departure from an odd n), every point between the two is exact.
    """
    n = s.shape[-1]
    pinned = is_flat(cfg.n, cfg.level)
    desc = -np.sort(-s, axis=-1)
    out: list[tuple[FloatArray, FloatArray]] = []
    for ph in phases:
        if ph.group == "average":
            m = s.mean(axis=-1)
            out.append((m, m))
        elif ph.group == "max":
            r = ph.round_index
            out.append((desc[..., r], desc[..., r]))
        elif ph.group == "min":
            r = n - 1 - ph.round_index
            out.append((desc[..., r], desc[..., r]))
        else:
            asc = desc[..., ::-1]
            k = order_of(n, cfg.level)
            upper = k if is_flat(n, cfg.level) and not pinned else k - 1
            out.append((asc[..., k - 1], asc[..., upper]))
    return out


def true_aggregate(cfg: RunConfig, s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The exact output interval ``[lo, hi]`` per trial (last axis of the output for top-K)."""
    phases = plan_phases(cfg)
    targets = phase_targets(cfg, phases, s)
    if cfg.op == "topk":
        return np.stack([t[0] for t in targets], -1), np.stack([t[1] for t in targets], -1)
    if cfg.op == "trimmed-mean":
        k, n = cfg.k, cfg.n
        extremes = sum(t[0] for t in targets[: 2 * k])
        val = (n * targets[-1][0] - extremes) / (n - 2 * k)
        return val, val
    return targets[-1]


def distance_to(x: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    """Distance of x from the interval [lo, hi] (0 inside)."""
    return np.maximum(np.maximum(lo - x, x - hi), 0.0)


def sealed_groups_of(cfg: RunConfig, phases: list[Phase]) -> frozenset[str]:
    """The dual groups whose z^(0) travel sealed under ``cfg.init_channel`` (:mod:`nlagg_node.threat`)."""
    return sealed_groups(cfg.init_channel, ((p.group, p.objective.kind) for p in phases))


def secret_groups_of(cfg: RunConfig, phases: list[Phase]) -> frozenset[str]:
    """The sealed groups whose z^(0) are random, so that an eavesdropper does not know them."""
    info = ((p.group, p.objective.kind, p.init.kind != "zero" and p.init.sigma_z > 0) for p in phases)
    return secret_groups(cfg.init_channel, info)
