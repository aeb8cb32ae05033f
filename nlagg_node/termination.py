"""Distributed termination: the nodes of a phase stop together once the network has gone quiet.

Pure scalar functions, called by the simulator's compiled kernel (compiled for scalars, as the
x- and z-updates are) and by the node's state machine (:class:`nlagg_node.protocol.machine.PhaseNode`,
which keeps a node's state and which the networked node, the transcripts and the replay drive), so
all stop at the same iteration. See ``docs/protocol.md`` ("Early stopping") for the rule and its proof.

Node ``i`` keeps two small integers next to ``x_i^(t)``:

* the quiet counter ``k_i^(t)``: 0 unless ``x_i^(t)`` lies within ``tolerance`` of
  ``x_i^(t-W)`` (node i is *quiet* at t), else ``1 + min(k_i^(t-1), k_j^(t-1) for every
  neighbour j)`` (min-consensus of the counters, one hop per iteration);
* the stop iteration ``e_i^(t) = min(e_i^(t-1), e_j^(t-1) for every neighbour j, proposal)``,
  where the proposal is ``t + D`` once ``k_i^(t) >= D + W`` (``D`` the graph's diameter,
  public) and "none" before.

Node i runs iteration t in full (x, publish, barrier, z-update) and stops after it when
``e_i^(t) == t``. With ``k^(-1) = 0`` and no stop proposed at the start of a phase:

* ``k_i^(t) >= m`` implies every node j at distance ``r < m`` from i was quiet at every
  iteration in ``[t - m + 1, t - r]`` (induction on m); so a proposal at t means every node was
  quiet throughout ``[t - D - W + 1, t - D]``, W consecutive iterations;
* the first proposal, made at ``t*``, is ``t* + D``, and any later one is larger; it reaches
  every node within ``D`` hops, so every node holds ``e = t* + D`` at ``t* + D`` and none
  held ``e <= t`` before: every node stops at the same iteration ``t* + D``.

In a run whose nodes may depart (``may_depart``), ``D`` is ``n - 1`` (:func:`stop_reach`), a node
that detects a departure is not quiet at the next iteration and carries the departure iterations
it knows of in its x (merged by union, :func:`recent` ones only), and a departure in
``[e - 2D, e - D]`` voids the stop ``e`` (:func:`voids`, :func:`halts`; a voided ``e`` is forgotten,
:func:`live_stop`). Each connected component then stops on its own, all its nodes together
(docs/protocol.md, "Early stopping with departures").

**The certified stop** (max and min, :func:`certifies`). The output of max is a node's value, and
once the descent has met it the maximizer's x is *pinned* at it (eq. (xi_up) selects ``s_i``) while
every other x still converges geometrically. Rather than wait for every x to settle within
``tolerance``, node i keeps

* its pin run ``r_i^(t)``: iterations in a row with ``x_i = s_i`` (bit for bit, the value its
  x-update uses; :func:`next_pin_run`);
* the candidate ``b_i^(t) = max(b_i^(t-1), b_j^(t-1) for every neighbour j, o_i^(t))`` with its own
  contribution ``o_i^(t) = s_i`` once ``r_i^(t) >= W`` (:func:`own_candidate`), "none" before
  (signed: ``-s`` for min; :func:`next_candidate`), published with x as ``cand``;

and is quiet at t when ``s_i <= b_i^(t)`` (:func:`is_certified`) in place of the tolerance test.
Every candidate is some node's value, so ``b <= s_max``; a proposal means every node was quiet at
some iteration of ``[t - D - W + 1, t - D]``, the maximizer among them, so ``b_m = s_max`` there and
the flood carries it to every node within D hops: at the stop every node holds ``b_i = s_max``
exactly and outputs it. The candidate is made of x's each published W times in a row, so it adds
nothing an eavesdropper of every x lacks; a node that knows a recent departure is never quiet and
keeps only its own contribution (``resetting``), so no departed node's value survives in a
candidate (docs/protocol.md, "The certified stop").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import IntArray
from .graphs import neighbours

__all__ = [
    "CERTIFYING_OPERATORS",
    "NO_CANDIDATE",
    "NO_STOP",
    "Certificate",
    "Fields",
    "certificate_sign",
    "certifies",
    "csr_diameter",
    "diameter",
    "earliest_stop",
    "halts",
    "is_certified",
    "is_quiet",
    "live_stop",
    "next_candidate",
    "next_pin_run",
    "next_quiet",
    "next_stop",
    "own_candidate",
    "quiet_window",
    "recent",
    "stop_reach",
    "stop_threshold",
    "voids",
]

NO_STOP = 1 << 62
"""``e`` before any proposal (larger than every iteration; never on the wire)."""


CERTIFYING_OPERATORS = ("max", "min")
"""The operators whose output a node's pinned x certifies (the certified stop, module docs)."""

