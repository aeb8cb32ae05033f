"""The simulator's fused per-phase loop, compiled with numba.

The loop calls the elementwise update functions of :mod:`nlagg_node.pdmm`
(``x_piecewise``, ``x_quadratic``, ``z_update``) compiled for scalars, so the
equations still live in one place; what this module adds is only the traversal:
one pass over the directed edges for the dual sums, one over the nodes for x (with
matching events, convergence tracking and recording fused in), one over the edge
pairs for the z-update, with no allocation per iteration.

The dual sum adds each node's out-edges in array order, exactly as
:func:`nlagg_node.pdmm.dual_sum` (``np.bincount``) does, so results are bit for bit
those of the networked node.
"""

from __future__ import annotations

from typing import Any

import numba

from .. import pdmm

_x_piecewise = numba.njit(pdmm.x_piecewise)
_x_quadratic = numba.njit(pdmm.x_quadratic)
_z_update = numba.njit(pdmm.z_update)


@numba.njit(cache=True)
def run_phase(
    u: Any,
    src: Any,
    dst: Any,
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
    v: Any,
) -> int:
    """Run ``t_len`` iterations in place on ``u`` (signed duals) and ``x``; return the new ``rec_ptr``.

    ``t0`` is the global iteration of the first step and ``local0`` its index within
    the phase. ``matched``/``first_match`` (per node), ``last_bad`` (per trial: last
    phase-local iteration with a node farther than ``tolerance`` from ``[target_lo, target_hi]``)
    and ``recorded[k]`` (x at global iteration ``record_t[k]``) are updated in place.
    """
    n_nodes = x.shape[0]
    n_edges = u.shape[0]
    half = n_edges // 2
    for t in range(t_len):
        v[:] = 0.0
        for e in range(n_edges):
            v[src[e]] += u[e]
        for b in range(n_nodes // n):
            lo = target_lo[b] - tolerance
            hi = target_hi[b] + tolerance
            off = False
            for g in range(b * n, (b + 1) * n):
                if quadratic:
                    x[g] = _x_quadratic(v[g], s_eff[g], cd[g])
                else:
                    x[g] = _x_piecewise(v[g], s_eff[g], cd[g], alpha, beta)
                    if x[g] == s_used[g] and not matched[g]:
                        matched[g] = True
                        first_match[g] = t0 + t
                off = off or x[g] < lo or x[g] > hi
            if off:
                last_bad[b] = local0 + t
        if rec_ptr < record_t.shape[0] and record_t[rec_ptr] == t0 + t:
            recorded[rec_ptr, :] = x
            rec_ptr += 1
        for p in range(half):
            q = p + half
            a = u[p]
            r = u[q]
            u[p] = _z_update(a, r, x[dst[p]], c, theta)
            u[q] = _z_update(r, a, x[dst[q]], c, theta)
    return rec_ptr
