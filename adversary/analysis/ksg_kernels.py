"""Compiled kernels of the KSG estimator (numba, cached on disk): exact 2-D max-norm kNN and counts.

See :mod:`adversary.analysis.mi` for the estimator these kernels serve and the conventions they
reproduce bit for bit (NPEET's ``mi``). Everything here works on plain float64/int64
arrays; the entry points are :func:`ksg_one` (one pair), :func:`ksg_batch`
(independent pairs in parallel) and :func:`ksg_chains` (chains of pairs sharing
their x, run in parallel across chains).
"""

from __future__ import annotations

import numba
import numpy as np

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.jit import njit


@njit(nogil=True, inline="always")
def insert(best: FloatArray, k: int, d: float) -> float:
    a = k - 1
    while a > 0 and best[a - 1] > d:
        best[a] = best[a - 1]
        a -= 1
    best[a] = d
    return float(best[k - 1])


@njit(nogil=True)
def sweep(ps: FloatArray, qs: FloatArray, k: int, m: int, bound: float, best: FloatArray) -> float:
    """k-th smallest max-norm distance from sorted point m to the other points.

    ``ps`` is sorted; ``|p_j - p_m|`` is a lower bound of the distance, so the walk in
    each direction ends as soon as it reaches the current k-th smallest distance.
    ``bound`` must be strictly larger than the answer (or inf); it prunes from the start.
    """
    n = len(ps)
    for a in range(k):
        best[a] = bound
    kth = bound
    pm = ps[m]
    qm = qs[m]
    for step in (1, -1):  # up, then down
        j = m + step
        while 0 <= j < n:
            dp = (ps[j] - pm) * step  # |p_j - p_m|: rounding is symmetric, so -fl(a - b) = fl(b - a)
            if dp >= kth:
                break
            d = max(dp, abs(qs[j] - qm))
            if d < kth:
                kth = insert(best, k, d)
            j += step
    return kth


@njit(nogil=True, inline="always")
def keep3(b0: float, b1: float, b2: float, d: float) -> tuple[float, float, float]:
    """The three smallest of ``b0 <= b1 <= b2`` and ``d``, in order, without a branch."""
    return min(b0, d), min(b1, max(b0, d)), min(b2, max(b1, d))


@njit(nogil=True, inline="always")
def merge3(
    b0: float, b1: float, b2: float, d0: float, d1: float, d2: float, d3: float
) -> tuple[float, float, float]:
    """The three smallest of ``b0 <= b1 <= b2`` and ``d0..d3``, in order, without a branch.

    A sorting network orders the block (independent of the b's), and the merge of two
    sorted lists then puts three levels of min/max on the b's dependency chain, where
    one insertion per candidate would put two per candidate.
    """
    lo01, hi01 = min(d0, d1), max(d0, d1)
    lo23, hi23 = min(d2, d3), max(d2, d3)
    s0, mid0 = min(lo01, lo23), max(lo01, lo23)
    mid1 = min(hi01, hi23)  # the block's largest is never among the three smallest
    s1, s2 = min(mid0, mid1), max(mid0, mid1)
    return (
        min(b0, s0),
        min(min(b1, s1), max(b0, s0)),
        min(min(b2, s2), min(max(b0, s1), max(b1, s0))),
    )


@njit(nogil=True)
def sweep3(ps: FloatArray, qs: FloatArray, m: int, bound: float) -> float:
    """:func:`sweep` for k = 3, the three smallest distances kept branch-free in registers.

    Candidates go four at a time, merged into the three smallest with no branch (a test
    per candidate mispredicts on fresh data; see :func:`merge3`). The walk ends after a
    block whose last coordinate gap reaches the third distance. A block may take in up
    to three points past where a point-by-point walk would stop; their distances are
    at least that gap, so they change nothing.
    """
    n = len(ps)
    b0 = bound
    b1 = bound
    b2 = bound
    pm = ps[m]
    qm = qs[m]
    j = m + 1
    while j + 4 <= n:
        d0 = max(ps[j] - pm, abs(qs[j] - qm))
        d1 = max(ps[j + 1] - pm, abs(qs[j + 1] - qm))
        d2 = max(ps[j + 2] - pm, abs(qs[j + 2] - qm))
        gap = ps[j + 3] - pm
        d3 = max(gap, abs(qs[j + 3] - qm))
        b0, b1, b2 = merge3(b0, b1, b2, d0, d1, d2, d3)
        if gap >= b2:
            j = n
            break
        j += 4
    while j < n:
        dp = ps[j] - pm
        if dp >= b2:
            break
        b0, b1, b2 = keep3(b0, b1, b2, max(dp, abs(qs[j] - qm)))
        j += 1
    j = m - 1
    while j >= 3:
        d0 = max(pm - ps[j], abs(qs[j] - qm))
        d1 = max(pm - ps[j - 1], abs(qs[j - 1] - qm))
        d2 = max(pm - ps[j - 2], abs(qs[j - 2] - qm))
        gap = pm - ps[j - 3]
        d3 = max(gap, abs(qs[j - 3] - qm))
        b0, b1, b2 = merge3(b0, b1, b2, d0, d1, d2, d3)
        if gap >= b2:
            j = -1
            break
        j -= 4
    while j >= 0:
        dp = pm - ps[j]
        if dp >= b2:
            break
        b0, b1, b2 = keep3(b0, b1, b2, max(dp, abs(qs[j] - qm)))
        j -= 1
    return b2


