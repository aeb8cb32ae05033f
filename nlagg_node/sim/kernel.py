"""The simulator's fused per-phase loop, compiled with numba and run on every core.

The loop calls the elementwise update functions of :mod:`nlagg_node.pdmm`
(``x_piecewise``, ``x_quadratic``, ``z_update``) compiled for scalars, so the
equations still live in one place; what this module adds is only the traversal.

Trials are independent, so the kernel runs them in parallel (``numba.prange`` over
trials) and each trial runs all the iterations of a call before the next trial starts
(trial-major order): one trial's duals, edges and nodes, a few kilobytes, stay in the
core's L1/L2 cache for the whole call instead of streaming every trial's state through
memory once per iteration. Per iteration and trial: one pass over the trial's directed
edges for the dual sums, one over its nodes for x (matching events, convergence
tracking and recording fused in), one over its edge pairs for the z-update, with no
allocation.

A trial's arithmetic does not depend on which thread runs it or on how many threads
there are, so results are bit for bit those of a serial run. The dual sum adds each
node's out-edges in array order, exactly as :func:`nlagg_node.pdmm.dual_sum`
(``np.bincount``) does, so results are also bit for bit those of the networked node.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba.misc.special import literally

from .. import pdmm, termination
from ..jit import njit

_x_quadratic = numba.njit(pdmm.x_quadratic)
_z_update = numba.njit(pdmm.z_update)
# Typed scalar functions (numba's stubs only cover the untyped ones above): Any keeps mypy out.
_x_piecewise: Any = numba.njit(pdmm.x_piecewise)
_is_quiet: Any = numba.njit(termination.is_quiet)
_next_quiet: Any = numba.njit(termination.next_quiet)
_next_stop: Any = numba.njit(termination.next_stop)
_stop_threshold: Any = numba.njit(termination.stop_threshold)
_live_stop: Any = numba.njit(termination.live_stop)
_voids: Any = numba.njit(termination.voids)
_DEPENDS = (pdmm, termination)  # compiled into the kernels: their cache follows these sources too


@njit(nogil=True, depends=_DEPENDS)
def run_trial(
    b: int,
    tracked: bool,
    u: Any,
    src: Any,
    dst: Any,
    p0: int,
    p1: int,
    s_eff: Any,
    s_used: Any,
    cd: Any,
    c: float,
    theta: float,
    quadratic: bool,
    alpha: float,
    beta: float,
    n: int,
    t0: int,
    local0: int,
    t_len: int,
    lo: Any,
    hi: Any,
    matched: Any,
    first_match: Any,
    last_bad: Any,
    record_t: Any,
    recorded: Any,
    rec_ptr: int,
    x: Any,
    early: bool,
    quiet_tol: float,
    window: int,
    threshold: int,
    reach: int,
    hist: Any,
    kq: Any,
    ev: Any,
    ran: Any,
    halt: Any,
    dep_t: Any,
    known: Any,
    fresh: Any,
) -> None:
    """``t_len`` iterations of trial ``b``: nodes ``b n .. b n + n - 1``, edge pairs ``p0 .. p1 - 1``.

    The trial's duals, edge ends (as local node ids) and node data are copied into
    small contiguous buffers first and written back at the end. ``lo``/``hi`` are the
    trial's target interval widened by the tolerance; see :func:`run_phase` for the rest.

    With ``early``, the trial keeps the quiet counters ``kq`` and stop iterations ``ev`` of
    :mod:`nlagg_node.termination` per node (``hist``: its last ``window`` x's) and each node stops
    after the iteration its component agrees on: ``halt[g]`` is then its count of iterations in the
    phase (-1 while it runs), and x stays at its final value in the recorded iterations after. The
    stop reaches ``reach`` hops. ``known[g, d]``: node g knows the departure at iteration
    ``dep_t[d]`` (one hop per iteration); ``fresh[g, d]``: it detected it at the last barrier (set
    between calls), so it is not quiet now. Once every node has stopped, ``ran[b]`` is the phase's
    iteration count (the last node's). ``tracked`` (a compile-time constant: numba compiles the
    kernel once with each value) says whether any node can stop or depart on its own (early
    stopping with departures); without, no per-node check is compiled in.
    """
    literally(tracked)
    half = u.shape[0] // 2
    g0 = b * n
    m = p1 - p0
    # Local edge e < m is pair p0 + e (the first half), e >= m its reverse: per node,
    # the out-edges keep their global array order, so the dual sums add in that order.
    ul = np.empty(2 * m)
    src_l = np.empty(2 * m, dtype=np.int32)
    dst_l = np.empty(2 * m, dtype=np.int32)
    for e in range(m):
        ul[e] = u[p0 + e]
        ul[m + e] = u[half + p0 + e]
        src_l[e] = src[p0 + e] - g0
        src_l[m + e] = src[half + p0 + e] - g0
        dst_l[e] = dst[p0 + e] - g0
        dst_l[m + e] = dst[half + p0 + e] - g0
    vl = np.empty(n)
    xl = np.empty(n)
    n_targets = lo.shape[0]
    off = np.zeros(n_targets, dtype=np.bool_)
    s_l = s_eff[g0 : g0 + n].copy()
    cd_l = cd[g0 : g0 + n].copy()
    k = rec_ptr
    n_rec = record_t.shape[0]
    quiet = np.zeros(n, dtype=np.bool_)
    kmin = np.empty(n, dtype=np.int64)
    emin = np.empty(n, dtype=np.int64)
    n_dep = dep_t.shape[0]
    seen = np.empty((n, n_dep), dtype=np.bool_)
    halting = np.zeros(n, dtype=np.bool_)
    lo0, hi0 = lo[0], hi[0]
    for i in range(n):  # halted nodes keep their x; the others compute it before any use
        xl[i] = x[g0 + i]
    for t in range(t_len):
        if ran[b] >= 0:
            if k < n_rec and record_t[k] == t0 + t:
                for i in range(n):
                    recorded[k, g0 + i] = xl[i]
                k += 1
            continue
        vl[:] = 0.0
        for e in range(2 * m):
            vl[src_l[e]] += ul[e]
        off0 = False
        if tracked:  # the targets of fewer departures (the engine's; one without departures)
            for q in range(1, n_targets):
                off[q] = False
        for i in range(n):
            if tracked and halt[g0 + i] >= 0:  # publishes nothing: its x stays
                xi = xl[i]
            else:
                if cd_l[i] == 0.0:  # no neighbour left (nlagg_node.departure): its value, or NaN if departed
                    xi = s_l[i]
                elif quadratic:
                    xi = _x_quadratic(vl[i], s_l[i], cd_l[i])
                else:
                    xi = _x_piecewise(vl[i], s_l[i], cd_l[i], alpha, beta)
                if not quadratic and xi == s_used[g0 + i] and not matched[g0 + i]:
                    matched[g0 + i] = True
                    first_match[g0 + i] = t0 + t
            xl[i] = xi
            off0 = off0 or xi < lo0 or xi > hi0
            if tracked:
                for q in range(1, n_targets):
                    off[q] = off[q] or xi < lo[q] or xi > hi[q]
        if off0:
            last_bad[0, b] = local0 + t
        if tracked:
            for q in range(1, n_targets):
                if off[q]:
                    last_bad[q, b] = local0 + t
        if k < n_rec and record_t[k] == t0 + t:
            for i in range(n):
                recorded[k, g0 + i] = xl[i]
            k += 1
        stop_now = False
        if early:
            lt = local0 + t
            slot = lt % window
            now = t0 + t
            for i in range(n):
                if tracked and halt[g0 + i] >= 0:
                    continue
                detected = False
                if tracked:
                    for d in range(n_dep):
                        detected = detected or fresh[g0 + i, d]
                        seen[i, d] = known[g0 + i, d] or fresh[g0 + i, d]
                        fresh[g0 + i, d] = False
                quiet[i] = not detected and lt >= window and _is_quiet(xl[i], hist[g0 + i, slot], quiet_tol)
                hist[g0 + i, slot] = xl[i]
                kmin[i] = kq[g0 + i]
                emin[i] = _live_stop(ev[g0 + i], now)
            for e in range(2 * m):
                a_ = src_l[e]
                j_ = g0 + dst_l[e]
                kmin[a_] = min(kmin[a_], kq[j_])
                emin[a_] = min(emin[a_], _live_stop(ev[j_], now))
                if tracked:
                    for d in range(n_dep):
                        seen[a_, d] = seen[a_, d] or known[j_, d]
            for i in range(n):
                if tracked and halt[g0 + i] >= 0:
                    continue
                if tracked:
                    for d in range(n_dep):
                        known[g0 + i, d] = seen[i, d]
                kq[g0 + i] = _next_quiet(quiet[i], kmin[i])
                ev[g0 + i] = _next_stop(emin[i], kq[g0 + i], now, threshold, reach)
                if ev[g0 + i] == now:
                    void = False
                    if tracked:
                        for d in range(n_dep):
                            void = void or (known[g0 + i, d] and _voids(dep_t[d], now, reach))
                    halting[i] = not void
                    stop_now = stop_now or halting[i]
        for p in range(m):
            q = p + m
            if tracked and (halt[g0 + dst_l[p]] >= 0 or halt[g0 + dst_l[q]] >= 0):
                continue  # a stopped component's duals stay as they were
            a = ul[p]
            r = ul[q]
            ul[p] = _z_update(a, r, xl[dst_l[p]], c, theta)
            ul[q] = _z_update(r, a, xl[dst_l[q]], c, theta)
        if stop_now:
            done = True
            for i in range(n):
                if halting[i]:
                    halt[g0 + i] = local0 + t + 1
                    halting[i] = False
                done = done and halt[g0 + i] >= 0
            if done:
                ran[b] = local0 + t + 1
    for e in range(m):
        u[p0 + e] = ul[e]
        u[half + p0 + e] = ul[m + e]
    for i in range(n):
        x[g0 + i] = xl[i]


@njit(nogil=True, depends=_DEPENDS)
def _run_trial_of(b: int, st: Any, tracked: bool) -> None:
    """Trial ``b`` of :func:`run_phase` (``st``: its arguments, in order, as one tuple)."""
    literally(tracked)
    (u, src, dst, pair_start, s_eff, s_used, cd, c, theta, quadratic, alpha, beta, n, t0, local0, t_len,
     target_lo, target_hi, tolerance, matched, first_match, last_bad, record_t, recorded, rec_ptr, x,
     early, window, reach, hist, kq, ev, ran, halt, dep_t, known, fresh) = st  # fmt: skip
    run_trial(
        b,
        tracked,
        u,
        src,
        dst,
        pair_start[b],
        pair_start[b + 1],
        s_eff,
        s_used,
        cd,
        c,
        theta,
        quadratic,
        alpha,
        beta,
        n,
        t0,
        local0,
        t_len,
        target_lo[:, b] - tolerance,
        target_hi[:, b] + tolerance,
        matched,
        first_match,
        last_bad,
        record_t,
        recorded,
        rec_ptr,
        x,
        early,
        tolerance,
        window,
        _stop_threshold(reach[b], window),
        reach[b],
        hist,
        kq,
        ev,
        ran,
        halt,
        dep_t,
        known,
        fresh,
    )


@njit(parallel=True, depends=_DEPENDS)
def run_phase(
    u: Any,
    src: Any,
    dst: Any,
    pair_start: Any,
    s_eff: Any,
    s_used: Any,
    cd: Any,
    c: float,
    theta: float,
    quadratic: bool,
    alpha: float,
    beta: float,
    n: int,
    t0: int,
    local0: int,
    t_len: int,
    target_lo: Any,
    target_hi: Any,
    tolerance: float,
    matched: Any,
    first_match: Any,
    last_bad: Any,
    record_t: Any,
    recorded: Any,
    rec_ptr: int,
    x: Any,
    early: bool,
    window: int,
    reach: Any,
    hist: Any,
    kq: Any,
    ev: Any,
    ran: Any,
    halt: Any,
    dep_t: Any,
    known: Any,
    fresh: Any,
    parallel: bool,
) -> int:
    """Run ``t_len`` iterations of every trial in place on ``u`` (signed duals) and ``x``.

    Returns the new ``rec_ptr``. Trial ``b`` owns nodes ``b n .. b n + n - 1`` and the
    edge pairs ``pair_start[b] .. pair_start[b + 1] - 1`` (directed edge ``p`` and its
    reverse ``p + E / 2``, the :class:`nlagg_node.graphs.EdgeLayout` order). ``t0`` is the
    global iteration of the first step and ``local0`` its index within the phase.
    ``matched``/``first_match`` (per node), ``last_bad`` (``(Q, trials)``: last phase-local
    iteration with a node farther than ``tolerance`` from ``[target_lo, target_hi]``, per target
    row: with early stopping and departures, one per set of departures that may have happened)
    and ``recorded[k]`` (x at global iteration ``record_t[k]``) are updated in place, and so
    are the early-stop state ``hist``/``kq``/``ev``/``halt``/``known``/``fresh`` (per node) and
    ``ran`` (per trial, -1 while running) when ``early`` (``reach``: each trial's stop reach,
    :func:`nlagg_node.termination.stop_reach`; ``dep_t``: the run's departure iterations).

    With ``parallel`` the trials are shared out over numba's threads (``prange``); without,
    they run one after the other on the calling thread and no thread pool is woken, which
    for a handful of trials (or on a busy machine) is faster. A trial's arithmetic is the same
    either way, so every bit of the result is too.
    """
    n_trials = last_bad.shape[1]
    rec_end = rec_ptr
    while rec_end < record_t.shape[0] and record_t[rec_end] < t0 + t_len:
        rec_end += 1
    st = (u, src, dst, pair_start, s_eff, s_used, cd, c, theta, quadratic, alpha, beta, n, t0, local0, t_len,
          target_lo, target_hi, tolerance, matched, first_match, last_bad, record_t, recorded, rec_ptr, x,
          early, window, reach, hist, kq, ev, ran, halt, dep_t, known, fresh)  # fmt: skip
    tracked = early and dep_t.shape[0] > 0  # nodes may stop or depart apart
    if parallel:
        for b in numba.prange(n_trials):
            if tracked:
                _run_trial_of(b, st, True)
            else:
                _run_trial_of(b, st, False)
    else:
        for b in range(n_trials):
            if tracked:
                _run_trial_of(b, st, True)
            else:
                _run_trial_of(b, st, False)
    return rec_end
