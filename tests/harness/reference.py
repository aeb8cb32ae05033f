"""A plain per-node loop written straight from the paper's Algorithms 1 and 2.

It is deliberately naive (dicts of z_{i|j}, scalar arithmetic, no signed duals)
so that it checks the batched engine rather than sharing its code.
"""

from __future__ import annotations

import math

import numpy as np


def _xi(op: str, s: float, v: float, c: float, d: int, q: float) -> float:
    if op == "max":  # eq. (xi_up)
        return max((-1 - v) / (c * d), s)
    if op == "min":
        return min((1 - v) / (c * d), s)
    if op == "average":
        return (s - v) / (1 + c * d)
    alpha, beta = (1.0, 1.0) if op == "median" else (q, 1.0 - q)
    lo, hi = (-alpha - v) / (c * d), (beta - v) / (c * d)  # eq. (x_update_eq) / quantile
    if lo > s:
        return lo
    if hi < s:
        return hi
    return s


def run_reference(
    op: str,
    n: int,
    edges: list[tuple[int, int]],
    s: list[float],
    z0: dict[tuple[int, int], float],
    c: float,
    theta: float,
    t_max: int,
    *,
    q: float = 0.5,
    rounds: int = 1,
    epsilon: float = 1e-3,
) -> tuple[np.ndarray, set[tuple[int, int]]]:
    """Run ``rounds`` consecutive phases of ``t_max`` iterations (rounds > 1: top-K, Algorithm 2).

    Returns x of shape (rounds * t_max, n) and the matching events {(t, i)}.
    """
    nbrs = {i: sorted([b for a, b in edges if a == i] + [a for a, b in edges if b == i]) for i in range(n)}
    a = {(i, j): (1.0 if i < j else -1.0) for i in range(n) for j in nbrs[i]}
    z = dict(z0)
    xs = np.zeros((rounds * t_max, n))
    events: set[tuple[int, int]] = set()
    identified: list[list[float]] = [[] for _ in range(n)]
    for r in range(rounds):
        for t in range(t_max):
            x = [0.0] * n
            for i in range(n):
                v = 0.0
                for j in nbrs[i]:
                    v += a[i, j] * z[i, j]
                bypass = r > 0 and any(abs(s[i] - h) <= epsilon for h in identified[i])
                if bypass:  # eq. (topk_xi): the node's value is already identified
                    x[i] = (-1 - v) / (c * len(nbrs[i]))
                else:
                    x[i] = _xi(op, s[i], v, c, len(nbrs[i]), q)
                if x[i] == s[i] and op != "average":
                    events.add((r * t_max + t, i))
            new = {}
            for i in range(n):  # eq. (zji_up): z_{j|i} <- (1-theta) z_{j|i} + theta (z_{i|j} + 2 c a_ij x_i)
                for j in nbrs[i]:
                    new[j, i] = (1 - theta) * z[j, i] + theta * (z[i, j] + 2 * c * a[i, j] * x[i])
            z = new
            xs[r * t_max + t] = x
        for i in range(n):
            identified[i].append(xs[(r + 1) * t_max - 1, i])
    assert all(math.isfinite(v) for v in xs.ravel())
    return xs, events