@njit(nogil=True)
def typical_spacing(vs: FloatArray, k: int) -> float:
    """Median gap between sorted samples k apart, from 64 evenly spread positions.

    A sweep along a coordinate examines about ``eps / spacing * k`` points per query,
    and ``eps`` is the same whichever coordinate is swept, so the coordinate with the
    larger typical spacing is the cheaper one.
    """
    n = len(vs) - k
    probes = min(64, n)
    gaps = np.empty(probes)
    for a in range(probes):
        m = (a * n) // probes
        gaps[a] = vs[m + k] - vs[m]
    return float(np.median(gaps))


_WINDOW = 64
"""Marginal counts first count among this many sorted neighbours on each side (most counts fit)."""


@njit(nogil=True, inline="always")
def count_within_above(vs: FloatArray, vi: float, r: float, lo: int, hi: int) -> int:
    """``#{j in [lo, hi) : vs[j] - vi <= r}``, as one vectorized pass with no branch per element.

    On sorted data a walk or a bisection mispredicts a branch at every step; a count of
    a short window is a handful of SIMD comparisons.
    """
    window = vs[lo:hi]
    c = 0
    for j in range(len(window)):
        c += window[j] - vi <= r
    return c


@njit(nogil=True, inline="always")
def count_within_below(vs: FloatArray, vi: float, r: float, lo: int, hi: int) -> int:
    """``#{j in [lo, hi) : vs[j] - vi >= -r}``, vectorized like :func:`count_within_above`."""
    window = vs[lo:hi]
    nr = -r
    c = 0
    for j in range(len(window)):
        c += window[j] - vi >= nr
    return c


@njit(nogil=True)
def first_past(vs: FloatArray, vi: float, bound: float, lo: int, hi: int, inclusive: bool) -> int:
    """First j in [``lo``, ``hi``) of sorted ``vs`` with ``vs[j] - vi > bound`` (``>=`` when
    ``inclusive``), ``hi`` if none (bisection: the predicate flips once). The end of a run within
    ``r`` is ``first_past(vs, vi, r, lo, n, False)``, its start ``first_past(vs, vi, -r, 0, hi, True)``."""
    a, b = lo, hi
    while a < b:
        mid = (a + b) >> 1
        d = vs[mid] - vi
        if d < bound or (d == bound and not inclusive):
            a = mid + 1
        else:
            b = mid
    return a


@njit(nogil=True)
def marginal_counts(vs: FloatArray, order: IntArray, radius: FloatArray, out: IntArray) -> None:
    """``out[i] = #{j : |v_j - v_i| <= radius[i]}`` (i included), exactly as a tree query.

    ``vs = v[order]`` is sorted, and ``fl(v_j - v_i)`` is non-decreasing in j, so the
    predicate ``-r <= fl(v_j - v_i) <= r`` (``|fl(a - b)| = |fl(b - a)|``: the test a tree
    evaluates) holds on one contiguous run around i. It is counted among the
    :data:`_WINDOW` sorted neighbours on each side; a run that fills a window is
    followed past it by bisection.
    """
    n = len(vs)
    for m in range(n):
        i = order[m]
        r = radius[i]
        if r < 0.0:
            out[i] = 0
            continue
        vi = vs[m]
        above = min(n, m + 1 + _WINDOW)
        below = max(0, m - _WINDOW)
        hi = m + 1 + count_within_above(vs, vi, r, m + 1, above)
        lo = m + 1 - count_within_below(vs, vi, r, below, m + 1)
        if hi == above < n:
            hi = first_past(vs, vi, r, above, n, False)
        if lo == below > 0:
            lo = first_past(vs, vi, -r, 0, below, True)
        out[i] = hi - lo


