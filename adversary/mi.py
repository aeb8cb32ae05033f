"""Leakage metrics: the KSG mutual-information estimator, NMI curves, leakage probability, MSE.

The estimator is NPEET's ``mi`` (Kraskov-Stoegbauer-Grassberger, first algorithm,
as implemented by Greg Ver Steeg and packaged as npeet-plus), reproduced to the bit
in every step that decides a count:

1. each variable gets independent jitter ``1e-10 * U[0, 1)`` (``x`` first, then ``y``),
2. ``eps_i`` = distance from sample i to its k-th nearest other sample in the joint
   space under the max-norm,
3. ``n_x(i)`` = number of samples j (i itself included) with ``|x_j - x_i| <= eps_i - 1e-15``,
   likewise ``n_y(i)``,
4. ``I = (psi(k) + psi(N) - <psi(n_x)> - <psi(n_y)>) / ln 2`` bits.

With the same jitter values the result equals ``npeet_plus.mi`` to rounding of the
final mean (about 1e-15 bits). The 1-D x 1-D case, the only one the NMI curves need,
runs in a compiled kernel: an exact k-nearest-neighbour search for the 2-D max-norm by
a sweep along one sorted coordinate (pruned as soon as the coordinate gap alone
exceeds the current k-th distance), and exact marginal counts by binary search with
the same floating-point predicate ``|x_j - x_i| <= r`` that the tree query evaluates.
Multi-dimensional variables (the ideal-world side information of
:mod:`adversary.bounds`) use a scipy k-d tree with identical conventions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import digamma

from nlagg_node.errors import ConfigError
from nlagg_node.rng import rng_for

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
RandomSource = np.random.Generator | np.random.RandomState

JITTER = 1e-10
"""NPEET's jitter intensity (``add_noise(x, intens=1e-10)``)."""
_RADIUS_SHRINK = 1e-15
"""NPEET counts marginal neighbours strictly inside ``eps_i`` as ``<= eps_i - 1e-15``."""
_PAIRS_PER_CHUNK = 256


# Compiled kernels -----------------------------------------------------------------------
@numba.njit(cache=True, nogil=True, inline="always")
def _insert(best: FloatArray, k: int, d: float) -> float:
    a = k - 1
    while a > 0 and best[a - 1] > d:
        best[a] = best[a - 1]
        a -= 1
    best[a] = d
    return float(best[k - 1])


@numba.njit(cache=True, nogil=True)
def _sweep(ps: FloatArray, qs: FloatArray, k: int, m: int, bound: float, best: FloatArray) -> float:
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
    j = m + 1
    while j < n:
        dp = ps[j] - pm
        if dp >= kth:
            break
        dq = abs(qs[j] - qm)
        d = max(dp, dq)
        if d < kth:
            kth = _insert(best, k, d)
        j += 1
    j = m - 1
    while j >= 0:
        dp = pm - ps[j]
        if dp >= kth:
            break
        dq = abs(qs[j] - qm)
        d = max(dp, dq)
        if d < kth:
            kth = _insert(best, k, d)
        j -= 1
    return kth


@numba.njit(cache=True, nogil=True)
def _sweep3(ps: FloatArray, qs: FloatArray, m: int, bound: float) -> float:
    """:func:`_sweep` for k = 3 with the three smallest distances kept branch-free in registers."""
    n = len(ps)
    b0 = bound
    b1 = bound
    b2 = bound
    pm = ps[m]
    qm = qs[m]
    j = m + 1
    while j < n:
        dp = ps[j] - pm
        if dp >= b2:
            break
        d = max(dp, abs(qs[j] - qm))
        b2 = min(b2, max(b1, d))
        b1 = min(b1, max(b0, d))
        b0 = min(b0, d)
        j += 1
    j = m - 1
    while j >= 0:
        dp = pm - ps[j]
        if dp >= b2:
            break
        d = max(dp, abs(qs[j] - qm))
        b2 = min(b2, max(b1, d))
        b1 = min(b1, max(b0, d))
        b0 = min(b0, d)
        j -= 1
    return b2


@numba.njit(cache=True, nogil=True)
def _typical_spacing(vs: FloatArray, k: int) -> float:
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


