"""The exact linear attack: every value the transcript's linear relations determine.

An average-consensus phase publishes ``x_i^(t) = (s_i - v_i^(t)) / (1 + c d_i)`` (the quadratic
x-update of :mod:`nlagg_node.pdmm`). The duals behind ``v_i^(t) = sum_j a_ij z_{i|j}^(t)`` follow
the public z-recursion (eq. (zji_up)): an affine map of ``z^(0)`` driven by the published x's.
Where a z^(0) is sealed (:mod:`nlagg_node.threat`) it is an unknown, so every captured x of the
phase is one linear equation

    s_i - sum_e Phi_{i,e}^(t) w_e = x_i^(t) (1 + c d_i) + v_i^(t)|_{w = 0}

in the private values ``s`` and the unknown duals ``w`` (``Phi`` the recursion's linear part).
Values already known, a corrupted node's forwarded ``s_j`` and a value a matching event or an
earlier solve exposed, are moved to the right-hand side. A value ``s_i`` is *determined* when
``e_i`` lies in the span of the functionals of ``s`` that the system fixes once ``w`` is
eliminated; :func:`linear_attack` reports each such value, the iteration after which it became
determined, and the determined functionals themselves (for the interval propagation of
:func:`propagate_intervals`).

What that gives, with theta = 1/2 (checked by ``tests/unit/test_linear_attack.py`` against a
plain rank computation): after one iteration ``a_ij z_{i|j} + a_ji z_{j|i} = -c (x_i + x_j)`` on
every edge, so the unknown part left is one difference per edge, and summing a component's
equations cancels it on the edges inside the component. The determined set is therefore the
paper's bound made explicit: the corrupted nodes; every honest node whose edges all reach
corrupted nodes (an honest singleton component); and every node whose honest component (the
graph without the corrupted nodes) has every other member known, from the component's sum.

Rank tests run at a relative tolerance of :data:`RANK_TOLERANCE` on orthonormal bases (SVD). For
theta = 1/2 every coefficient of ``Phi`` is 0 or +-1/2 summed over a node's edges (the recursion
only halves and adds), so floating point holds them exactly and the decisions are exact; for
another theta the sum direction of each pair decays as ``(1 - 2 theta)^t``, and a relation
carried only by coefficients below the tolerance is dropped (it could not fix a value to 1e-9).

Scope: the relations of the quadratic (average) phases. A piecewise phase whose duals are all
known is replayed exactly by :func:`adversary.live.replay_exposures` (its matching events enter
here as known values); one with sealed duals (``--init-channel sealed``) gives a linear equation
only where the branch is known, which is not used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from scipy.sparse import csr_matrix

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.departure import drop_pairs
from nlagg_node.graphs import EdgeLayout
from nlagg_node.pdmm import z_update
from nlagg_node.schedule import Schedule
from nlagg_node.valuemap import ValueScale

from .live import Exposures, PublicRun
from .spans import node_ends

__all__ = [
    "RANK_TOLERANCE",
    "LinearFindings",
    "RelationJson",
    "attack_linear",
    "linear_attack",
    "propagate_intervals",
    "relations_json",
    "tightened",
]

RANK_TOLERANCE = 1e-9
"""Relative tolerance of every rank decision (singular values below it times the largest are 0)."""


class RelationJson(TypedDict):
    """One determined relation ``sum coefficients[k] * s_{nodes[k]} = value`` (user units)."""

    nodes: list[int]
    coefficients: list[float]
    value: float


@dataclass(frozen=True)
class LinearFindings:
    """What the linear relations of a transcript determine (protocol scale).

    Attributes
    ----------
    value
        ``(n,)`` the determined ``s_i`` (NaN where not determined by the linear relations; the
        known values passed in are not repeated).
    t
        ``(n,)`` the iteration after whose x's the value was determined, -1 otherwise.
    relations, rhs
        ``relations @ s == rhs``: the functionals of the unknown ``s`` the transcript fixes, in
        reduced row echelon form (a component's sum is a row of ones over its unknown members).
    unknown_duals
        How many z^(0) entries were unknown.
    """

    value: FloatArray
    t: IntArray
    relations: FloatArray
    rhs: FloatArray
    unknown_duals: int


class _System:
    """The equations collected so far: only the rows that enlarge the row space are kept.

    A row in the span of the kept ones carries no new information: the system is consistent (the
    true values satisfy it), so its right-hand side is the same combination of theirs.
    """

    def __init__(self, n_s: int) -> None:
        self.n_s = n_s
        self.k = 0  # unknown duals
        self.rows = np.zeros((0, n_s + 1))  # kept [A_s | A_w | b]
        self.basis = np.zeros((0, n_s))  # orthonormal basis of the rows of [A_s | A_w]

    def grow(self, k: int) -> None:
        """Add ``k`` unknown-dual columns (a new dual group)."""
        at = self.n_s + self.k
        self.rows = np.insert(self.rows, [at] * k, 0.0, axis=1)
        self.basis = np.hstack([self.basis, np.zeros((len(self.basis), k))])
        self.k += k

    def add(self, a: FloatArray, b: FloatArray) -> bool:
        """Add rows ``a @ [s; w] = b``; whether the row space of the coefficients grew."""
        if not len(a):
            return False
        scale = np.linalg.norm(a, axis=1)
        resid = a - (a @ self.basis.T) @ self.basis
        fresh = np.linalg.norm(resid, axis=1) > RANK_TOLERANCE * np.maximum(scale, 1e-300)
        if not fresh.any():
            return False
        self.rows = np.vstack([self.rows, np.hstack([a[fresh], b[fresh, None]])])
        self.basis = _row_basis(np.vstack([self.basis, resid[fresh]]))
        return True

    def functionals(self, basis: FloatArray | None = None) -> tuple[FloatArray, FloatArray]:
        """``(F, g)``: rows ``F @ s = g`` fixed once the unknown duals are eliminated."""
        m = self.rows if basis is None else np.hstack([basis, np.zeros((len(basis), 1))])
        a_s, a_w, b = m[:, : self.n_s], m[:, self.n_s : self.n_s + self.k], m[:, -1]
        if self.k and len(m):
            u, sv, _ = np.linalg.svd(a_w, full_matrices=True)
            rank = int((sv > RANK_TOLERANCE * max(float(sv.max(initial=0.0)), 1e-300)).sum())
            p = u[:, rank:]
            return p.T @ a_s, p.T @ b
        return a_s, b


def _row_basis(m: FloatArray) -> FloatArray:
    """An orthonormal basis of the rows of ``m``."""
    if not len(m):
        return m
    _, sv, vt = np.linalg.svd(m, full_matrices=False)
    rank = int((sv > RANK_TOLERANCE * max(float(sv.max(initial=0.0)), 1e-300)).sum())
    return np.asarray(vt[:rank], dtype=np.float64)


def _determined(f: FloatArray) -> np.ndarray:
    """Which coordinates the rows of ``f`` fix: ``e_i`` in their span."""
    g = _row_basis(f)
    if not len(g):
        return np.zeros(f.shape[1], dtype=bool)
    return np.asarray(np.abs(1.0 - (g**2).sum(axis=0)) <= 1e3 * RANK_TOLERANCE, dtype=bool)


def _rref(f: FloatArray, g: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Reduced row echelon form of ``[f | g]`` (partial pivoting, :data:`RANK_TOLERANCE`)."""
    m = np.hstack([f, g[:, None]]).astype(np.float64, copy=True)
    rows, cols = m.shape[0], f.shape[1]
    tol = RANK_TOLERANCE * max(float(np.abs(f).max(initial=0.0)), 1e-300)
    r = 0
    for c in range(cols):
        if r == rows:
            break
        p = r + int(np.argmax(np.abs(m[r:, c])))
        if abs(m[p, c]) <= tol:
            continue
        m[[r, p]] = m[[p, r]]
        m[r] /= m[r, c]
        others = np.arange(rows) != r
        m[others] -= np.outer(m[others, c], m[r])
        r += 1
    m[np.abs(m) <= tol] = 0.0
    return m[:r, :cols], m[:r, cols]


@dataclass
class _Stepper:
    """The public z-recursion on affine duals: column 0 the known part, column k+1 unknown w_k."""

    n: int
    layout: EdgeLayout
    pairs_kept: np.ndarray
    u: FloatArray | None = None
    group: str = ""
    offset: int = 0  # first unknown column of the current group

    def start_group(self, group: str, z0: FloatArray | None, system: _System) -> None:
        self.group = group
        both = np.concatenate([self.pairs_kept, self.pairs_kept])
        z = np.full(int(both.sum()), np.nan) if z0 is None else np.asarray(z0, dtype=np.float64)[both]
        unknown = np.flatnonzero(np.isnan(z))
        self.offset = system.k
        system.grow(len(unknown))
        u = np.zeros((len(z), 1 + system.k))
        u[:, 0] = self.layout.sign * np.where(np.isnan(z), 0.0, z)
        u[unknown, 1 + self.offset + np.arange(len(unknown))] = self.layout.sign[unknown]
        self.u = u

    def widen(self, k: int) -> None:
        if self.u is not None and self.u.shape[1] < 1 + k:
            self.u = np.hstack([self.u, np.zeros((len(self.u), 1 + k - self.u.shape[1]))])

    def sums(self) -> FloatArray:
        """``v`` per node and column (the affine dual sums)."""
        assert self.u is not None
        src = self.layout.src
        incidence = csr_matrix((np.ones(len(src)), (src, np.arange(len(src)))), shape=(self.n, len(src)))
        return np.asarray(incidence @ self.u, dtype=np.float64)

    def step(self, x_t: FloatArray, c: float, theta: float, running: np.ndarray | None) -> None:
        """z-update of iteration t (x drives column 0 only); stopped pairs keep their duals."""
        assert self.u is not None
        h = self.layout.n_pairs
        drive = np.zeros_like(self.u)
        drive[:, 0] = x_t[self.layout.dst]
        new = z_update(self.u, np.concatenate((self.u[h:], self.u[:h])), drive, c, theta)
        if running is not None:
            moved = running[self.layout.src[:h]] | running[self.layout.dst[:h]]
            new = np.where(np.concatenate((moved, moved))[:, None], new, self.u)
        self.u = new

    def drop(self, gone: set[int]) -> None:
        """Departed nodes' pairs leave the layout (and the duals), as the nodes drop them."""
        self.layout, _, keep = drop_pairs(self.layout, np.zeros(len(self.layout.src)), gone)
        self.pairs_kept[np.flatnonzero(self.pairs_kept)[~keep]] = False
        if self.u is not None:
            self.u = self.u[np.concatenate([keep, keep])]


def linear_attack(run: PublicRun, known: Mapping[int, float], *, early_stop: bool = False) -> LinearFindings:
    """Solve the linear relations of a transcript's average phases (see the module notes).

    Parameters
    ----------
    run, early_stop
        As for :func:`adversary.live.replay_exposures` (protocol scale; z0 NaN where unknown).
    known
        Node -> a value already known on the protocol scale (corrupted nodes' forwarded values,
        matching events, values the replay solved).
    """
    n, edges, phases = run.n, run.edges, run.phases
    cs, theta, z0, departed = run.cs, run.theta, run.z0, run.departed
    x = np.asarray(run.x, dtype=np.float64)
    schedule = Schedule.of(phases)
    t_len = min(x.shape[1], schedule.t_total)
    free = [i for i in range(n) if i not in known]
    col = {i: k for k, i in enumerate(free)}
    system = _System(len(free))
    layout = EdgeLayout.from_graphs(n, [np.asarray(edges, dtype=np.int64)])
    stepper = _Stepper(n, layout, np.ones(layout.n_pairs, dtype=bool))
    gone = dict(departed or {})
    dropped: set[int] = set()
    first = np.full(n, -1, dtype=np.int64)
    ends = node_ends(phases, x[:, :t_len], edges, departed, run.ends) if early_stop else None
    last = np.zeros((0, 0))  # the coefficients of the last iteration's equations
    for p, phase in enumerate(phases):
        start = schedule.start(p)
        stop = min(schedule.end(p), t_len)
        if ends is not None:
            stop = min(int(ends[p].max()) if n else start, t_len)
        quadratic = phase.objective.kind == "quadratic"
        if phase.group != stepper.group:
            stepper.u = None
            stepper.group = phase.group
        for t in range(start, stop):
            running = None if ends is None else np.asarray(ends[p] > t)
            if quadratic:
                if stepper.u is None:
                    stepper.start_group(phase.group, z0.get(phase.group), system)
                stepper.widen(system.k)
                a, b = _equations(stepper, system, x[:, t], cs[p], running, known, col)
                # With theta = 1/2 the coefficients repeat from the second iteration on: an exact
                # repeat of the last rows spans nothing new (the projection is skipped, not the rows).
                if not (len(a) == len(last) and np.array_equal(a, last)) and system.add(a, b):
                    f, _ = system.functionals(system.basis)
                    fixed = _determined(f)
                    for i in free:
                        if fixed[col[i]] and first[i] < 0:
                            first[i] = t
                last = a
                stepper.step(x[:, t], cs[p], theta, running)
            late = {j for j, at in gone.items() if at <= t and j not in dropped}
            if late:
                dropped |= late
                stepper.drop(dropped)
        if schedule.end(p) >= t_len:
            break
    return _solve(n, free, system, first)


def _equations(
    stepper: _Stepper,
    system: _System,
    x_t: FloatArray,
    c: float,
    running: np.ndarray | None,
    known: Mapping[int, float],
    col: Mapping[int, int],
) -> tuple[FloatArray, FloatArray]:
    """Iteration t's equations ``a @ [s; w] = b``, one per published x (known values moved right)."""
    v = stepper.sums()
    cd = c * stepper.layout.degree
    ok = np.isfinite(x_t) & np.isfinite(v[:, 0])
    if running is not None:
        ok &= running
    nodes = np.flatnonzero(ok)
    a = np.zeros((len(nodes), system.n_s + system.k))
    a[:, system.n_s :] = -v[nodes, 1 : 1 + system.k]
    b = x_t[nodes] * (1.0 + cd[nodes]) + v[nodes, 0]
    for r, i in enumerate(nodes.tolist()):
        if i in col:
            a[r, col[i]] = 1.0
        else:
            b[r] -= float(known[i])
    keep = np.any(a != 0.0, axis=1)
    return a[keep], np.asarray(b[keep], dtype=np.float64)


def _solve(n: int, free: list[int], system: _System, first: IntArray) -> LinearFindings:
    f, g = system.functionals()
    value = np.full(n, np.nan)
    fixed = _determined(f) if len(f) else np.zeros(len(free), dtype=bool)
    if fixed.any():
        sol = np.linalg.lstsq(f, g, rcond=None)[0]
        for k, i in enumerate(free):
            if fixed[k]:
                value[i] = sol[k]
    rel, rhs = _rref(f, g) if len(f) else (np.zeros((0, len(free))), np.zeros(0))
    full = np.zeros((len(rel), n))
    full[:, free] = rel
    t = np.where(np.isfinite(value), first, -1)
    return LinearFindings(value=value, t=t, relations=full, rhs=rhs, unknown_duals=system.k)


def propagate_intervals(
    relations: FloatArray, rhs: FloatArray, lower: FloatArray, upper: FloatArray, *, rounds: int = 50
) -> tuple[FloatArray, FloatArray]:
    """Tighten ``lower <= s <= upper`` through ``relations @ s == rhs`` to a fixpoint.

    Each relation bounds each of its terms by the others' bounds (interval arithmetic); bounds
    are widened by ``1e-9`` of the terms' magnitude so that rounding never excludes the truth.
    Known values enter as ``lower == upper``.
    """
    lo, hi = np.array(lower, dtype=np.float64), np.array(upper, dtype=np.float64)
    for _ in range(rounds):
        changed = False
        for f, g in zip(relations, rhs, strict=True):
            nz = np.flatnonzero(f)
            for i in nz.tolist():
                others = nz[nz != i]
                w = -f[others] / f[i]
                lo_terms = np.where(w > 0, w * lo[others], w * hi[others])
                hi_terms = np.where(w > 0, w * hi[others], w * lo[others])
                base = g / f[i]
                new_lo, new_hi = base + lo_terms.sum(), base + hi_terms.sum()
                pad = 1e-9 * max(1.0, abs(base), float(np.abs(lo_terms).sum() + np.abs(hi_terms).sum()))
                if np.isfinite(new_lo) and new_lo - pad > lo[i] + pad:
                    lo[i], changed = new_lo - pad, True
                if np.isfinite(new_hi) and new_hi + pad < hi[i] - pad:
                    hi[i], changed = new_hi + pad, True
        if not changed:
            break
    return lo, hi


def attack_linear(
    run: PublicRun, rep: Exposures, corrupt: Mapping[int, float], sc: ValueScale, early_stop: bool
) -> LinearFindings | None:
    """The exact linear attack (:mod:`adversary.linear`) on the average phases, with every value
    known so far (forwarded, matching events, solved by the replay) on its right-hand side."""
    if not any(ph.objective.kind == "quadratic" for ph in run.phases):
        return None
    known = {i: sc.protocol_float(float(v)) for i, v in corrupt.items()}
    for i in rep.exposed_nodes:
        known.setdefault(i, float(rep.value[i]))
    return linear_attack(run, known, early_stop=early_stop)


def tightened(
    lin: LinearFindings,
    rep: Exposures,
    corrupt: Mapping[int, float],
    sc: ValueScale,
    lower: FloatArray,
    upper: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Intervals (protocol scale) tightened through the determined relations, known values as points."""
    lo, hi = lower.copy(), upper.copy()
    point = lin.value.copy()
    for i, v in corrupt.items():
        point[i] = sc.protocol_float(float(v))
    for i in rep.exposed_nodes:
        point[i] = rep.value[i]
    fixed = np.isfinite(point)
    lo[fixed], hi[fixed] = point[fixed], point[fixed]
    return propagate_intervals(lin.relations, lin.rhs, lo, hi)


def relations_json(lin: LinearFindings, sc: ValueScale) -> list[RelationJson]:
    """The determined relations of two or more values, ``sum_i coefficient_i s_i = value`` (user units)."""
    out: list[RelationJson] = []
    for f, g in zip(lin.relations, lin.rhs, strict=True):
        nz = np.flatnonzero(f)
        if len(nz) < 2:  # a determined value: a finding of its own
            continue
        # s_user = lo + span s_protocol, so sum f s_user = span g + lo sum f.
        value = float(g) * sc.span + (sc.lo if not sc.identity else 0.0) * float(f[nz].sum())
        out.append({"nodes": nz.tolist(), "coefficients": f[nz].tolist(), "value": value})
    return out
