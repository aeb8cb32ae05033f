"""Bounded influence: the envelope every honest x of a run with a declared value range lies in.

With ``value_range`` declared, every value is on the protocol's scale ``[0, 1]``
(:mod:`nlagg_node.valuechecks`), and the operator's x-update (a proximal step, :mod:`nlagg_node.pdmm`)
with the initialization's z^(0) distribution (:mod:`nlagg_node.init`) bound every honest
``x_j^(t)``. The proof is in docs/protocol.md ("Bounded influence"); in short:

* the z-update with the x-update is ``(1 - theta) I + theta P R``, ``R`` each node's reflected
  proximal map and ``P`` the swap of the two directions of every edge: nonexpansive in the
  Euclidean norm over all 2E signed duals (PDMM as Peaceman-Rachford splitting, paper Sec. II), so
  ``||u^(t) - u*|| <= ||u^(0) - u*||`` for every fixed point ``u*`` of the phase;
* the fixed points are ``u*_{i|j} = -c x* + w_ij`` with ``x*`` the phase's aggregate (in the
  values' range) and ``w`` an antisymmetric flow whose divergence is a subgradient ``g`` of the
  objectives at ``x*`` (``sum g = 0``); along a spanning tree ``||w|| <= sqrt(2 (n - 1)) G / 2``
  with ``G = sum |g_i| <= 2 n min(alpha, beta)`` (piecewise) or ``n W`` (quadratic);
* ``x_j`` is node j's proximal step of its dual sum: ``|x_j - x*| <= ||u_j - u*_j|| / (c sqrt d_j)``;
* z^(0) is Gaussian, hence unbounded: ``||sigma xi|| <= sigma (sqrt(2E) + r)`` fails with
  probability at most ``exp(-r^2 / 2)`` (Gaussian concentration), :data:`FAILURE` per bounded draw;
* a new phase of the same dual group, or a departure, moves the fixed point by at most
  ``max |c x - c' x'| sqrt(2E) + F + F'``; that is added once per phase change, and ``n - 1``
  times in a run whose nodes may depart (with the degree then taken as 1).

A forged x outside the envelope is refused by the protocol's acceptance rule
(:func:`nlagg_node.protocol.x_value_error`); an output outside the values' range fails the node's
run naming the neighbours whose duals pulled it there (:func:`output_error`). The certified stop's
candidates are node values, bounded where every value is (:func:`value_bounds`: the range, or
without one the protected side of a one-sided start), with or without an envelope.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..config import RunConfig
from ..departure import departure_refusal
from ..schedule import Phase, Schedule, phase_c, value_noise
from ..valuemap import ValueScale

__all__ = ["FAILURE", "ValueBounds", "XEnvelope", "output_error", "value_bounds", "x_envelope"]

FAILURE = 1e-12
"""The probability that one random draw of a run (a dual group's z^(0), the DP baselines' value
noise) exceeds the bound the envelope assumes for it."""

_R = math.sqrt(2.0 * math.log(1.0 / FAILURE))  # P(||xi|| > sqrt(N) + r) <= exp(-r^2 / 2) = FAILURE


@dataclass(frozen=True)
class XEnvelope:
    """Where every honest ``x_j^(t)`` of one run lies, on the protocol's scale.

    Attributes
    ----------
    s_lo, s_hi : the values the nodes use (the declared range, widened by the DP noise's bound).
    radius : per phase, ``R_p / c_p``: how far from ``[s_lo, s_hi]`` an x of degree 1 may lie.
    scale : per node, ``1 / sqrt(d_j)`` (1 where nodes may depart: their degree may fall to 1).
    schedule : the run's phases (:class:`~nlagg_node.schedule.Schedule`).
    """

    s_lo: float
    s_hi: float
    radius: tuple[float, ...]
    scale: tuple[float, ...]
    schedule: Schedule

    def bounds(self, node: int, t: int) -> tuple[float, float]:
        """``(lo, hi)`` of ``x_node^(t)`` (``node`` and ``t`` of the run)."""
        r = self.radius[self.schedule.phase_of(t)] * self.scale[node]
        return self.s_lo - r, self.s_hi + r

    def error(self, node: int, t: int, x: float) -> str | None:
        """Why ``x_node^(t) = x`` is no honest x of the run (None: it may be one)."""
        lo, hi = self.bounds(node, t)
        if lo <= x <= hi:
            return None
        return (
            f"x_{node}^({t})={x!r}: outside [{lo:.6g}, {hi:.6g}], where every honest x of this run lies"
            " (value_range; docs/protocol.md, 'Bounded influence')"
        )


@dataclass(frozen=True)
class ValueBounds:
    """Where every value of a run lies, as its public configuration states it (protocol scale): the
    certified stop's candidates are node values, so one outside is no honest candidate.

    Attributes
    ----------
    lo, hi : the bounds, both included (``-inf``/``inf`` where the configuration sets none).
    where : the refusal's reason: what states the bounds.
    """

    lo: float
    hi: float
    where: str

    def cand_error(self, node: int, t: int, cand: float) -> str | None:
        """Why the candidate ``cand`` that ``x_node^(t)`` carries is no value of the run (None: it may
        be one)."""
        if self.lo <= cand <= self.hi:
            return None
        return f"cand of x_{node}^({t})={cand!r}: {self.where} (docs/protocol.md, 'Bounded influence')"


def value_bounds(cfg: RunConfig) -> ValueBounds | None:
    """Where every value of the run ``cfg`` (resolved) lies; None: anywhere (a run without a range whose
    initialization is not one-sided).

    With a declared range, ``[s_lo, s_hi]`` (:func:`_value_bounds`). Without one, a node refuses a
    value its one-sided start does not lie beyond (:func:`~nlagg_node.valuechecks.start_problem`):
    every value lies below a from-above start (max's), above a from-below one (min's)."""
    if cfg.value_range is not None:
        lo, hi = _value_bounds(cfg)
        return ValueBounds(
            lo, hi, f"outside [{lo:.6g}, {hi:.6g}], where every value of this run lies (value_range)"
        )
    from ..valuechecks import one_sided_starts

    starts = one_sided_starts(cfg)
    if not starts:
        return None
    above = [start for kind, start in starts if kind == "from-above"]
    below = [start for kind, start in starts if kind == "from-below"]
    lo = math.nextafter(max(below), math.inf) if below else -math.inf
    hi = math.nextafter(min(above), -math.inf) if above else math.inf
    sides = ([f"below the from-above start {min(above):.6g}"] if above else []) + (
        [f"above the from-below start {max(below):.6g}"] if below else []
    )
    where = f"not {' and '.join(sides)}, where every value of this run lies (check_start refuses any other)"
    return ValueBounds(lo, hi, where)


def _value_bounds(cfg: RunConfig) -> tuple[float, float]:
    """``[s_lo, s_hi]``: the range ``[0, 1]``, widened where a DP baseline adds noise to the values
    (bounded for all n nodes at once except with probability :data:`FAILURE`)."""
    noise, sigma, n = value_noise(cfg), cfg.sigma_s, cfg.n
    if noise == "gauss":  # P(|N(0, s^2)| > k s) <= 2 exp(-k^2 / 2), for n nodes
        k = math.sqrt(2.0 * math.log(2.0 * n / FAILURE))
    elif noise == "laplace":  # std s, scale s / sqrt 2: P(|L| > k s) = exp(-k sqrt 2)
        k = math.log(n / FAILURE) / math.sqrt(2.0)
    else:
        k = 0.0
    return 0.0 - k * sigma, 1.0 + k * sigma


def _flow(phase: Phase, n: int, width: float) -> float:
    """``F_p``: the norm of the fixed point's flow ``w`` (module docstring)."""
    obj = phase.objective
    g = n * width if obj.kind == "quadratic" else 2.0 * n * min(obj.alpha, obj.beta)
    return math.sqrt(2.0 * (n - 1)) * g / 2.0


def x_envelope(
    cfg: RunConfig, phases: Sequence[Phase], neighbours: Sequence[Sequence[int]]
) -> XEnvelope | None:
    """The envelope of the honest x's of a run (its resolved ``cfg``, its ``phases`` and every node's
    ``neighbours``); None without a declared value range (no bound is known)."""
    if cfg.value_range is None:
        return None
    n = len(neighbours)
    s_lo, s_hi = _value_bounds(cfg)
    width, root = s_hi - s_lo, math.sqrt(sum(len(nb) for nb in neighbours))  # sqrt(N), N = 2E duals
    cs = [phase_c(cfg, ph) for ph in phases]
    flows = [_flow(ph, n, width) for ph in phases]
    departures = n - 1 if departure_refusal(cfg.op, cfg.early_stop, cfg.may_depart) is None else 0
    moved = departures * max(c * width * root + 2.0 * f for c, f in zip(cs, flows, strict=True))
    radius: list[float] = []
    r = 0.0
    for p, ph in enumerate(phases):
        c = cs[p]
        if p == 0 or ph.group != phases[p - 1].group:  # a fresh z^(0) exchange
            init = ph.init
            mu, sigma = (0.0, 0.0) if init.kind == "zero" else (init.mean_per_sign(), init.sigma_z)
            r = max(abs(mu + c * s_lo), abs(mu + c * s_hi)) * root + sigma * (root + _R) + flows[p]
        else:  # the same duals, another objective: the fixed point moves
            shift = max(abs(cs[p - 1] * s_hi - c * s_lo), abs(cs[p - 1] * s_lo - c * s_hi))
            r += shift * root + flows[p - 1] + flows[p]
        radius.append((r + moved) / c)
    scale = tuple(1.0 if departures or not nb else 1.0 / math.sqrt(len(nb)) for nb in neighbours)
    return XEnvelope(s_lo, s_hi, tuple(radius), scale, Schedule.of(phases))


def output_error(
    envelope: XEnvelope, node: int, output: Sequence[float], pulls: Mapping[int, float], scale: ValueScale
) -> str | None:
    """Why node ``node``'s ``output`` (protocol scale) cannot be the run's: it lies outside the
    values' range. ``pulls``: per neighbour still here, ``-u_{node|j} / c``, where its dual pulls
    the node's x (x is a proximal step of their sum); the suspects are those beyond the range on the
    output's side, else the one pulling farthest that way. ``scale`` maps to the user's units."""
    slack = 1e-9 * (envelope.s_hi - envelope.s_lo)
    bad = [v for v in output if not envelope.s_lo - slack <= v <= envelope.s_hi + slack]
    if not bad:
        return None
    high = bad[0] > envelope.s_hi
    edge = envelope.s_hi if high else envelope.s_lo
    side = sorted(pulls, key=lambda j: -pulls[j] if high else pulls[j])
    suspects = [j for j in side if (pulls[j] > edge if high else pulls[j] < edge)] or side[:1]
    lo, hi = scale.user_float(envelope.s_lo), scale.user_float(envelope.s_hi)
    return (
        f"node {node}: output {scale.user_float(bad[0]):.6g} lies {'above' if high else 'below'} the"
        f" values' range [{lo:.6g}, {hi:.6g}]; suspect neighbour(s) {suspects} (their x's pulled it"
        " there), unless the run did not converge (raise t_max)"
    )
