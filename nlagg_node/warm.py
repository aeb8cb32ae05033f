"""Warm starts: the next epoch's initialization from the previous epoch's public output.

A deployment that aggregates epoch after epoch publishes every output; every node (and the ideal
world's adversary) holds it, so it may steer the next epoch's z^(0) at no privacy cost:

* median and quantiles: the paper's prior-informed start (Sec. IV-B, "Optimality analysis" of
  median consensus) with the prior at the last output ``y``: ``z_{i|j}^(0) ~ N(-a_ij c y,
  sigma_z^2)``, so that ``x_i^(0)`` starts near ``y`` (the ``prior`` kind of
  :class:`~nlagg_node.init.DualInitSpec`), with a step parameter ``c`` large enough that the
  sensitive window of eq. (x_update_eq), ``2 / (c d_i)`` wide, is no wider than the drift band
  (:func:`warm_c`): the start is already within ``D`` of the answer, so smaller steps cost little
  and keep the transient off the median's neighbours;
* max (min): the paper's one-sided start (Algorithm 1, ``z_{i|j}^(0) ~ N(-+a_ij mu_z, sigma_z^2)``
  and the condition ``(-1 - sum_j a_ij z_{i|j}^(0)) / (c d_i) > s_i`` of eq. (condition_P) at
  t = 0), centred just beyond ``y``: x starts at about ``y +- margin``, where ``margin`` leaves room
  for the declared drift (:func:`warm_margin`).

The declared drift ``D`` bounds how far any value moves between two epochs (a fraction of the
declared value range, or value units without one). The one-sided warm start is safe while every
value lies on the protected side of the bound ``b = y + D`` (max; ``y - D`` for min): then every
value lies below the start and eq. (condition_P) holds at t = 0 for every non-maximum node, as in
a cold start.

Safety rule (docs/epochs.md, "When values move further than declared"): a node whose value lies
beyond ``b`` does not run the epoch with its value. It runs it with its value *compressed* into
``(b, b + w)`` by the public increasing map :meth:`WarmStart.used_value` (``w = D``, the margin keeps
``b + w`` below the start), so its x never starts at its value. The warm run is then an ordinary
max consensus of the values under a public increasing map: its output lies beyond ``b`` if and only
if some value did, every node sees that (:meth:`WarmStart.falls_back`), discards the warm output
and reruns the epoch cold (fresh z^(0) from the cold initialization). The one public fact this
adds, "a value lies beyond y + D", is implied by the cold rerun's output anyway (the maximum then
exceeds ``y + D``), and the warm run exposes what a max consensus exposes: its maximum's holder
(the cold rerun's, exposed there too) and, with a non-maximum node's usual small probability,
another node's compressed value.

Every function here is pure: the simulator (:mod:`nlagg_node.sim.epochs`) and the node runtime call
the same ones. Positions (``last_output``, bounds, values) of a :class:`WarmStart` are on the
protocol's scale (:mod:`nlagg_node.scale`: ``(s - lo) / (hi - lo)`` with a declared range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .init import DualInitSpec

__all__ = [
    "WARM_C_FACTOR",
    "WARM_OPERATORS",
    "WarmStart",
    "drift_on_protocol",
    "warm_c",
    "warm_margin",
    "warm_start",
]

WARM_C_FACTOR = 10.0
"""A prior-informed warm start's ``c`` is at most this many times the run's (:func:`warm_c`)."""

WARM_OPERATORS: tuple[str, ...] = ("max", "min", "median", "quantile")
"""Operators with a warm start (one phase each); the others run every epoch cold."""

WarmKind = Literal["from-above", "from-below", "prior"]


def drift_on_protocol(drift: float, value_range: tuple[float, float] | None) -> float:
    """The declared drift on the protocol's scale.

    With a declared range the drift is a fraction of it, which is what it is on the protocol's
    [0, 1] scale; without one it is in the values' units, which are the protocol's.
    """
    if not (math.isfinite(drift) and drift >= 0.0):
        raise ValueError(f"drift must be a finite number >= 0, got {drift}")
    del value_range  # the same number either way; the argument states which reading applies
    return float(drift)


def warm_margin(drift: float, c: float, sigma_z: float) -> float:
    """How far beyond the last output a one-sided warm start puts x, on the protocol's scale.

    ``2 D + (1 + 3 sigma_z) / c``: the values lie below ``b = y + D`` as declared, a compressed value
    below ``b + D`` (:meth:`WarmStart.used_value`), and ``x_i^(0)`` lies ``1 / (c d_i)`` below the
    centre of the start with dual noise of standard deviation at most ``sigma_z / c``
    (eq. (xi_up) at t = 0 with ``z^(0) ~ N(-a_ij mu_z, sigma_z^2)``): ``(1 + 3 sigma_z) / c`` keeps
    eq. (condition_P) at t = 0 for every value below ``b + D`` (three standard deviations of the noise).
    """
    return 2.0 * drift + (1.0 + 3.0 * sigma_z) / c


def warm_c(op: str, drift: float, c: float) -> float:
    """The step parameter of a warm-started epoch.

    Median and quantile: ``max(c, min(1 / D, 10 c))``, so that the half-width ``1 / (c d_i)`` of
    eq. (x_update_eq)'s sensitive window is at most ``D`` (``d_i >= 1``): a value farther than the
    drift from the prior is never inside the window at t = 0, and the transient around the start,
    whose reach shrinks as ``1 / c``, stays off the neighbouring values (measured: docs/epochs.md).
    The iterations hardly grow: the start lies within ``D`` of the answer, and the geometric tail of
    a piecewise-linear objective does not depend on ``c``. Max and min keep ``c``: their start is
    one-sided and a larger ``c`` only slows the descent from it.
    """
    if op not in ("median", "quantile"):
        return c
    wide = c * WARM_C_FACTOR
    return max(c, min(1.0 / drift, wide)) if drift > 0.0 else wide


@dataclass(frozen=True)
class WarmStart:
    """The initialization of an epoch warm-started at the previous epoch's output.

    Attributes
    ----------
    kind
        ``from-above`` (max), ``from-below`` (min) or ``prior`` (median, quantile).
    init
        The distribution of z^(0) (:func:`nlagg_node.init.draw_z0` draws a node's duals from it).
    c
        The epoch's step parameter (:func:`warm_c`; ``init.c`` is the same): every node runs the
        epoch's x- and z-updates with it.
    last_output
        ``y``, the previous epoch's public output, on the protocol's scale.
    drift
        ``D`` on the protocol's scale.
    bound
        One-sided: ``b = y + D`` (max) or ``y - D`` (min): the values the start protects lie on
        this side of it. ``prior``: ``y`` (no node's value lies beyond a two-sided start).
    """

    kind: WarmKind
    init: DualInitSpec
    c: float
    last_output: float
    drift: float
    bound: float

    @property
    def one_sided(self) -> bool:
        return self.kind != "prior"

    @property
    def start(self) -> float:
        """Where x starts, about (before the ``1 / (c d_i)`` of the linear branch and the noise)."""
        if self.kind == "prior":
            return self.init.prior_median
        sign = 1.0 if self.kind == "from-above" else -1.0
        return self.init.center + sign * self.init.mu_z / self.init.c

    def violated(self, value: float) -> bool:
        """A node's local check: its value lies beyond the bound (the declared drift did not hold).

        Always False for the two-sided ``prior`` start (its start is a public point inside the
        values, as the cold prior at the range's midpoint is).
        """
        if self.kind == "from-above":
            return value > self.bound
        if self.kind == "from-below":
            return value < self.bound
        return False

    def used_value(self, value: float) -> float:
        """The value a node runs the warm epoch with (protocol scale).

        Its own value where :meth:`violated` is False; else the value compressed into
        ``(b, b + D)`` (``(b - D, b)`` for min) by the public increasing map
        ``b + D delta / (delta + D)``, ``delta`` the distance beyond ``b``, so that x never starts at
        it and the order of the values beyond ``b`` is kept.
        """
        if not self.violated(value):
            return value
        w = self.drift if self.drift > 0.0 else 1.0 / self.init.c
        delta = abs(value - self.bound)
        step = w * delta / (delta + w)
        return self.bound + step if self.kind == "from-above" else self.bound - step

    def falls_back(self, output: float) -> bool:
        """The output check every node makes after the warm run: True when its output lies beyond
        the bound, i.e. some value did; the epoch is then rerun cold and the warm output discarded."""
        return self.violated(output)


def warm_start(
    op: str,
    last_output: float,
    *,
    drift: float,
    c: float,
    sigma_z: float,
    value_range: tuple[float, float] | None = None,
) -> WarmStart:
    """The warm start of the next epoch of ``op`` from the previous epoch's output.

    Parameters
    ----------
    op
        ``max``, ``min``, ``median`` or ``quantile`` (:data:`WARM_OPERATORS`).
    last_output
        The previous epoch's public output, in the values' units.
    drift
        The declared drift ``D``: the most any value moves between two epochs, a fraction of
        ``value_range`` when one is declared, else in the values' units.
    c
        The run's PDMM step parameter (the warm epoch's is :func:`warm_c` of it).
    sigma_z
        Standard deviation of z^(0) (the run's ``sigma_z``).
    value_range
        The public value range ``(lo, hi)``, or None (values used as given).

    Returns
    -------
    WarmStart
        Its ``init`` is on the protocol's scale, as a cold start's is, with the epoch's ``c``
        (:func:`warm_c`): max (min) draws
        ``z_{i|j}^(0) ~ N(-+a_ij (mu_z + -c y), sigma_z^2)`` with ``mu_z = c`` :func:`warm_margin`, so
        that ``x^(0)`` starts about ``y +- margin`` (Algorithm 1 centred at ``y``); median and
        quantile draw ``z_{i|j}^(0) ~ N(-a_ij c y, sigma_z^2)`` (the prior-informed start at ``y``).
    """
    if op not in WARM_OPERATORS:
        raise ValueError(f"op {op!r} has no warm start (one of {', '.join(WARM_OPERATORS)})")
    if not (math.isfinite(c) and c > 0.0):
        raise ValueError(f"c must be a finite number > 0, got {c}")
    d = drift_on_protocol(drift, value_range)
    y = float(last_output)
    if value_range is not None:
        lo, hi = value_range
        y = (y - lo) / (hi - lo)
    c = warm_c(op, d, c)
    if op in ("median", "quantile"):
        spec = DualInitSpec(kind="prior", mu_z=0.0, sigma_z=sigma_z, c=c, prior_median=y)
        return WarmStart("prior", spec, c, y, d, y)
    margin = warm_margin(d, c, sigma_z)
    kind: WarmKind = "from-above" if op == "max" else "from-below"
    spec = DualInitSpec(kind=kind, mu_z=c * margin, sigma_z=sigma_z, c=c, center=y)
    return WarmStart(kind, spec, c, y, d, y + d if op == "max" else y - d)
