"""The paper's PDMM/ADMM updates as pure functions over flat arrays (and their scalar forms).

This module is the one place where the equations live. The batched simulator,
the networked node and the adversary's replay all call these functions, so a
trajectory computed anywhere is bit-for-bit the trajectory computed elsewhere.
The x-update has an array form (:func:`x_update`) and a scalar one (:func:`x_one`,
:func:`x_piecewise`: the compiled kernel's and a lone node's), element-wise the same.

Conventions (paper Sec. II and ``NOTES.md``)
--------------------------------------------
For an edge ``(i, j)``: ``a_ij = +1`` if ``i < j`` and ``a_ji = -1``; ``b_ij = 0``.
Node ``i`` keeps a dual ``z_{i|j}`` per neighbour. We store the *signed* dual
``u_{i|j} = a_ij z_{i|j}``: multiplying by +-1 is exact, it removes the signs from
every update, and the wire protocol carries ``z = a u``.

With ``v_i = sum_j a_ij z_{i|j} = sum_j u_{i|j}`` (summed in ascending neighbour id),
every local objective of the paper has a closed-form x-update:

* piecewise-linear ``f_i(x) = alpha (x - s_i)_+ + beta (s_i - x)_+`` (max: alpha = 1,
  beta = inf, eq. (xi_up); min: alpha = inf, beta = 1; median: alpha = beta = 1,
  eq. (x_update_eq); quantile: alpha = q, beta = 1 - q)::

      lo = (-alpha - v_i) / (c d_i),  hi = (beta - v_i) / (c d_i)
      x_i = lo if lo > s_i  else  hi if hi < s_i  else  s_i

* quadratic ``f_i(x) = (x - s_i)^2 / 2`` (average consensus)::

      x_i = (s_i - v_i) / (1 + c d_i)

and the z-update of eq. (z_update)/(zji_up), for the directed edge ``j -> i``::

      z_{j|i} <- (1 - theta) z_{j|i} + theta (z_{i|j} + 2 c a_ij x_i)
      u_{j|i} <- (1 - theta) u_{j|i} - theta (u_{i|j} + 2 c x_i)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .arrays import FloatArray, IntArray


@dataclass(frozen=True)
class Objective:
    """A node's local objective ``f_i`` and hence its x-update.

    Attributes
    ----------
    kind
        ``"piecewise"`` for ``alpha (x - s)_+ + beta (s - x)_+`` (the indicator
        functions of max/min are the limits ``beta = inf`` / ``alpha = inf``),
        ``"quadratic"`` for ``(x - s)^2 / 2``.
    alpha, beta
        Slopes above and below ``s_i`` (piecewise only).
    """

    kind: Literal["piecewise", "quadratic"]
    alpha: float = 1.0
    beta: float = 1.0

    @classmethod
    def maximum(cls) -> Objective:
        """``x + I{x >= s}``: eq. (xi_up)."""
        return cls("piecewise", 1.0, math.inf)

    @classmethod
    def minimum(cls) -> Objective:
        """``-x + I{x <= s}``: the min counterpart of eq. (xi_up)."""
        return cls("piecewise", math.inf, 1.0)

    @classmethod
    def median(cls) -> Objective:
        """``|x - s|``: eq. (x_update_eq)."""
        return cls("piecewise", 1.0, 1.0)

    @classmethod
    def quantile(cls, q: float) -> Objective:
        """``rho_q(x - s)`` with the paper's q counted from the top (see :func:`paper_q`)."""
        return cls("piecewise", q, 1.0 - q)

    def pinned_low(self, n: int) -> Objective:
        """The same objective tilted so that the lower end of a flat minimum is the only minimizer.

        Where ``n p`` is an integer (the median of an even number of values), the sum
        ``sum_i f_i`` is flat between the ``k``-th and ``(k+1)``-th smallest values
        (:func:`order_of`), so a run may settle anywhere between them and the ideal world exposes
        neither. Adding ``tau x`` to each of the ``n`` local objectives, ``tau = (alpha + beta) /
        (2 n)``, gives the flat stretch the slope ``(alpha + beta) / 2`` and leaves the ``k``-th
        smallest value the only minimizer, with the slopes around it symmetric (``-+ (alpha + beta)
        / 2``), as around an odd-n median. ``alpha (x - s)_+ + beta (s - x)_+ + tau x`` is, up to
        a constant, the piecewise objective with slopes ``alpha + tau`` and ``beta - tau``.
        """
        tau = (self.alpha + self.beta) / (2 * n)
        return Objective("piecewise", self.alpha + tau, self.beta - tau)

    @classmethod
    def average(cls) -> Objective:
        """``(x - s)^2 / 2``: average consensus (the trimmed mean's third part)."""
        return cls("quadratic")


def paper_q(p: float) -> float:
    """Map a conventional quantile level ``p`` to the paper's ``q = 1 - p``.

    The paper's loss ``rho_q(x - s_i)`` converges to the value with
    ``#above / #below = q / (1 - q)``; the conventional p-quantile has a fraction
    ``p`` of the values below it, so ``q = 1 - p`` (``p = 5/7`` gives the paper's
    ``q = 2/7``, the 5th-largest of 15).
    """
    return 1.0 - p


