"""Distributed termination: the nodes of a phase stop together once the network has gone quiet.

Pure scalar functions, called by the simulator's compiled kernel (compiled for scalars, as the
x- and z-updates are) and meant for the networked node, so both stop at the same iteration.
See ``docs/protocol.md`` ("Early stopping") for the rule and its proof.

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
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .arrays import FloatArray, IntArray

__all__ = ["NO_STOP", "diameter", "fields_along", "is_quiet", "next_quiet", "next_stop", "stop_threshold"]

NO_STOP = 1 << 62
"""``e`` before any proposal (larger than every iteration; never on the wire)."""


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


def fields_along(
    xs: FloatArray, edges: IntArray, t0: int, window: int, diam: int, tolerance: float
) -> list[list[tuple[int, int]]]:
    """Every node's ``(k_i^(t), e_i^(t))`` along one phase's trajectory ``xs`` (iterations x nodes).

    What the nodes publish with their x's (``e`` is :data:`NO_STOP` until known), recomputed from the
    x's of a phase that started at iteration ``t0``: the simulator's transcripts carry them. The
    rows stop at the phase's stop iteration (or at the end of ``xs``).
    """
    n = xs.shape[1]
    nbrs: list[list[int]] = [[] for _ in range(n)]
    for a, b in np.asarray(edges).tolist():
        nbrs[a].append(b)
        nbrs[b].append(a)
    threshold = stop_threshold(diam, window)
    rows: list[list[tuple[int, int]]] = []
    k, e = [0] * n, [NO_STOP] * n
    x = np.asarray(xs, dtype=np.float64).tolist()
    for lt, row in enumerate(x):
        quiet = [lt >= window and is_quiet(row[i], x[lt - window][i], tolerance) for i in range(n)]
        k_min = [min([k[i]] + [k[j] for j in nbrs[i]]) for i in range(n)]
        e_min = [min([e[i]] + [e[j] for j in nbrs[i]]) for i in range(n)]
        k = [next_quiet(quiet[i], k_min[i]) for i in range(n)]
        e = [next_stop(e_min[i], k[i], t0 + lt, threshold, diam) for i in range(n)]
        rows.append(list(zip(k, e, strict=True)))
        if t0 + lt in e:
            break
    return rows


def diameter(n: int, edges: IntArray) -> int:
    """Longest shortest path of a connected graph on nodes ``0 .. n-1`` (BFS from every node)."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in np.asarray(edges).tolist():
        adj[a].append(b)
        adj[b].append(a)
    best = 0
    for root in range(n):
        dist = [-1] * n
        dist[root] = 0
        todo = deque([root])
        while todo:
            a = todo.popleft()
            for b in adj[a]:
                if dist[b] < 0:
                    dist[b] = dist[a] + 1
                    todo.append(b)
        if min(dist) < 0:
            raise ValueError("the graph is not connected")
        best = max(best, max(dist))
    return best
