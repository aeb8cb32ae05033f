"""The signed duals of the nodes one protocol loop hosts, between iterations.

Two forms of one state, with the same numbers bit for bit (:mod:`nlagg_node.pdmm`'s functions,
element-wise the same operations in the same order):

* :class:`FlatDuals` for several hosted nodes: one flat numpy vector, node after node with
  neighbours ascending, ``[u_{i|j} of every node; u_{j|i} of every node]``, so each iteration
  is one :func:`~nlagg_node.pdmm.x_update` and one :func:`~nlagg_node.pdmm.z_update` over all
  of them (one coroutine per node, with numpy calls on five-element arrays, spent more on
  scheduling and call overhead than on the math).
* :class:`LoneDuals` for one node (a process per node, as deployed): Python floats and the
  scalar forms (:func:`~nlagg_node.pdmm.dual_sum_one`, :func:`~nlagg_node.pdmm.x_one`,
  :func:`~nlagg_node.pdmm.z_update` per element). On a host shared by many node processes each
  numpy call is paid with cold caches at every wake-up: the numpy form cost a lone node about
  70 us more per iteration (``benchmarks/bench_testbed.py``, one process per node, n = 15).

``u_{j|i}`` is the node's copy of its neighbour's dual (PDMM's broadcast form: after the z^(0)
exchange only x's travel). A neighbour that departs leaves both vectors at the z-update of its
departure (:mod:`nlagg_node.departure`), the others keeping their order.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ..pdmm import Objective, dual_sum, dual_sum_one, x_one, x_update, z_update

__all__ = ["Duals", "FlatDuals", "LoneDuals", "duals_for"]


class Duals(Protocol):
    """What the protocol loop asks of the duals of its hosted nodes (k: a node's index in the loop)."""

    def start(self, u_out: list[list[float]], u_in: list[list[float]]) -> None:
        """Set every node's ``u_{i|j}`` and ``u_{j|i}`` (its neighbours still here, ascending)."""
        ...

    def x(self, objective: Objective, s: list[float], c: float) -> list[float]:
        """Every node's ``x_i`` of this iteration (its value if no neighbour is left)."""
        ...

    def update(self, got: list[float], c: float, theta: float, keep: list[bool] | None) -> None:
        """The z-update after :meth:`x`: ``got`` holds the neighbours' x's, node after node, in the
        slots before this iteration's departures; ``keep`` (one flag per slot) drops the departed."""
        ...

    def of(self, k: int) -> tuple[list[float], list[float]]:
        """Node k's ``(u_{i|j}, u_{j|i})`` (for its checkpoint and, if corrupted, its state)."""
        ...


class FlatDuals:
    """Several nodes' duals in one numpy vector (see the module)."""

    def __init__(self, degrees: list[int]) -> None:
        self._layout(degrees)
        self.w: NDArray[np.float64] = np.zeros(2 * self.d)
        self._x: NDArray[np.float64] = np.zeros(len(degrees))
        self._s: list[float] = []
        self._s_arr: NDArray[np.float64] = np.zeros(0)

    def _layout(self, degrees: list[int]) -> None:
        deg = np.array(degrees, dtype=np.int64)
        self.h, self.d = len(degrees), int(deg.sum())
        bounds = np.concatenate([[0], np.cumsum(deg)]).tolist()
        self.own = [slice(bounds[k], bounds[k + 1]) for k in range(self.h)]
        self.owner = np.repeat(np.arange(self.h), deg)
        self.swap = np.concatenate([np.arange(self.d, 2 * self.d), np.arange(self.d)])
        self.deg = deg.astype(np.float64)
        self.linked = bool(deg.all())
        self.x_dst = np.empty(2 * self.d)

    def start(self, u_out: list[list[float]], u_in: list[list[float]]) -> None:
        self.w = np.array([u for us in u_out for u in us] + [u for us in u_in for u in us], dtype=np.float64)

    def x(self, objective: Objective, s: list[float], c: float) -> list[float]:
        v = dual_sum(self.w[: self.d], self.owner, self.h)
        cd = self.deg * c
        if s is not self._s:  # a phase's values, the same list every iteration
            self._s, self._s_arr = s, np.array(s, dtype=np.float64)
        s_arr = self._s_arr
        if self.linked:
            x = x_update(objective, v, s_arr, cd)
        else:  # a node with no neighbour left: its x is its value (nlagg_node.departure)
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.where(cd > 0, x_update(objective, v, s_arr, cd), s_arr)
        self._x = x
        out: list[float] = x.tolist()
        return out

    def update(self, got: list[float], c: float, theta: float, keep: list[bool] | None) -> None:
        d, w, x_dst = self.d, self.w, self.x_dst
        x_dst[:d] = got
        x_dst[d:] = self._x[self.owner]
        if keep is not None:
            mask = np.array(keep + keep)
            w, x_dst = w[mask], x_dst[mask]
            self._layout([sum(keep[sl]) for sl in self.own])
        self.w = z_update(w, w[self.swap], x_dst, c, theta)

    def of(self, k: int) -> tuple[list[float], list[float]]:
        sl, d = self.own[k], self.d
        out: list[float] = self.w[:d][sl].tolist()
        into: list[float] = self.w[d:][sl].tolist()
        return out, into


class LoneDuals:
    """One node's duals as Python floats (see the module)."""

    def __init__(self, degree: int) -> None:
        self.d = degree
        self.out: list[float] = [0.0] * degree
        self.into: list[float] = [0.0] * degree
        self._x = 0.0

    def start(self, u_out: list[list[float]], u_in: list[list[float]]) -> None:
        (out,), (into,) = u_out, u_in
        self.out, self.into, self.d = list(out), list(into), len(out)

    def x(self, objective: Objective, s: list[float], c: float) -> list[float]:
        if self.d == 0:  # no neighbour left: its x is its value (nlagg_node.departure)
            self._x = s[0]
        else:
            self._x = x_one(objective, dual_sum_one(self.out), s[0], float(self.d) * c)
        return [self._x]

    def update(self, got: list[float], c: float, theta: float, keep: list[bool] | None) -> None:
        out, into, x = self.out, self.into, self._x
        if keep is not None:
            got = [g for g, kept in zip(got, keep, strict=True) if kept]
            out = [u for u, kept in zip(out, keep, strict=True) if kept]
            into = [u for u, kept in zip(into, keep, strict=True) if kept]
            self.d = len(out)
        # u_{i|j} from the neighbour's copy and its x; u_{j|i} from ours and our x (both old values).
        self.out = [z_update(a, r, g, c, theta) for a, r, g in zip(out, into, got, strict=True)]
        self.into = [z_update(r, a, x, c, theta) for a, r in zip(out, into, strict=True)]

    def of(self, k: int) -> tuple[list[float], list[float]]:
        return list(self.out), list(self.into)


def duals_for(degrees: list[int]) -> Duals:
    """The duals of nodes with these degrees: :class:`LoneDuals` for one node, else :class:`FlatDuals`."""
    return LoneDuals(degrees[0]) if len(degrees) == 1 else FlatDuals(degrees)