@njit(nogil=True)
def sorting_order(v: FloatArray, hint: IntArray) -> IntArray:
    """A sorting permutation of ``v``; ``hint`` (may be empty) is a nearly sorting one to repair.

    The NMI curves estimate ``I(S_r; X_r^(t))`` for hundreds of t with the same S_r up to
    the 1e-10 jitter, and X_r^(t) changes little between recorded iterations once the
    run settles, so the previous order is off by a few swaps: an insertion sort repairs
    it in linear time. Beyond 32 descents or 4N element moves it falls back to a full sort.
    """
    n = len(v)
    if len(hint) != n:
        return np.argsort(v)
    descents = 0
    for a in range(1, n):
        if v[hint[a]] < v[hint[a - 1]]:
            descents += 1
    if descents > 32:
        return np.argsort(v)
    o = hint.copy()
    budget = 4 * n
    for a in range(1, n):
        cur = o[a]
        val = v[cur]
        b = a - 1
        while b >= 0 and v[o[b]] > val:
            o[b + 1] = o[b]
            b -= 1
            budget -= 1
        o[b + 1] = cur
        if budget < 0:
            return np.argsort(v)
    return o


@njit(nogil=True)
def ksg_counts_one(
    x: FloatArray, y: FloatArray, k: int, nx: IntArray, ny: IntArray, hint_x: IntArray, hint_y: IntArray
) -> IntArray:
    """Marginal neighbour counts ``n_x, n_y`` of the KSG estimator for one 1-D x 1-D pair.

    The hints (possibly empty) are nearly sorting orders of x and y; returns y's order.
    """
    n = len(x)
    ox = sorting_order(x, hint_x)
    oy = sorting_order(y, hint_y)
    xs, ys = x[ox], y[oy]
    # Sweep along the coordinate whose window holds fewer candidates.
    if typical_spacing(xs, k) >= typical_spacing(ys, k):
        ps, qs, order = xs, y[ox], ox
    else:
        ps, qs, order = ys, x[oy], oy
    radius = np.empty(n)
    best = np.empty(k)
    kth = np.inf
    for m in range(n):
        # The k nearest of the previous point, and that point itself, lie within
        # kth + d(m - 1, m) of point m: a valid bound (widened against rounding).
        if m > 0:
            step = max(ps[m] - ps[m - 1], abs(qs[m] - qs[m - 1]))
            kth = (kth + step) * (1.0 + 1e-9) + 1e-300
        kth = sweep3(ps, qs, m, kth) if k == 3 else sweep(ps, qs, k, m, kth, best)
        radius[order[m]] = kth - 1e-15
    marginal_counts(xs, ox, radius, nx)
    marginal_counts(ys, oy, radius, ny)
    return oy