@numba.njit(cache=True, nogil=True)
def _first_above(vs: FloatArray, vi: float, r: float, start: int, strict: bool) -> int:
    """First index j of sorted ``vs`` with ``vs[j] - vi > r`` (``>= r`` if ``strict``).

    ``fl(vs[j] - vi)`` is non-decreasing in j, so the predicate switches once. The
    search walks a few steps from ``start`` (the answer for the previous sorted point,
    usually next to this one) and falls back to bisection.
    """
    n = len(vs)
    j = start
    for _ in range(8):
        below = j > 0 and ((vs[j - 1] - vi < r) if strict else (vs[j - 1] - vi <= r))
        above = j == n or ((vs[j] - vi >= r) if strict else (vs[j] - vi > r))
        if below and above:
            return j
        if j > 0 and not below:
            j -= 1
        elif j < n and not above:
            j += 1
        else:
            return j
    a, b = 0, n
    while a < b:
        mid = (a + b) >> 1
        if (vs[mid] - vi < r) if strict else (vs[mid] - vi <= r):
            a = mid + 1
        else:
            b = mid
    return a


@numba.njit(cache=True, nogil=True)
def _marginal_counts(vs: FloatArray, order: IntArray, radius: FloatArray, out: IntArray) -> None:
    """``out[i] = #{j : |v_j - v_i| <= radius[i]}`` (i included), exactly as a tree query.

    ``vs = v[order]`` is sorted. ``|fl(a - b)| = |fl(b - a)|``, so the predicate holds
    on one contiguous run of the sorted values, whose ends are found with the same
    floating-point comparisons a tree evaluates.
    """
    n = len(vs)
    upper = 0
    lower = 0
    for m in range(n):
        i = order[m]
        r = radius[i]
        if r < 0.0:
            out[i] = 0
            continue
        vi = vs[m]
        upper = _first_above(vs, vi, r, max(upper, m + 1), False)
        lower = _first_above(vs, vi, -r, min(lower, m), True)
        out[i] = upper - lower