NO_CANDIDATE = -math.inf
"""``b`` before any candidate (signed; never on the wire)."""


def certifies(op: str, early_stop: bool, stop_rule: str | None) -> bool:
    """Whether a phase of ``op`` stops on the certificate (module docs) rather than on the tolerance:
    ``stop_rule`` ``"certificate"``, or None (the default) for max and min with early stopping."""
    if not early_stop:
        return False
    if stop_rule is None:
        return op in CERTIFYING_OPERATORS
    return stop_rule == "certificate"


def certificate_sign(op: str) -> float:
    """``+1`` for max, ``-1`` for min: the candidates are kept signed, so min is max of ``-s``."""
    return -1.0 if op == "min" else 1.0


def next_pin_run(x: float, s: float, run: int) -> int:
    """``r_i^(t)``: one more than ``run`` when ``x_i^(t)`` equals the value ``s`` bit for bit, else 0."""
    return run + 1 if x == s else 0


def own_candidate(signed_value: float, run: int, window: int) -> float:
    """``o_i^(t)``: the node's signed value once its x has been pinned at it ``window`` times in a
    row, else :data:`NO_CANDIDATE`."""
    return signed_value if run >= window else NO_CANDIDATE


def next_candidate(b_max: float, own: float, resetting: bool) -> float:
    """``b_i^(t)`` from ``b_max = max(b_i^(t-1), b_j^(t-1))`` over the neighbours: the larger of it and
    ``own``, or ``own`` alone while the node knows a recent departure (``resetting``)."""
    return own if resetting else max(b_max, own)


def is_certified(signed_value: float, b: float) -> bool:
    """The certified stop's quiet test: the node's signed value is at most its candidate."""
    return signed_value <= b


def is_quiet(x: float, x_past: float, tolerance: float) -> bool:
    """``|x^(t) - x^(t-W)| <= tolerance``: a node whose x has not moved over the window."""
    return abs(x - x_past) <= tolerance


def next_quiet(quiet: bool, k_min: int) -> int:
    """The quiet counter ``k_i^(t)`` from ``k_min = min(k_i^(t-1), k_j^(t-1))`` over the neighbours."""
    return k_min + 1 if quiet else 0


def next_stop(e_min: int, k: int, t: int, threshold: int, diam: int) -> int:
    """The stop iteration ``e_i^(t)``: ``min(e_min, t + diam)`` once ``k >= threshold``, else ``e_min``.

    ``e_min`` is ``min(e_i^(t-1), e_j^(t-1))`` over the neighbours (:data:`NO_STOP` when none).
    """
    if k >= threshold:
        return min(e_min, t + diam)
    return e_min


def stop_threshold(diam: int, window: int) -> int:
    """``D + W``: a counter this high proves W quiet iterations of every node (see module docs)."""
    return diam + window


def earliest_stop(t0: int, reach: int, window: int) -> int:
    """The earliest stop of a phase that started at ``t0``: a proposal needs ``k >= D + W`` and the
    counter grows by one per iteration from 0, so none comes before ``t0 + D + W - 1``, and its stop
    lies D later. A stop claimed earlier is no honest node's (docs/protocol.md, "Bounded influence")."""
    return t0 + 2 * reach + window - 1


def quiet_window(e: int, reach: int, window: int) -> tuple[int, int]:
    """``[first, last]``: the iterations at which every node within D hops of a stop ``e``'s proposer
    was quiet, by the argument of the module docs (the proposal was made at ``e - D``)."""
    return e - 2 * reach - window + 1, e - 2 * reach


def stop_reach(n: int, edges: IntArray, may_depart: bool) -> int:
    """The hops ``D`` a proposal is given to reach every node: the graph's diameter, or ``n - 1``
    when nodes may depart (a departure can lengthen the survivors' distances; ``n - 1`` bounds
    them all)."""
    return n - 1 if may_depart else diameter(n, edges)


def live_stop(e: int, t: int) -> int:
    """``e`` while it lies ahead (``e >= t``), else :data:`NO_STOP`: a voided stop is forgotten."""
    return e if e >= t else NO_STOP