def order_of(n: int, p: float) -> int:
    """The ``k`` (1-based) of the ``k``-th smallest of ``n`` values, the p-quantile a run outputs.

    ``ceil(n p)``: the value with a fraction ``p`` of the values at or below it. Where ``n p`` is
    an integer (:func:`is_flat`) every point between the ``k``-th and ``(k+1)``-th smallest
    minimizes the loss, and the run outputs the lower one, ``k = n p``
    (:meth:`Objective.pinned_low`).
    """
    return math.ceil(n * p - 1e-12)


def is_flat(n: int, p: float) -> bool:
    """Whether the p-quantile loss of ``n`` values is flat between two of them (``n p`` an integer)."""
    return abs(n * p - round(n * p)) < 1e-12


def dual_sum(u: FloatArray, src: IntArray, n_nodes: int) -> FloatArray:
    """``v_i = sum_j a_ij z_{i|j}``, the dual term of every x-update.

    ``np.bincount`` adds sequentially in array order; the edge layouts of
    :mod:`nlagg_node.graphs` list each node's out-edges by ascending neighbour, so
    every runtime sums in the same order and gets the same bits.
    """
    return np.bincount(src, weights=u, minlength=n_nodes).astype(np.float64, copy=False)


def dual_sum_one(u: Iterable[float]) -> float:
    """:func:`dual_sum` for one node: its signed duals added in order from 0.0, as
    ``np.bincount`` adds them (the same bits), on Python floats."""
    v = 0.0
    for ui in u:
        v += ui
    return v


def x_piecewise(v: float, s: float, cd: float, alpha: float, beta: float) -> float:
    """Piecewise-linear x-update of one node (eqs. (xi_up), (x_update_eq)), on scalars.

    ``lo = (-alpha - v) / cd`` if it lies above ``s``, else ``hi = (beta - v) / cd`` if it
    lies below ``s``, else ``s`` itself (a matching event). The simulator's compiled kernel and
    a lone node (:func:`x_one`) call this very function; :func:`x_update` is its elementwise
    form over arrays, with the same bits.
    """
    lo = (-alpha - v) / cd
    if lo > s:
        return lo
    hi = (beta - v) / cd
    return hi if hi < s else s


def x_quadratic(v: Any, s: Any, cd: Any) -> Any:
    """Average-consensus x-update ``(s - v) / (1 + c d)``, elementwise on scalars or arrays."""
    return (s - v) / (1.0 + cd)


def x_update(objective: Objective, v: FloatArray, s: FloatArray, cd: FloatArray) -> FloatArray:
    """The primal update ``x_i^(t)`` for every node (eq. (x_update) in closed form).

    Parameters
    ----------
    objective
        The local objective shared by all nodes in this phase.
    v
        :func:`dual_sum` of the current signed duals.
    s
        The value each node uses in its objective (``-inf`` for a top-K node that
        bypasses the max, eq. (topk_xi)).
    cd
        ``c * d_i`` per node.
    """
    if objective.kind == "quadratic":
        return np.asarray(x_quadratic(v, s, cd), dtype=np.float64)
    # An infinite slope's candidate can never be picked (max: hi = +inf, min: lo = -inf), so the
    # clip is one-sided; np.minimum(inf, s) is s and np.maximum(-inf, m) is m, bit for bit.
    if objective.beta == math.inf:
        return np.maximum((-objective.alpha - v) / cd, s)
    if objective.alpha == math.inf:
        return np.minimum((objective.beta - v) / cd, s)
    lo, hi = linear_branch(objective, v, cd)
    # lo < hi, so clipping s to [lo, hi] picks lo if lo > s, hi if hi < s, else s: x_piecewise.
    return np.maximum(lo, np.minimum(hi, s))


def x_one(objective: Objective, v: float, s: float, cd: float) -> float:
    """:func:`x_update` of one node on Python floats, with the same bits (a lone node's hot path).

    No numpy call: on a host shared by many node processes, each numpy call on a small array
    cost a lone node tens of microseconds per iteration, paid with cold caches at every
    wake-up (``benchmarks/bench_testbed.py``, one process per node).
    """
    if objective.kind == "quadratic":
        return float(x_quadratic(v, s, cd))
    return x_piecewise(v, s, cd, objective.alpha, objective.beta)


def linear_branch(objective: Objective, v: FloatArray, cd: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The two linear-branch candidates ``(lo, hi)`` of a piecewise x-update.

    The adversary replays these: if a published ``x_i`` equals neither, it is ``s_i``.
    """
    return (-objective.alpha - v) / cd, (objective.beta - v) / cd


def z_update(u: Any, u_rev: Any, x_dst: Any, c: float, theta: float) -> Any:
    """Signed z-update of eq. (zji_up), elementwise on scalars or arrays.

    ``u'_{j|i} = (1 - theta) u_{j|i} - theta (u_{i|j} + 2 c x_i)`` where, for the
    directed edge ``j -> i``, ``u_rev = u_{i|j}`` and ``x_dst = x_i``. All arguments
    are the values at iteration t (update both directions of an edge from the old
    values). The simulator's compiled kernel calls this very function on scalars.
    """
    return (1.0 - theta) * u - theta * (u_rev + 2.0 * c * x_dst)