@numba.njit(cache=True, nogil=True)
def _order(v: FloatArray, hint: IntArray) -> IntArray:
    """A sorting permutation of ``v``; ``hint`` (may be empty) is a nearly sorting one to repair.

    The NMI curves estimate ``I(S_r; X_r^(t))`` for hundreds of t with the same S_r up to
    the 1e-10 jitter, so the order of the unjittered S_r is off by a few swaps at most:
    an insertion sort fixes it in linear time. Too many descents fall back to a full sort.
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
    for a in range(1, n):
        cur = o[a]
        val = v[cur]
        b = a - 1
        while b >= 0 and v[o[b]] > val:
            o[b + 1] = o[b]
            b -= 1
        o[b + 1] = cur
    return o


@numba.njit(cache=True, nogil=True)
def _ksg_counts_one(
    x: FloatArray, y: FloatArray, k: int, nx: IntArray, ny: IntArray, hint_x: IntArray
) -> None:
    """Marginal neighbour counts ``n_x, n_y`` of the KSG estimator for one 1-D x 1-D pair."""
    n = len(x)
    ox = _order(x, hint_x)
    oy = np.argsort(y)
    xs, ys = x[ox], y[oy]
    # Sweep along the coordinate whose window holds fewer candidates.
    if _typical_spacing(xs, k) >= _typical_spacing(ys, k):
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
        kth = _sweep3(ps, qs, m, kth) if k == 3 else _sweep(ps, qs, k, m, kth, best)
        radius[order[m]] = kth - 1e-15
    _marginal_counts(xs, ox, radius, nx)
    _marginal_counts(ys, oy, radius, ny)


@numba.njit(cache=True, parallel=True)
def _ksg_batch(
    xs: FloatArray, ys: FloatArray, hints: IntArray, k: int, table: FloatArray, out: FloatArray
) -> None:
    """Per pair ``-<psi(n_x)> - <psi(n_y)>`` (the rest of the formula is a constant)."""
    n = xs.shape[1]
    for b in numba.prange(xs.shape[0]):
        nx = np.empty(n, dtype=np.int64)
        ny = np.empty(n, dtype=np.int64)
        _ksg_counts_one(xs[b], ys[b], k, nx, ny, hints[b])
        sx = 0.0
        sy = 0.0
        for i in range(n):
            sx += table[nx[i]]
            sy += table[ny[i]]
        out[b] = -sx / n - sy / n


# Public API ------------------------------------------------------------------------------
def _digamma_table(n: int) -> FloatArray:
    table = np.asarray(digamma(np.arange(n + 1, dtype=np.float64)), dtype=np.float64)
    table[0] = -np.inf
    return table


def _check_k(k: int, n: int) -> None:
    if not isinstance(k, int | np.integer) or k < 1:
        raise ConfigError("k", k, "the KSG neighbour count must be a positive integer")
    if k > n - 1:
        raise ConfigError("k", k, f"must be at most N - 1 = {n - 1} samples")


def _as_samples(name: str, a: ArrayLike) -> FloatArray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 0 or arr.ndim > 2:
        raise ConfigError(name, f"shape {arr.shape}", "expected N samples of shape (N,) or (N, d)")
    arr = arr.reshape(arr.shape[0], -1)
    if not np.isfinite(arr).all():
        raise ConfigError(name, "non-finite entries", "samples must be finite numbers")
    return arr


def _jittered(a: FloatArray, jitter: float, rng: RandomSource) -> FloatArray:
    if jitter == 0.0:
        return a
    return (
        a + jitter * rng.random_sample(a.shape)
        if isinstance(rng, np.random.RandomState)
        else (a + jitter * rng.random(a.shape))
    )


def _ksg_from_counts(nx: IntArray, ny: IntArray, k: int) -> FloatArray:
    n = nx.shape[-1]
    table = _digamma_table(n)
    a = table[nx].mean(axis=-1)
    b = table[ny].mean(axis=-1)
    return np.asarray((-a - b + digamma(k) + digamma(n)) / math.log(2.0), dtype=np.float64)


def _tree_counts(points: FloatArray, radius: FloatArray) -> IntArray:
    from scipy.spatial import cKDTree

    tree = cKDTree(points)
    counts = np.zeros(len(points), dtype=np.int64)
    ok = radius >= 0
    counts[ok] = tree.query_ball_point(points[ok], radius[ok], p=np.inf, return_length=True)
    return counts


def mutual_information(
    x: ArrayLike,
    y: ArrayLike,
    k: int = 3,
    *,
    jitter: float = JITTER,
    rng: RandomSource | None = None,
) -> float:
    """KSG estimate of ``I(X; Y)`` in bits, exactly as NPEET's ``mi(x, y, k=k)``.

    Parameters
    ----------
    x, y
        ``N`` paired samples, shape ``(N,)`` or ``(N, d)``.
    k
        Neighbour count of the estimator (NPEET's default 3).
    jitter
        Intensity of the uniform noise added to break ties (NPEET: 1e-10; 0 disables it).
    rng
        Source of the jitter. A ``np.random.RandomState`` seeded like NPEET's global
        state draws the very same jitter (``x`` first, then ``y``), which makes the
        result equal to ``npeet_plus.mi``. ``None`` uses fresh OS entropy.

    Returns
    -------
    float
        The estimate in bits (can be slightly negative for independent variables).
    """
    xa, ya = _as_samples("x", x), _as_samples("y", y)
    if len(xa) != len(ya):
        raise ConfigError("y", f"{len(ya)} samples", f"x has {len(xa)} samples; they must be paired")
    n = len(xa)
    _check_k(k, n)
    if jitter < 0 or not math.isfinite(jitter):
        raise ConfigError("jitter", jitter, "must be a finite number >= 0")
    source: RandomSource = rng if rng is not None else np.random.default_rng()
    xa = _jittered(xa, jitter, source)
    ya = _jittered(ya, jitter, source)
    if xa.shape[1] == 1 and ya.shape[1] == 1:
        nx = np.empty((1, n), dtype=np.int64)
        ny = np.empty((1, n), dtype=np.int64)
        x1, y1 = np.ascontiguousarray(xa[:, 0]), np.ascontiguousarray(ya[:, 0])
        _ksg_counts_one(x1, y1, k, nx[0], ny[0], np.empty(0, dtype=np.int64))
        return float(_ksg_from_counts(nx, ny, k)[0])
    from scipy.spatial import cKDTree

    joint = np.hstack([xa, ya])
    eps = cKDTree(joint).query(joint, k=k + 1, p=np.inf)[0][:, k]
    radius = eps - _RADIUS_SHRINK
    return float(_ksg_from_counts(_tree_counts(xa, radius)[None], _tree_counts(ya, radius)[None], k)[0])


def mutual_information_batch(
    x: ArrayLike,
    y: ArrayLike,
    k: int = 3,
    *,
    jitter: float = JITTER,
    rng: RandomSource | None = None,
) -> FloatArray:
    """:func:`mutual_information` of many 1-D pairs at once: rows of ``x`` and ``y`` (shape ``(P, N)``).

    Each pair gets its own jitter (``x`` row then ``y`` row, as separate NPEET calls
    would draw it); the pairs run in parallel on all cores.
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.ndim != 2 or xa.shape != ya.shape:
        raise ConfigError("y", f"shape {ya.shape}", f"expected x's shape {xa.shape}, two axes (P, N)")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        raise ConfigError("x", "non-finite entries", "samples must be finite numbers")
    _check_k(k, xa.shape[1])
    source: RandomSource = rng if rng is not None else np.random.default_rng()
    return _batch(xa, ya, k, jitter, source, None)


def _batch(
    xa: FloatArray, ya: FloatArray, k: int, jitter: float, source: RandomSource, x_hint: IntArray | None
) -> FloatArray:
    """The batch estimate; ``x_hint`` (P, N) are nearly sorting orders of the x rows, or None."""
    n_pairs, n = xa.shape
    table = _digamma_table(n)
    const = (digamma(k) + digamma(n)) / math.log(2.0)
    out = np.empty(n_pairs)
    for start in range(0, n_pairs, _PAIRS_PER_CHUNK):
        stop = min(n_pairs, start + _PAIRS_PER_CHUNK)
        # One draw in the order separate calls would make: per pair the x row, then the y row.
        noise = _jittered(np.zeros((stop - start, 2, n)), jitter, source)
        xs = xa[start:stop] + noise[:, 0] if jitter else xa[start:stop]
        ys = ya[start:stop] + noise[:, 1] if jitter else ya[start:stop]
        hints = (
            np.empty((stop - start, 0), dtype=np.int64)
            if x_hint is None
            else np.ascontiguousarray(x_hint[start:stop], dtype=np.int64)
        )
        part = np.empty(stop - start)
        _ksg_batch(np.ascontiguousarray(xs), np.ascontiguousarray(ys), hints, k, table, part)
        out[start:stop] = part / math.log(2.0) + const
    return out


def self_information(n: int, k: int = 3, *, jitter: bool = True) -> float:
    """The estimator's value of ``I(S; S)`` for N distinct samples (the NMI normalizer, in bits).

    Without jitter both marginal counts are exactly k (the k-th neighbour sits on the
    excluded boundary in both coordinates), giving ``(psi(N) - psi(k)) / ln 2``. With
    NPEET's jitter the two copies of S differ by ~1e-10, so in exactly one coordinate
    the k-th neighbour falls strictly inside the shrunk radius and that count becomes
    k + 1: ``(psi(N) - psi(k + 1)) / ln 2``, i.e. 8.152868 bits at N = 1000, k = 3.
    """
    _check_k(k, n)
    return float((digamma(n) - digamma(k + (1 if jitter else 0))) / math.log(2.0))


# Leakage metrics -------------------------------------------------------------------------
@dataclass(frozen=True)
class NMICurves:
    """Normalized mutual information ``I(S_r; X_r^(t)) / I(S_r; S_r)`` per recorded iteration and rank.

    Attributes
    ----------
    nmi
        Shape ``(R, n)``.
    normalizer
        ``I(S_r; S_r)`` per rank in bits, estimated with the same estimator and N.
    lower, upper
        Bootstrap percentile bounds of ``nmi`` (``None`` without bootstrap).
    """

    nmi: FloatArray
    normalizer: FloatArray
    lower: FloatArray | None = None
    upper: FloatArray | None = None


def _check_curve_inputs(s_by_rank: FloatArray, x_by_rank: FloatArray) -> None:
    if s_by_rank.ndim != 2:
        raise ConfigError("s_by_rank", f"shape {s_by_rank.shape}", "expected (trials, n)")
    if x_by_rank.ndim != 3 or x_by_rank.shape[1:] != s_by_rank.shape:
        raise ConfigError(
            "x_by_rank",
            f"shape {x_by_rank.shape}",
            f"expected (R, trials, n) with (trials, n) = {s_by_rank.shape}",
        )


def nmi_curves(
    s_by_rank: ArrayLike,
    x_by_rank: ArrayLike,
    k: int = 3,
    *,
    jitter: float = JITTER,
    rng: RandomSource | None = None,
    seed: int = 0,
) -> FloatArray:
    """Normalized MI ``I(S_r; X_r^(t)) / I(S_r; S_r)`` for every recorded iteration and rank.

    Parameters
    ----------
    s_by_rank
        Private values, shape ``(B, n)``, column r = the node of rank r in each trial.
    x_by_rank
        States, shape ``(R, B, n)``, same column order.
    k
        KSG neighbour count.
    jitter, rng
        As in :func:`mutual_information`. Pairs are estimated in the order
        ``(t=0, r=0), (t=0, r=1), ...`` with ``mi(S_r, X_r^(t))`` each, after the n
        normalizers ``mi(S_r, S_r)``; a ``RandomState`` seeded like NPEET's global
        state reproduces NPEET called in that order. Without ``rng`` the jitter comes
        from the stream ``rng_for(seed, "nmi-jitter")``.

    Returns
    -------
    ndarray
        Shape ``(R, n)``.
    """
    s = np.asarray(s_by_rank, dtype=np.float64)
    x = np.asarray(x_by_rank, dtype=np.float64)
    _check_curve_inputs(s, x)
    source: RandomSource = rng if rng is not None else rng_for(seed, "nmi-jitter")
    return _nmi(s, x, k, jitter, source)[0]


def _nmi(
    s: FloatArray, x: FloatArray, k: int, jitter: float, source: RandomSource
) -> tuple[FloatArray, FloatArray]:
    R, _, n = x.shape
    _check_k(k, s.shape[0])
    if not (np.isfinite(s).all() and np.isfinite(x).all()):
        raise ConfigError("x_by_rank", "non-finite entries", "values and states must be finite numbers")
    st = np.ascontiguousarray(s.T)
    order = np.argsort(st, axis=1)  # S_r is the x of every pair of rank r: sort it once
    norm = _batch(st, st, k, jitter, source, order)
    xs = np.broadcast_to(st[None], (R, n, st.shape[1])).reshape(R * n, -1)
    hint = np.broadcast_to(order[None], (R, n, st.shape[1])).reshape(R * n, -1)
    ys = np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(R * n, -1)
    raw = _batch(xs, ys, k, jitter, source, hint).reshape(R, n)
    return raw / norm[None, :], norm


def nmi_with_bootstrap(
    s_by_rank: ArrayLike,
    x_by_rank: ArrayLike,
    k: int = 3,
    *,
    resamples: int = 20,
    confidence: float = 0.9,
    seed: int = 0,
) -> NMICurves:
    """:func:`nmi_curves` plus percentile bootstrap bounds over trials.

    Each resample draws the trials with replacement (the same trials for every rank
    and iteration) and adds the jitter afresh; duplicated samples are separated only
    by the jitter, which biases a KSG estimate upwards, so read the band as the
    estimator's spread, not as an unbiased interval.
    """
    s = np.asarray(s_by_rank, dtype=np.float64)
    x = np.asarray(x_by_rank, dtype=np.float64)
    _check_curve_inputs(s, x)
    if resamples < 2:
        raise ConfigError("resamples", resamples, "need at least 2 bootstrap resamples")
    if not 0 < confidence < 1:
        raise ConfigError("confidence", confidence, "must lie in (0, 1)")
    source = rng_for(seed, "nmi-jitter")
    nmi, norm = _nmi(s, x, k, JITTER, source)
    picker = rng_for(seed, "nmi-bootstrap")
    draws = np.empty((resamples, *nmi.shape))
    for b in range(resamples):
        idx = picker.integers(0, s.shape[0], s.shape[0])
        draws[b] = _nmi(s[idx], x[:, idx], k, JITTER, source)[0]
    alpha = (1 - confidence) / 2
    lower, upper = np.quantile(draws, [alpha, 1 - alpha], axis=0)
    return NMICurves(nmi=nmi, normalizer=norm, lower=lower, upper=upper)


def leakage_probability(matched_by_rank: ArrayLike) -> FloatArray:
    """Fraction of trials with a matching event ``x_i^(t) = s_i``, per rank (input ``(B, n)`` booleans)."""
    m = np.asarray(matched_by_rank, dtype=bool)
    if m.ndim != 2:
        raise ConfigError("matched_by_rank", f"shape {m.shape}", "expected (trials, n)")
    return np.asarray(m.mean(axis=0), dtype=np.float64)


def mse_curve(x: ArrayLike, truth_lo: ArrayLike, truth_hi: ArrayLike | None = None) -> FloatArray:
    """Paper eq. (mse) at every recorded iteration, averaged over trials.

    ``x`` has shape ``(R, B, n)``; the target of trial b is the interval
    ``[truth_lo[b], truth_hi[b]]`` (a point unless the median of an even count).
    """
    xa = np.asarray(x, dtype=np.float64)
    lo = np.asarray(truth_lo, dtype=np.float64)
    hi = lo if truth_hi is None else np.asarray(truth_hi, dtype=np.float64)
    if xa.ndim != 3 or lo.shape != (xa.shape[1],) or hi.shape != lo.shape:
        raise ConfigError("x", f"shape {xa.shape}", "expected (R, B, n) with one target per trial")
    err = np.maximum(np.maximum(lo[None, :, None] - xa, xa - hi[None, :, None]), 0.0)
    return np.asarray((err**2).mean(axis=2).mean(axis=1), dtype=np.float64)
