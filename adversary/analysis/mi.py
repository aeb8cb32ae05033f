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

With the same jitter values, :func:`mutual_information` equals ``npeet_plus.mi`` to the
bit (one compiled call per pair forms the digamma means in NumPy's summation order), and
the batched paths (:func:`mutual_information_many`, the NMI curves) to rounding of their
sequential means (about 1e-14 bits). The 1-D x 1-D case, the only one the NMI curves need,
runs in compiled kernels (:mod:`adversary.analysis.ksg_kernels`): an exact k-nearest-neighbour
search for the 2-D max-norm by a sweep along one sorted coordinate (pruned as soon as
the coordinate gap alone exceeds the current k-th distance, and started from a bound
inherited from the previous point), and exact marginal counts on the sorted values with
the same floating-point predicate ``|x_j - x_i| <= r`` that the tree query evaluates.
The NMI curves run one chain of pairs per rank, reusing the sort of S_r and of the
previous X_r^(t), on all cores.
Multi-dimensional variables (the ideal-world side information of
:mod:`adversary.bounds`) use a scipy k-d tree with identical conventions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import digamma

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.errors import ConfigError
from nlagg_node.rng import rng_for

from .ksg_kernels import ksg_batch, ksg_chains, ksg_one

RandomSource = np.random.Generator | np.random.RandomState

JITTER = 1e-10
"""NPEET's jitter intensity (``add_noise(x, intens=1e-10)``)."""
_RADIUS_SHRINK = 1e-15
"""NPEET counts marginal neighbours strictly inside ``eps_i`` as ``<= eps_i - 1e-15``."""
_PAIRS_PER_CHUNK = 2048


# Public API ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _digamma_table(n: int) -> FloatArray:
    """``psi(0..n)`` (``psi(0) = -inf``), computed once per N and shared read-only."""
    table = np.asarray(digamma(np.arange(n + 1, dtype=np.float64)), dtype=np.float64)
    table[0] = -np.inf
    table.flags.writeable = False
    return table


@functools.lru_cache(maxsize=16)
def _constant(k: int, n: int) -> float:
    """``(psi(k) + psi(N)) / ln 2``, the part of the estimate that does not depend on the samples."""
    return float((digamma(k) + digamma(n)) / math.log(2.0))


@functools.lru_cache(maxsize=16)
def _digammas(k: int, n: int) -> tuple[float, float]:
    """``(psi(k), psi(N))``, added one by one in NPEET's order after ``-<psi(n_x)> - <psi(n_y)>``."""
    return float(digamma(k)), float(digamma(n))


@functools.cache
def _process_rng() -> np.random.Generator:
    """The jitter source of calls without ``rng``: OS entropy, drawn once per process."""
    return np.random.default_rng()


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
        return np.ascontiguousarray(a)
    return (
        a + jitter * rng.random_sample(a.shape)
        if isinstance(rng, np.random.RandomState)
        else (a + jitter * rng.random(a.shape))
    )


def _noise(shape: tuple[int, ...], jitter: float, rng: RandomSource) -> FloatArray:
    """``jitter * U[0, 1)`` of the given shape, drawn in C order (the order of separate calls)."""
    u = rng.random_sample(shape) if isinstance(rng, np.random.RandomState) else rng.random(shape)
    u *= jitter
    return np.asarray(u, dtype=np.float64)


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
    source: RandomSource = rng if rng is not None else _process_rng()
    xa = _jittered(xa, jitter, source)
    ya = _jittered(ya, jitter, source)
    if xa.shape[1] == 1 and ya.shape[1] == 1:
        # One compiled call: counts and digamma means; jittered columns are contiguous already.
        a, b = ksg_one(xa.reshape(n), ya.reshape(n), k, _digamma_table(n))
        dk, dn = _digammas(k, n)
        return (-a - b + dk + dn) / math.log(2.0)
    from scipy.spatial import cKDTree

    joint = np.hstack([xa, ya])
    eps = cKDTree(joint).query(joint, k=k + 1, p=np.inf)[0][:, k]
    radius = eps - _RADIUS_SHRINK
    return float(_ksg_from_counts(_tree_counts(xa, radius)[None], _tree_counts(ya, radius)[None], k)[0])


def mutual_information_many(
    x: ArrayLike,
    y: ArrayLike,
    k: int = 3,
    *,
    jitter: float = JITTER,
    rng: RandomSource | None = None,
) -> FloatArray:
    """:func:`mutual_information` of many 1-D pairs at once: ``I(x_p; y_p)`` for every row p of ``y``.

    Parameters
    ----------
    x
        Shape ``(P, N)``, one row per pair, or ``(N,)``: the same x for every pair (for
        example ``S_r`` against ``X_r^(t)`` for many t), sorted once for all of them.
    y
        Shape ``(P, N)``.
    k, jitter, rng
        As in :func:`mutual_information`. Each pair gets its own jitter (its x row, then
        its y row, as P separate calls would draw it), so with the same ``rng`` the
        result equals P calls of :func:`mutual_information` (and NPEET's ``mi``).

    Returns
    -------
    ndarray
        Shape ``(P,)``, in bits. The pairs run in parallel on all cores.
    """
    ya = np.asarray(y, dtype=np.float64)
    xa = np.asarray(x, dtype=np.float64)
    if ya.ndim != 2 or xa.shape not in (ya.shape, ya.shape[1:]):
        raise ConfigError(
            "y", f"shape {ya.shape}", f"expected (P, N) with x of shape (P, N) or (N,); x has {xa.shape}"
        )
    _check_k(k, ya.shape[1])
    if jitter < 0 or not math.isfinite(jitter):
        raise ConfigError("jitter", jitter, "must be a finite number >= 0")
    source: RandomSource = rng if rng is not None else _process_rng()
    if xa.ndim == 1:
        if not np.isfinite(xa).all():
            raise ConfigError("x", "non-finite entries", "samples must be finite numbers")
        return _batch(xa[None], ya, k, jitter, source, np.argsort(xa)[None])
    return _batch(xa, ya, k, jitter, source, None)


mutual_information_batch = mutual_information_many
"""The earlier name of :func:`mutual_information_many`."""


def _batch(
    xa: FloatArray, ya: FloatArray, k: int, jitter: float, source: RandomSource, x_hint: IntArray | None
) -> FloatArray:
    """The batch estimate of rows ``xa`` ((P, N), or (1, N) for all) against rows ``ya``.

    ``x_hint`` are nearly sorting orders of the x rows, (P, N) or (1, N) for all.
    """
    n_pairs, n = ya.shape
    table = _digamma_table(n)
    const = _constant(k, n)
    out = np.empty(n_pairs)
    shared_x = len(xa) == 1
    for start in range(0, n_pairs, _PAIRS_PER_CHUNK):
        stop = min(n_pairs, start + _PAIRS_PER_CHUNK)
        # One draw in the order separate calls would make: per pair the x row, then the y row.
        noise = _noise((stop - start, 2, n), jitter, source) if jitter else np.empty((stop - start, 2, 0))
        hints = (
            np.empty((stop - start, 0), dtype=np.int64)
            if x_hint is None
            else np.ascontiguousarray(x_hint if len(x_hint) == 1 else x_hint[start:stop], dtype=np.int64)
        )
        part = np.empty(stop - start)
        xs = xa if shared_x else xa[start:stop]
        ys = ya[start:stop]
        ksg_batch(np.ascontiguousarray(xs), np.ascontiguousarray(ys), noise, hints, k, table, part)
        if np.isnan(part).any():
            field = "y" if np.isfinite(xs).all() else "x"
            raise ConfigError(field, "non-finite entries", "samples must be finite numbers")
        out[start:stop] = part / math.log(2.0) + const
    return out


def _chained(
    st: FloatArray, x: FloatArray, order: IntArray, k: int, jitter: float, source: RandomSource
) -> FloatArray:
    """``mi(S_r, X_r^(t))`` for all (t, r): jitter drawn pair by pair in (t, r) order, ranks in parallel."""
    R, _, n_ranks = x.shape
    n = st.shape[1]
    table = _digamma_table(n)
    const = _constant(k, n)
    y_order = np.full((n_ranks, n), -1, dtype=np.int64)
    raw = np.empty((R, n_ranks))
    step = max(1, _PAIRS_PER_CHUNK // n_ranks)
    for t0 in range(0, R, step):
        t1 = min(R, t0 + step)
        noise = _noise((t1 - t0, n_ranks, 2, n), jitter, source)
        xs = st[None] + noise[:, :, 0] if jitter else np.broadcast_to(st[None], (t1 - t0, n_ranks, n))
        ys = x[t0:t1].transpose(0, 2, 1) + noise[:, :, 1] if jitter else x[t0:t1].transpose(0, 2, 1)
        part = np.empty((t1 - t0, n_ranks))
        ksg_chains(np.ascontiguousarray(xs), np.ascontiguousarray(ys), order, y_order, k, table, part)
        raw[t0:t1] = part / math.log(2.0) + const
    return raw


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
    _check_k(k, s.shape[0])
    if not (np.isfinite(s).all() and np.isfinite(x).all()):
        raise ConfigError("x_by_rank", "non-finite entries", "values and states must be finite numbers")
    st = np.ascontiguousarray(s.T)
    order = np.argsort(st, axis=1)  # S_r is the x of every pair of rank r: sort it once
    norm = _batch(st, st, k, jitter, source, order)
    raw = _chained(st, x, order, k, jitter, source)
    return raw / norm[None, :], norm


def nmi_with_bootstrap(
    s_by_rank: ArrayLike,
    x_by_rank: ArrayLike,
    k: int = 3,
    *,
    resamples: int = 20,
    confidence: float = 0.9,
    fraction: float = 0.8,
    seed: int = 0,
) -> NMICurves:
    """:func:`nmi_curves` plus percentile bands from resampling the trials.

    A plain bootstrap duplicates trials, and duplicated samples (apart only by the
    1e-10 jitter) have near-zero neighbour distances that bias a KSG estimate far
    upwards. Each resample therefore draws ``fraction`` of the trials *without*
    replacement (m-out-of-n subsampling; the same trials for every rank and
    iteration, fresh jitter). The band is the spread of the estimator at that smaller
    sample size, so it is slightly conservative for the full-sample estimate.
    """
    s = np.asarray(s_by_rank, dtype=np.float64)
    x = np.asarray(x_by_rank, dtype=np.float64)
    _check_curve_inputs(s, x)
    if resamples < 2:
        raise ConfigError("resamples", resamples, "need at least 2 resamples")
    if not 0 < confidence < 1:
        raise ConfigError("confidence", confidence, "must lie in (0, 1)")
    m = round(fraction * s.shape[0])
    if not 0 < fraction < 1 or m <= k + 1:
        raise ConfigError(
            "fraction", fraction, f"must lie in (0, 1) and keep more than k + 1 = {k + 1} trials"
        )
    source = rng_for(seed, "nmi-jitter")
    nmi, norm = _nmi(s, x, k, JITTER, source)
    picker = rng_for(seed, "nmi-bootstrap")
    draws = np.empty((resamples, *nmi.shape))
    for b in range(resamples):
        idx = np.sort(picker.choice(s.shape[0], size=m, replace=False))
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