def voids(departure: int, t: int, reach: int) -> bool:
    """A departure at ``departure`` voids a stop at ``t``: it lies in ``[t - 2 D, t - D]``.

    The proposal behind a stop at ``t`` was made at ``t - D`` from counters that may not have
    felt a departure after ``t - 2 D - 1``; every node of a component knows a departure ``T`` by
    ``T + D`` (``D = n - 1``), so all of them judge the window alike.
    """
    return t - 2 * reach <= departure <= t - reach


def recent(departure: int, t: int, reach: int) -> bool:
    """Whether a departure still matters at ``t`` (``>= t - 2 D``): older ones void no later stop."""
    return departure >= t - 2 * reach


def halts(e: int, t: int, departures: Iterable[int], reach: int) -> bool:
    """Whether a node holding stop ``e`` and knowing ``departures`` ends its phase after iteration t."""
    return e == t and not any(voids(d, t, reach) for d in departures)


Fields = tuple[int, int, tuple[int, ...], float | None]
"""What a node publishes with ``x_i^(t)``: quiet counter, stop iteration, departures it knows of, and
in a certified phase its candidate on the protocol's scale (None before it has one, and always
without the certificate): :meth:`nlagg_node.protocol.machine.PhaseNode.tick`."""


@dataclass(frozen=True)
class Certificate:
    """What the certified stop needs beyond the x's: each node's value as its x-update uses it
    (protocol scale; the pin test compares x with it bit for bit) and the operator's sign."""

    values: Sequence[float]
    sign: float


def diameter(n: int, edges: IntArray) -> int:
    """Longest shortest path of a connected graph on nodes ``0 .. n-1``.

    A breadth-first search from every node (:func:`csr_diameter`, on Python lists: no call
    overhead for small graphs), with :func:`scipy.sparse.csgraph.shortest_path` in blocks of
    sources beyond :data:`_PY_BFS_UP_TO` nodes (n = 1000 RGG: 0.13 s against 0.63 s) where scipy is
    installed (the lab's; a lean node searches in Python). The simulator compiles
    :func:`csr_diameter` and runs it on all its trials' graphs at once.
    """
    if n > _PY_BFS_UP_TO and _scipy_installed():
        return _csgraph_diameter(n, edges)
    adj = neighbours(n, np.asarray(edges))
    indptr = [0]
    for nb in adj:
        indptr.append(indptr[-1] + len(nb))
    best = csr_diameter(indptr, [j for nb in adj for j in nb], 0, n, [0] * n, [0] * n)
    if best < 0:
        raise ValueError("the graph is not connected")
    return best


def csr_diameter(
    indptr: Sequence[int], indices: Sequence[int], first: int, n: int, dist: Any, queue: Any
) -> int:
    """Diameter of the graph on nodes ``first .. first + n - 1`` (-1 if it is not connected).

    ``indices[indptr[a]:indptr[a + 1]]``: the neighbours of node ``a`` (ids from ``first``);
    ``dist``/``queue``: ``n`` scratch slots each. Plain loops over indexables, so the simulator's
    compiled code runs it on arrays (one call per graph) and :func:`diameter` on lists.
    """
    best = 0
    for root in range(n):
        for i in range(n):
            dist[i] = -1
        dist[root] = 0
        queue[0] = root
        head, tail = 0, 1
        while head < tail:
            a = queue[head]
            head += 1
            for p in range(indptr[first + a], indptr[first + a + 1]):
                b = indices[p] - first
                if dist[b] < 0:
                    dist[b] = dist[a] + 1
                    queue[tail] = b
                    tail += 1
        if tail < n:
            return -1
        best = max(best, dist[queue[tail - 1]])  # the last node reached is a farthest one
    return best


_PY_BFS_UP_TO = 128
"""Graphs up to this many nodes get their diameter from the Python search (faster there)."""


def _scipy_installed() -> bool:
    """Whether scipy (the lab's, ``nlagg[lab]``) is importable: a lean node's install has none."""
    try:
        import scipy.sparse.csgraph  # noqa: F401
    except ImportError:
        return False
    return True


def _csgraph_diameter(n: int, edges: IntArray, block: int = 256) -> int:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import shortest_path

    pairs = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    adj = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    best = 0
    for start in range(0, n, block):  # a block of rows at a time: memory block x n, not n x n
        rows = np.arange(start, min(n, start + block))
        dist = shortest_path(adj, directed=False, unweighted=True, indices=rows)
        if np.isinf(dist).any():
            raise ValueError("the graph is not connected")
        best = max(best, int(dist.max()))
    return best