@njit(nogil=True)
def block_sum(a: FloatArray, lo: int, n: int) -> float:
    """NumPy's sum of at most 128 elements: sequential below 8, else 8 interleaved accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = a[lo : lo + 8].copy()
    i = 8
    while i < n - (n % 8):
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = float(((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(nogil=True)
def pairwise_sum(a: FloatArray) -> float:
    """``a.sum()`` in NumPy's own order, so a mean formed here has the bits of ``np.mean``.

    NumPy splits a run longer than 128 in two (the first part a multiple of 8 long)
    and adds the two sums; :func:`block_sum` does the rest. The recursion is unrolled
    with a small stack (numba cannot load recursive functions from its cache).
    """
    seg_lo = np.empty(128, dtype=np.int64)
    seg_n = np.empty(128, dtype=np.int64)
    combine = np.empty(128, dtype=np.bool_)
    vals = np.empty(128)
    seg_lo[0], seg_n[0], combine[0] = 0, len(a), False
    top = 1
    nv = 0
    while top > 0:
        top -= 1
        lo, n = seg_lo[top], seg_n[top]
        if combine[top]:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
        elif n <= 128:
            vals[nv] = block_sum(a, lo, n)
            nv += 1
        else:
            n2 = n // 2
            n2 -= n2 % 8
            # Popped in order: the first part, the second part, then their sum.
            seg_lo[top], seg_n[top], combine[top] = lo, n, True
            seg_lo[top + 1], seg_n[top + 1], combine[top + 1] = lo + n2, n - n2, False
            seg_lo[top + 2], seg_n[top + 2], combine[top + 2] = lo, n2, False
            top += 3
    return float(vals[0])


@njit(nogil=True)
def ksg_one(x: FloatArray, y: FloatArray, k: int, table: FloatArray) -> tuple[float, float]:
    """``(<psi(n_x)>, <psi(n_y)>)`` of one 1-D x 1-D pair in one call (means as ``np.mean`` forms them)."""
    n = len(x)
    nx = np.empty(n, dtype=np.int64)
    ny = np.empty(n, dtype=np.int64)
    empty = np.empty(0, dtype=np.int64)
    ksg_counts_one(x, y, k, nx, ny, empty, empty)
    return pairwise_sum(table[nx]) / n, pairwise_sum(table[ny]) / n


BATCH_BLOCK = 16
"""Pairs of :func:`ksg_batch` that one thread runs in order, each starting from the last y order."""


@njit(parallel=True)
def ksg_batch(
    xs: FloatArray,
    ys: FloatArray,
    noise: FloatArray,
    hints: IntArray,
    k: int,
    table: FloatArray,
    out: FloatArray,
) -> None:
    """Per pair ``-<psi(n_x)> - <psi(n_y)>`` (the rest of the formula is a constant).

    ``xs`` has shape ``(P, N)`` or ``(1, N)`` (the same x for every pair), ``ys`` shape
    ``(P, N)``. ``noise[b]`` is the jitter of pair b, added to its x row (``noise[b, 0]``)
    and y row (``noise[b, 1]``) here, in parallel, as ``x + noise`` would (shape
    ``(P, 2, 0)``: no jitter). A pair with a non-finite sample gets ``nan``.
    ``hints`` are nearly sorting orders of the x rows: shape ``(P, N)``, ``(1, N)`` (one for
    every row: the same x up to jitter) or ``(P, 0)`` (none). Blocks of :data:`BATCH_BLOCK`
    consecutive pairs run in parallel; within a block each pair's y sort starts from the
    previous pair's order (consecutive rows are often successive iterations of one state).
    The counts do not depend on the orders, so neither does the result.
    """
    n_pairs, n = ys.shape
    shared_x = xs.shape[0] == 1
    shared_hint = hints.shape[0] == 1
    jittered = noise.shape[2] > 0
    for block in numba.prange((n_pairs + BATCH_BLOCK - 1) // BATCH_BLOCK):
        xb = np.empty(n)
        yb = np.empty(n)
        nx = np.empty(n, dtype=np.int64)
        ny = np.empty(n, dtype=np.int64)
        hint_y = np.empty(0, dtype=np.int64)
        for b in range(block * BATCH_BLOCK, min(n_pairs, (block + 1) * BATCH_BLOCK)):
            xr = xs[0] if shared_x else xs[b]
            yr = ys[b]
            if jittered:
                for i in range(n):
                    xb[i] = xr[i] + noise[b, 0, i]
                    yb[i] = yr[i] + noise[b, 1, i]
            else:
                xb[:] = xr
                yb[:] = yr
            if not (np.isfinite(xb).all() and np.isfinite(yb).all()):
                out[b] = np.nan
                continue
            hint_x = hints[0] if shared_hint else hints[b]
            hint_y = ksg_counts_one(xb, yb, k, nx, ny, hint_x, hint_y)
            out[b] = digamma_mean(nx, ny, table)


@njit(nogil=True)
def digamma_mean(nx: IntArray, ny: IntArray, table: FloatArray) -> float:
    n = len(nx)
    sx = 0.0
    sy = 0.0
    for i in range(n):
        sx += table[nx[i]]
        sy += table[ny[i]]
    return -sx / n - sy / n


@njit(parallel=True)
def ksg_chains(
    xs: FloatArray,
    ys: FloatArray,
    x_order: IntArray,
    y_order: IntArray,
    k: int,
    table: FloatArray,
    out: FloatArray,
) -> None:
    """Pairs ``(xs[t, r], ys[t, r])`` with one chain per r: t runs in order within a chain.

    ``x_order[r]`` sorts the x of chain r up to jitter; ``y_order[r]`` carries the last
    y order of chain r from one call to the next (a row starting with -1 starts afresh).
    """
    T, C, n = xs.shape
    for r in numba.prange(C):
        nx = np.empty(n, dtype=np.int64)
        ny = np.empty(n, dtype=np.int64)
        hint = y_order[r, :0] if y_order[r, 0] < 0 else y_order[r]
        for t in range(T):
            oy = ksg_counts_one(xs[t, r], ys[t, r], k, nx, ny, x_order[r], hint)
            out[t, r] = digamma_mean(nx, ny, table)
            y_order[r] = oy
            hint = y_order[r]
