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

The declared drift ``D`` bounds how far the output moves between two epochs (it does when no
value moves further: every warm operator is 1-Lipschitz in the largest move). So the warm start
expects the output in the *band* ``[y - D, y + D]``, one-sided for max (``x <= y + D``) and min
(``x >= y - D``). The start protects every value on the far side of the band as the cold start
protects every value (eq. (condition_P) at t = 0 for max: every value below the band lies below the
start), but a value beyond the band would be crossed by the trajectories or, for max, lie above the
start and be published at t = 0.

Safety rule, band and shell (docs/epochs.md, "When values move further than declared"): a node
whose value lies outside the band never runs the warm epoch with it. It runs it with a fresh
random value in the *shell* of width ``D`` just outside the band on its side (its outer half:
:meth:`WarmStart.used_value`, a uniform draw from the node's own generator). Every operator here
is an order statistic, and each node keeps its side of the band, so

* while the aggregate lies in the band (the declaration held), the warm run's output is the exact
  aggregate: the order statistic is an in-band node's own value;
* otherwise the output is a shell value, outside the band: every node sees it
  (:meth:`WarmStart.falls_back`), discards it and reruns the epoch cold (fresh z^(0) from the cold
  initialization, the run's own ``c``).

What the warm run can reveal of a node outside the band is its shell value, which is noise, and so
its side of the band: the ideal world's above/below side information of the median (paper Sec.
IV-B), and for max only on a fallback. The fallback itself is one public bit, "the aggregate moved
further than declared", which the cold rerun's output reveals anyway (it lies outside the band);
beside it an eavesdropper can tell which node held the warm run's output, one node outside the
band on the side the aggregate moved to. No value outside the band enters the warm epoch.

Every function here is pure: the simulator (:mod:`nlagg_node.sim.multiepoch`) and the node runtime call
the same ones. Positions (``last_output``, bounds, values) of a :class:`WarmStart` are on the
protocol's scale (:mod:`nlagg_node.valuechecks`: ``(s - lo) / (hi - lo)`` with a declared range).
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

    ``D + w + (1 + 3 sigma_z) / c`` with the shell's width ``w`` (``D``, or ``1 / c`` for ``D = 0``):
    the values lie below the band's edge ``y + D`` or, run in its shell, below ``y + D + w``
    (:meth:`WarmStart.used_value`), and ``x_i^(0)`` lies ``1 / (c d_i)`` below the centre of the
    start with dual noise of standard deviation at most ``sigma_z / c`` (eq. (xi_up) at t = 0 with
    ``z^(0) ~ N(-a_ij mu_z, sigma_z^2)``): ``(1 + 3 sigma_z) / c`` keeps eq. (condition_P) at t = 0
    for every value below ``y + D + w`` (three standard deviations of the noise). With a declared
    range :func:`warm_start` ends the band and the shell at the range's top (no value lies above
    it), so a warm start never lies farther out than ``(1 + 3 sigma_z) / c`` beyond the range.
    """
    return drift + _shell(drift, c) + (1.0 + 3.0 * sigma_z) / c


def _shell(drift: float, c: float) -> float:
    return drift if drift > 0.0 else 1.0 / c


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
        ``D`` on the protocol's scale: the half-width of the band and the width of each shell.
    band_lo, band_hi
        The band ``[y - D, y + D]`` where the output is expected (``-inf`` below for max, ``+inf``
        above for min; a one-sided band ends at the declared range, which no value leaves).
    shell
        The width of each shell: ``D`` (``1 / c`` for ``D = 0``), up to the declared range's end.
    """

    kind: WarmKind
    init: DualInitSpec
    c: float
    last_output: float
    drift: float
    band_lo: float
    band_hi: float
    shell: float

    @property
    def start(self) -> float:
        """Where x starts, about (before the ``1 / (c d_i)`` of the linear branch and the noise)."""
        if self.kind == "prior":
            return self.init.prior_median
        sign = 1.0 if self.kind == "from-above" else -1.0
        return self.init.center + sign * self.init.mu_z / self.init.c

    def in_band(self, value: float) -> bool:
        """A node's local check: its value (protocol scale) lies in the band and runs as is."""
        return self.band_lo <= value <= self.band_hi

    def used_value(self, value: float, u: float) -> float:
        """The value a node runs the warm epoch with (protocol scale).

        Parameters
        ----------
        value
            The node's value.
        u
            A fresh uniform draw in ``[0, 1)`` from the node's own generator.

        Returns
        -------
        float
            ``value`` where :meth:`in_band`; else ``band_hi + w (1 + u) / 2`` above the band,
            ``band_lo - w (1 + u) / 2`` below it: uniform in the outer half of the shell of width
            ``w`` on its side (``w`` = :attr:`shell`), so that an output from a shell lies at least
            ``w / 2`` beyond the band, far beyond the run's tolerance (:meth:`falls_back`).
        """
        if self.in_band(value):
            return value
        step = self.shell * (1.0 + u) / 2.0
        return self.band_hi + step if value > self.band_hi else self.band_lo - step

    def falls_back(self, output: float) -> bool:
        """The output check every node makes on its own output after the warm run.

        True when the output lies more than ``w / 4`` beyond the band: the aggregate moved
        further than declared (the output is a shell value, at least ``w / 2`` out), and the epoch
        reruns cold with the warm output discarded. The quarter shell lets every node decide alike
        on outputs that agree within the run's tolerance. A shell of width 0 (the band ends at the
        declared range) never falls back: no value lies beyond it.
        """
        if self.shell <= 0.0:
            return False
        slack = self.shell / 4.0
        return output > self.band_hi + slack or output < self.band_lo - slack


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
    w = _shell(d, c)
    if op in ("median", "quantile"):
        spec = DualInitSpec(kind="prior", mu_z=0.0, sigma_z=sigma_z, c=c, prior_median=y)
        return WarmStart("prior", spec, c, y, d, y - d, y + d, w)
    guard = (1.0 + 3.0 * sigma_z) / c
    # Distances above (max) or below (min) the last output; a declared range ends both.
    edge, top = d, d + w
    if value_range is not None:
        room = 1.0 - y if op == "max" else y
        edge, top = min(edge, room), min(top, room)
    margin = top + guard
    if op == "max":
        spec = DualInitSpec(kind="from-above", mu_z=c * margin, sigma_z=sigma_z, c=c, center=y)
        return WarmStart("from-above", spec, c, y, d, -math.inf, y + edge, top - edge)
    spec = DualInitSpec(kind="from-below", mu_z=c * margin, sigma_z=sigma_z, c=c, center=y)
    return WarmStart("from-below", spec, c, y, d, y - edge, math.inf, top - edge)
