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

Early stopping (:mod:`nlagg_node.termination`) where no node departs: every node of a trial stops
at the same iteration ``t* + D``, ``t*`` the first iteration at which a node's quiet counter reaches
``D + W`` (the rule's proof), so the kernel keeps the quiet counters and the trial's one stop
iteration, and after the proposal nothing more. A counter reaches ``m`` at t exactly when every
node j was quiet throughout ``[t - m + 1, t - d(i, j)]``, so a proposal at t needs every node quiet
at ``t - D - W + 1``: the counters start at the trial's first iteration with every node quiet
(``calm_from``, phase-local), from 0, and reach ``D + W`` when those kept from the phase's start
would (those started at s are ``min(k, t - s + 1)``); before it, a pass over the nodes asks only
whether all are. ``hist[s, g]``: node g's x at its last phase-local iteration equal to s modulo W.
Where nodes may stop or depart apart, each node's stop iteration and known departures as the nodes
keep them.

The run's arguments come as one tuple ``run = (graph, values, rule, span, judge, record, x, stop,
departed)`` of groups (tuples, and ``x`` the nodes' x), unpacked once per trial:

* ``graph``: ``(u, src, dst, pair_start, cd)``, the signed duals (updated in place), the directed
  edges, each trial's first edge pair and ``c d_i`` per node;
* ``values``: ``(s_eff, s_used)``, the values the x-update uses and those a match is judged on;
* ``rule``: ``(c, theta, quadratic, alpha, beta)``, the phase's update rule;
* ``span``: ``(n, t0, local0, t_len)``, the trial size, the global and phase-local iteration of
  the first step and how many to run;
* ``judge``: ``(target_lo, target_hi, tolerance, matched, first_match, last_bad)``;
* ``record``: ``(record_t, recorded, rec_ptr)``;
* ``stop``: ``(early, window, reach, hist, kq, ev, ran, halt, calm_from, certify, sign, pin, bc,
  offered)`` (flat: a parallel loop takes no nested tuples), the last five: whether the phase stops
  on the certificate, the operator's sign and per node its pin run, signed candidate and whether its
  value ever entered a candidate
  (:mod:`nlagg_node.termination`, "the certified stop": the quiet test is then :func:`_certify`'s,
  and the rest of the rule is the same);
* ``departed``: ``(dep_t, known, fresh)``.

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
_csr_diameter: Any = numba.njit(termination.csr_diameter)
_next_pin_run: Any = numba.njit(termination.next_pin_run)
_own_candidate: Any = numba.njit(termination.own_candidate)
_next_candidate: Any = numba.njit(termination.next_candidate)
_is_certified: Any = numba.njit(termination.is_certified)
_recent: Any = numba.njit(termination.recent)
_DEPENDS = (pdmm, termination)  # compiled into the kernels: their cache follows these sources too


@numba.njit
def _load_trial(u: Any, src: Any, dst: Any, p0: int, p1: int, g0: int) -> Any:
    """The trial's duals and edge ends (local node ids) in contiguous buffers.

    Local edge e < m is pair p0 + e (the first half), e >= m its reverse: per node, the out-edges
    keep their global array order, so the dual sums add in that order.
    """
    half = u.shape[0] // 2
    m = p1 - p0
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
    return ul, src_l, dst_l


@numba.njit
def _local_neighbours(src_l: Any, dst_l: Any, n: int) -> Any:
    """Each local node's neighbours, ``nb[ptr[i]:ptr[i + 1]]`` (CSR)."""
    ptr = np.zeros(n + 1, dtype=np.int32)
    for e in range(src_l.shape[0]):
        ptr[src_l[e] + 1] += 1
    for i in range(n):
        ptr[i + 1] += ptr[i]
    nb = np.empty(src_l.shape[0], dtype=np.int32)
    fill = ptr[:n].copy()
    for e in range(src_l.shape[0]):
        nb[fill[src_l[e]]] = dst_l[e]
        fill[src_l[e]] += 1
    return ptr, nb


@numba.njit
def _off_rows(xl: Any, lo: Any, hi: Any, off: Any, last_bad: Any, b: int, lt: int) -> None:
    """``last_bad[q, b] = lt`` for the target rows q >= 1 some x lies outside of (the targets of
    fewer departures; tracked runs only)."""
    for q in range(1, lo.shape[0]):
        off[q] = False
        for i in range(xl.shape[0]):
            off[q] = off[q] or xl[i] < lo[q] or xl[i] > hi[q]
        if off[q]:
            last_bad[q, b] = lt


@numba.njit
def _certify(xl: Any, s_l: Any, cert: Any, window: int, g0: int, nbrs: Any, halt: Any, scratch: Any) -> bool:
    """The certified stop's step at every running node: pin run, candidate ``b`` from the
    neighbours' of the last iteration (``nbrs = (ptr, nb)``) and the quiet test into
    ``scratch[0]``; ``scratch[6]``: the nodes that know a recent departure (reset). True when every
    running node is quiet."""
    sign, pin, bc, offered = cert[1], cert[2], cert[3], cert[4]
    ptr, nb = nbrs
    quiet, reset, bnew = scratch[0], scratch[6], scratch[7]
    all_quiet = True
    for i in range(xl.shape[0]):
        if halt[g0 + i] >= 0:
            continue
        pin[g0 + i] = _next_pin_run(xl[i], s_l[i], pin[g0 + i])
        own = _own_candidate(sign * s_l[i], pin[g0 + i], window)
        offered[g0 + i] = offered[g0 + i] or pin[g0 + i] >= window
        b_max = bc[g0 + i]
        for p in range(ptr[i], ptr[i + 1]):
            b_max = max(b_max, bc[g0 + nb[p]])
        bnew[i] = _next_candidate(b_max, own, reset[i])
        quiet[i] = not reset[i] and _is_certified(sign * s_l[i], bnew[i])
        all_quiet = all_quiet and quiet[i]
    for i in range(xl.shape[0]):
        if halt[g0 + i] < 0:
            bc[g0 + i] = bnew[i]
    return all_quiet


@numba.njit
def _stop_apart(
    xl: Any,
    s_l: Any,
    edges: Any,
    g0: int,
    lt: int,
    now: int,
    stop: Any,
    departed: Any,
    tolerance: float,
    scratch: Any,
) -> bool:
    """Early stop where nodes may stop or depart apart: the rule node by node (``halting[i]``:
    node i stops after this iteration); True if any does. ``edges = (src_l, dst_l, ptr, nb)``."""
    window, reach, hist, kq, ev, halt, cert = stop[1], stop[2], stop[3], stop[4], stop[5], stop[7], stop[8]
    src_l, dst_l, ptr, nb = edges
    dep_t, known, fresh = departed
    quiet, kmin, emin, seen, halting, reset = (
        scratch[0],
        scratch[1],
        scratch[2],
        scratch[3],
        scratch[4],
        scratch[6],
    )
    n = xl.shape[0]
    n_dep = dep_t.shape[0]
    threshold = _stop_threshold(reach, window)
    slot = lt % window
    for i in range(n):
        if halt[g0 + i] >= 0:
            continue
        detected = False
        for d in range(n_dep):
            detected = detected or fresh[g0 + i, d]
            seen[i, d] = known[g0 + i, d] or fresh[g0 + i, d]
            fresh[g0 + i, d] = False
        if not cert[0]:  # the tolerance test (a certified phase's comes from _certify below)
            quiet[i] = not detected and lt >= window and _is_quiet(xl[i], hist[slot, g0 + i], tolerance)
            hist[slot, g0 + i] = xl[i]
        kmin[i] = kq[g0 + i]
        emin[i] = _live_stop(ev[g0 + i], now)
    for e in range(src_l.shape[0]):
        a_ = src_l[e]
        j_ = g0 + dst_l[e]
        kmin[a_] = min(kmin[a_], kq[j_])
        emin[a_] = min(emin[a_], _live_stop(ev[j_], now))
        for d in range(n_dep):
            seen[a_, d] = seen[a_, d] or known[j_, d]
    if cert[0]:
        for i in range(n):
            reset[i] = False
            for d in range(n_dep):
                reset[i] = reset[i] or (seen[i, d] and _recent(dep_t[d], now, reach))
        _certify(xl, s_l, cert, window, g0, (ptr, nb), halt, scratch)
    stop_now = False
    for i in range(n):
        if halt[g0 + i] >= 0:
            continue
        for d in range(n_dep):
            known[g0 + i, d] = seen[i, d]
        kq[g0 + i] = _next_quiet(quiet[i], kmin[i])
        ev[g0 + i] = _next_stop(emin[i], kq[g0 + i], now, threshold, reach)
        if ev[g0 + i] == now:
            void = False
            for d in range(n_dep):
                void = void or (known[g0 + i, d] and _voids(dep_t[d], now, reach))
            halting[i] = not void
            stop_now = stop_now or halting[i]
    return stop_now


@numba.njit
def _halt(halting: Any, stop: Any, b: int, g0: int, ran_so_far: int, everyone: bool) -> None:
    """The halting nodes (every node: ``everyone``) stop after ``ran_so_far`` iterations of the
    phase; once every node has, so has the trial."""
    ran, halt = stop[6], stop[7]
    done = True
    for i in range(halting.shape[0]):
        if everyone or halting[i]:
            halt[g0 + i] = ran_so_far
            halting[i] = False
        done = done and halt[g0 + i] >= 0
    if done:
        ran[b] = ran_so_far


@numba.njit
def _record_x(record: Any, k: int, xl: Any, g0: int) -> int:
    """Store the trial's x in record slot ``k``; the next slot."""
    for i in range(xl.shape[0]):
        record[1][k, g0 + i] = xl[i]
    return k + 1


@numba.njit
def _count_quiet(xl: Any, slot: int, calm: bool, g0: int, now: int, counters: Any) -> None:
    """The quiet counters of a trial whose nodes stop together (``kq``, from the trial's first
    iteration with every node quiet, ``calm_from``: none can reach ``D + W`` before ``D + W - 1``
    iterations after it, and counters that start from 0 there reach it when those from the phase's
    start do); at the first proposal, the trial's stop iteration ``t* + D`` in ``ev`` (module docs).
    ``calm``: every node is quiet now and ``hist`` holds this iteration already. The minimum over
    the neighbours is taken only at quiet nodes with a positive counter, and not at all while every
    node is quiet with the same counter (each then adds 1). ``counters``: ``(hist, tolerance, quiet,
    kq, knew, ev, ptr, nb, threshold, reach)``."""
    hist, tolerance, quiet = counters[0], counters[1], counters[2]
    for i in range(quiet.shape[0]):
        quiet[i] = calm or _is_quiet(xl[i], hist[slot, g0 + i], tolerance)
        hist[slot, g0 + i] = xl[i]
    _advance_counters(g0, now, counters)


@numba.njit
def _advance_counters(g0: int, now: int, counters: Any) -> None:
    """:func:`_count_quiet`'s counters and proposal from the quiet tests already in ``quiet``
    (``counters[2]``; the certified stop's come from :func:`_certify`)."""
    _, _, quiet, kq, knew, ev, ptr, nb, threshold, reach = counters
    n = quiet.shape[0]
    same = True
    for i in range(n):
        same = same and quiet[i] and kq[g0 + i] == kq[g0]
    for i in range(n):
        k_min = kq[g0 + i] if quiet[i] else 0
        for p in range(ptr[i], ptr[i + 1] if k_min > 0 and not same else ptr[i]):
            k_min = min(k_min, kq[g0 + nb[p]])
        knew[i] = _next_quiet(quiet[i], k_min)
    proposed = False
    for i in range(n):
        kq[g0 + i] = knew[i]
        proposed = proposed or knew[i] >= threshold
    if proposed:
        for i in range(n):
            ev[g0 + i] = _next_stop(termination.NO_STOP, threshold, now, threshold, reach)


@njit(nogil=True, depends=_DEPENDS)
def run_trial(b: int, tracked: bool, run: Any) -> None:
    """The iterations ``span`` gives of trial ``b`` (nodes ``b n .. b n + n - 1``), in local buffers.

    The loop calls only scalar functions, and others where rare: a call with arrays per iteration
    costs as much as the iteration. ``halt[g]``: node g's iterations in the phase once it stopped
    (-1 while it runs), ``ran[b]`` the phase's once all have. ``tracked`` (compiled in as a
    constant): nodes may stop or depart apart (:func:`_stop_apart`); without, they stop together.
    """
    literally(tracked)
    graph, values, rule, span, judge, record, x, stop, departed = run
    u, src, dst, pair_start, cd = graph
    s_eff, s_used = values
    c, theta, quadratic, alpha, beta = rule
    n, t0, local0, t_len = span
    target_lo, target_hi, tolerance, matched, first_match, last_bad = judge
    early, window, reach, hist, kq, ev, ran, halt, calm_from, certify, sign, pin, bc, offered = stop
    cert = (certify, sign, pin, bc, offered)
    g0 = b * n
    ul, src_l, dst_l = _load_trial(u, src, dst, pair_start[b], pair_start[b + 1], g0)
    m = ul.shape[0] // 2
    ptr, nb = _local_neighbours(src_l, dst_l, n)
    lo, hi = target_lo[:, b] - tolerance, target_hi[:, b] + tolerance
    lo0, hi0 = lo[0], hi[0]
    trial_stop = (early, window, reach[b], hist, kq, ev, ran, halt, cert)
    scratch = _scratch(n, departed[0].shape[0], lo.shape[0])
    threshold, vl, knew = _stop_threshold(reach[b], window), np.empty(n), np.empty(n, dtype=np.int64)
    counters = (hist, tolerance, scratch[0], kq, knew, ev, ptr, nb, threshold, reach[b])
    xl = x[g0 : g0 + n].copy()  # halted nodes keep their x; the others compute it before any use
    s_l, cd_l = s_eff[g0 : g0 + n].copy(), cd[g0 : g0 + n].copy()
    k, n_rec = record[2], record[0].shape[0]
    for t in range(t_len):
        now, lt = t0 + t, local0 + t
        recorded = k < n_rec and record[0][k] == now
        if ran[b] >= 0:
            k = _record_x(record, k, xl, g0) if recorded else k
            continue
        vl[:] = 0.0
        for e in range(2 * m):
            vl[src_l[e]] += ul[e]
        off0 = False
        for i in range(n):
            xi = xl[i]  # a stopped node publishes nothing: its x stays
            if not (tracked and halt[g0 + i] >= 0):
                if cd_l[i] == 0.0:  # no neighbour left (nlagg_node.departure): its value, or NaN
                    xi = s_l[i]
                elif quadratic:
                    xi = _x_quadratic(vl[i], s_l[i], cd_l[i])
                else:
                    xi = _x_piecewise(vl[i], s_l[i], cd_l[i], alpha, beta)
                if not quadratic and xi == s_used[g0 + i] and not matched[g0 + i]:
                    matched[g0 + i] = True
                    first_match[g0 + i] = now
            xl[i] = xi
            off0 = off0 or xi < lo0 or xi > hi0
        if off0:
            last_bad[0, b] = lt
        if tracked:
            _off_rows(xl, lo, hi, scratch[5], last_bad, b, lt)
        k = _record_x(record, k, xl, g0) if recorded else k
        stop_now = False
        if early and tracked:
            edges = (src_l, dst_l, ptr, nb)
            stop_now = _stop_apart(xl, s_l, edges, g0, lt, now, trial_stop, departed, tolerance, scratch)
        elif early and cert[0] and ev[g0] == termination.NO_STOP:  # certified, no proposal yet
            calm = _certify(xl, s_l, cert, window, g0, (ptr, nb), halt, scratch)
            calm_from[b] = lt if calm and calm_from[b] < 0 else calm_from[b]
            if calm_from[b] >= 0:
                _advance_counters(g0, now, counters)
        elif early and ev[g0] == termination.NO_STOP:  # no proposal yet
            slot, calm = lt % window, calm_from[b] < 0 and lt >= window
            for i in range(n if calm_from[b] < 0 else 0):  # until every node is quiet at once, only that
                calm = calm & _is_quiet(xl[i], hist[slot, g0 + i], tolerance)
                hist[slot, g0 + i] = xl[i]
            calm_from[b] = lt if calm else calm_from[b]
            if calm_from[b] >= 0:
                _count_quiet(xl, slot, calm, g0, now, counters)
        elif early:
            stop_now = ev[g0] == now
        for p in range(m):
            q = p + m
            if tracked and (halt[g0 + dst_l[p]] >= 0 or halt[g0 + dst_l[q]] >= 0):
                continue  # a stopped component's duals stay as they were
            a, r = ul[p], ul[q]
            ul[p] = _z_update(a, r, xl[dst_l[p]], c, theta)
            ul[q] = _z_update(r, a, xl[dst_l[q]], c, theta)
        if stop_now:
            _halt(scratch[4], trial_stop, b, g0, lt + 1, not tracked)
    _store_trial(u, ul, pair_start[b], x, xl, g0)


@numba.njit
def _scratch(n: int, n_dep: int, n_targets: int) -> Any:
    """Per-node work arrays of :func:`_stop_apart` and :func:`_off_rows`."""
    quiet = np.zeros(n, dtype=np.bool_)
    kmin = np.empty(n, dtype=np.int64)
    emin = np.empty(n, dtype=np.int64)
    seen = np.empty((n, n_dep), dtype=np.bool_)
    halting = np.zeros(n, dtype=np.bool_)
    reset = np.zeros(n, dtype=np.bool_)
    bnew = np.empty(n)
    return quiet, kmin, emin, seen, halting, np.zeros(n_targets, dtype=np.bool_), reset, bnew


@numba.njit
def _store_trial(u: Any, ul: Any, p0: int, x: Any, xl: Any, g0: int) -> None:
    """Write the trial's duals and x back (the inverse of :func:`_load_trial`)."""
    m = ul.shape[0] // 2
    half = u.shape[0] // 2
    for e in range(m):
        u[p0 + e] = ul[e]
        u[half + p0 + e] = ul[m + e]
    x[g0 : g0 + xl.shape[0]] = xl


@njit(parallel=True, depends=_DEPENDS)
def run_phase(run: Any, parallel: bool) -> int:
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
    ``run`` holds the groups of the module docs.

    With ``parallel`` the trials are shared out over numba's threads (``prange``); without,
    they run one after the other on the calling thread and no thread pool is woken, which
    for a handful of trials (or on a busy machine) is faster. A trial's arithmetic is the same
    either way, so every bit of the result is too.
    """
    graph, values, rule, span, judge, record, x, stop, departed = run
    n_trials = judge[5].shape[1]
    t0, t_len = span[1], span[3]
    record_t = record[0]
    rec_end: int = record[2]
    while rec_end < record_t.shape[0] and record_t[rec_end] < t0 + t_len:
        rec_end += 1
    tracked = stop[0] and departed[0].shape[0] > 0  # nodes may stop or depart apart
    if parallel:
        for b in numba.prange(n_trials):
            # A parallel loop takes tuples of arrays, not tuples of tuples: its trials pack the groups.
            trial = (graph, values, rule, span, judge, record, x, stop, departed)
            if tracked:
                run_trial(b, True, trial)
            else:
                run_trial(b, False, trial)
    else:
        for b in range(n_trials):
            if tracked:
                run_trial(b, True, run)
            else:
                run_trial(b, False, run)
    return rec_end


@njit(nogil=True, depends=_DEPENDS)
def diameters(indptr: Any, indices: Any, n: int, trials: Any) -> Any:
    """The diameter of each trial ``b`` in ``trials`` (-1 if its graph is not connected).

    ``indices[indptr[g]:indptr[g + 1]]``: the neighbours of global node ``g`` (trial b's nodes are
    ``b n .. b n + n - 1``); :func:`nlagg_node.termination.csr_diameter` per graph.
    """
    out = np.empty(trials.shape[0], dtype=np.int64)
    dist = np.empty(n, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    for k in range(trials.shape[0]):
        out[k] = _csr_diameter(indptr, indices, trials[k] * n, n, dist, queue)
    return out
