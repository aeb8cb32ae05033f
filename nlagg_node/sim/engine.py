"""The batched Monte Carlo simulator.

All trials run at once as one disjoint union of graphs (trial ``b``'s node ``i`` is
global node ``b * n + i``), so every iteration is a handful of vectorized passes
over the directed edges, with preallocated buffers. What the experiments need is
accumulated while running (matching events, first matching iteration, the last
iteration still off the target, final MSE); trajectories are kept only at the
iterations the ``record`` spec asks for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..arrays import BoolArray, FloatArray, IntArray
from ..config import RunConfig, parse_record_spec
from ..departure import components, survivors
from ..graphs import EdgeLayout, sample_graphs
from ..init import draw_z0, perturb_value
from ..rng import rng_for_each
from ..scale import scale_for
from ..schedule import (
    Phase,
    bypassed,
    combine,
    distance_to,
    effective_values,
    phase_c,
    phase_targets,
    plan_phases,
    secret_groups_of,
    true_aggregate,
    value_noise,
)
from ..termination import NO_STOP, stop_reach
from ..threat import known_duals, solvable
from .departures import SimDepartures, largest_truth, survivor_mse, survivor_truth
from .values import run_values

Progress = Callable[[int, int], None]
_PARALLEL_TRIALS = 8


@dataclass
class SimResult:
    """Everything a run produced. Shapes: B trials, n nodes, R recorded iterations.

    Node ids are the graph's ids; ``rank[b, i]`` is node i's rank in trial b
    (0 = largest value), so per-rank statistics are a gather away.
    """

    config: RunConfig
    phases: list[Phase]
    graphs: list[IntArray]
    values: FloatArray  # (B, n) private values s_i, in the user's units
    used_values: FloatArray  # (B, n) what the dynamics used (s_i + DP noise for the baselines), user units
    rank: IntArray  # (B, n)
    output: FloatArray  # (B, n) or (B, n, k) for top-K
    truth_lo: FloatArray  # (B,) or (B, k)
    truth_hi: FloatArray
    mse: FloatArray  # (B,) paper eq. (mse) at the final iterate
    matched: BoolArray  # (B, n) x_i^(t) == s_i for some t
    first_match: IntArray  # (B, n) first such t, -1 if none
    exposed: BoolArray  # (B, n) value determined by the adversary's view: a match, or solved (average)
    first_exposed: IntArray  # (B, n) first such t, -1 if none
    converged_iterations: IntArray  # (B,) iterations each phase needed to stay within tolerance, -1 if not
    phase_iterations: IntArray  # (B, phases) iterations each phase ran (t_len, or fewer with early stop)
    node_iterations: IntArray  # (B, n, phases) each node's (differ only where departures split the graph)
    recorded_t: IntArray  # (R,)
    recorded_x: FloatArray  # (R, B, n), in protocol units (what the wire carries; see nlagg_node.scale)
    z0: dict[str, FloatArray]  # group -> (B*2H,) z_{i|j}^(0) in EdgeLayout order (NaN: edge departed)
    wall_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    departed: dict[int, int] = field(default_factory=dict)  # node -> T: its last x is x^(T-1)
    components: list[list[list[int]]] = field(default_factory=list)  # per trial, with departures only
    # Per trial, the departures that happened: with early stopping a node whose component stopped
    # before its departure finished the run instead (with departures only).
    departed_in: list[dict[int, int]] = field(default_factory=list)

    def departures_of(self, trial: int) -> dict[int, int]:
        """The departures of trial ``trial`` (``{node: T}``)."""
        return self.departed_in[trial] if self.departed_in else dict(self.departed)

    @property
    def t_total(self) -> int:
        return sum(p.t_len for p in self.phases)

    def by_rank(self, per_node: NDArray[np.generic]) -> NDArray[np.generic]:
        """Reorder the node axis (axis 1 of ``(B, n, ...)``) so that column r is rank r."""
        order = np.argsort(self.rank, axis=1)
        idx = order.reshape(order.shape + (1,) * (per_node.ndim - 2))
        return np.take_along_axis(per_node, idx, axis=1)

    def leakage_probability(self) -> FloatArray:
        """Fraction of trials in which the adversary's view determines the value, per rank (0 = largest).

        Counts matching events and the values an average-consensus phase exposes to the linear
        inversion of its x-update (:mod:`nlagg_node.threat`).
        """
        return np.asarray(self.by_rank(self.exposed).mean(axis=0), dtype=np.float64)

    def matching_probability(self) -> FloatArray:
        """Fraction of trials with a matching event ``x_i^(t) = s_i``, per rank."""
        return np.asarray(self.by_rank(self.matched).mean(axis=0), dtype=np.float64)

    def recorded_by_rank(self) -> FloatArray:
        """``recorded_x`` with its node axis in rank order: shape (R, B, n)."""
        order = np.argsort(self.rank, axis=1)
        return np.take_along_axis(self.recorded_x, order[None], axis=2)


def node_generators(seed: int, trials: int, n: int) -> list[np.random.Generator]:
    """The private generator ``rng_for(seed, "node", b, i)`` of every (trial, node), trial-major.

    Each node draws its DP noise first, then z^(0) per dual group.
    """
    index = np.stack(np.meshgrid(np.arange(trials), np.arange(n), indexing="ij"), axis=-1).reshape(-1, 2)
    return rng_for_each(seed, ("node",), index)


def _out_edge_slices(layout: EdgeLayout) -> tuple[IntArray, IntArray]:
    order = np.argsort(layout.src, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(layout.src, minlength=layout.n_nodes))])
    return order, starts


def _draw_signed_duals(
    phase: Phase, layout: EdgeLayout, gens: list[np.random.Generator], order: IntArray, starts: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Signed duals u^(0) = a z^(0) and z^(0) for every directed edge, each node drawing its own."""
    z = np.empty(len(layout.src))
    for g, gen in enumerate(gens):
        pos = order[starts[g] : starts[g + 1]]
        z[pos] = draw_z0(phase.init, layout.sign[pos], gen)
    return layout.sign * z, z


def _detect(
    layout: EdgeLayout,
    cols: IntArray,
    at: int,
    t0: int,
    dep_t: IntArray,
    halt: IntArray,
    x: FloatArray,
    fresh: BoolArray,
    moot: BoolArray,
) -> None:
    """Early stop: the nodes ``cols`` (global ids) depart at ``at``. Their live neighbours detect it
    at this barrier (:mod:`nlagg_node.termination`); they stop, having run the phase's iterations
    before ``at``, and publish nothing more (x NaN). One that had already stopped (its component
    stopped before ``at``) finished the run: its departure is ``moot``."""
    gone = np.zeros(len(halt), dtype=bool)
    gone[cols] = True
    detectors = layout.src[gone[layout.dst] & ~gone[layout.src]]
    detectors = detectors[halt[detectors] < 0]  # a stopped component detects nothing
    fresh[detectors, int(np.searchsorted(dep_t, at))] = True
    stopped = halt[cols] >= 0
    moot[cols[stopped]] = True
    running = cols[~stopped]
    halt[running] = at - t0
    x[running] = np.nan


def simulate(
    cfg: RunConfig, progress: Progress | None = None, departures: Mapping[int, int] | None = None
) -> SimResult:
    """Run ``cfg.trials`` Monte Carlo trials of the configured operator.

    Parameters
    ----------
    cfg
        The run configuration (operator defaults are resolved here).
    progress
        Called as ``progress(done, total)`` with iteration counts, about fifty times per run.
    departures
        ``{node: T}``: node departs at T in every trial (:mod:`nlagg_node.departure`); the
        output of a departed node is NaN, ``truth_lo/hi`` are those of the survivors' largest
        component and ``mse`` measures every survivor against its own component's aggregate.
    """
    import numba

    from .kernel import run_phase  # numba: compiled (or loaded from cache) on first use

    started = time.perf_counter()
    cfg = cfg.resolved()
    B, n = cfg.trials, cfg.n
    graphs = sample_graphs(cfg.graph_spec(), cfg.seed, cfg.trials)
    s = run_values(cfg)  # user units, checked against the declared range
    scale = scale_for(cfg)
    gens = node_generators(cfg.seed, B, n)
    noise = value_noise(cfg)
    s_proto = np.asarray(scale.to_protocol(s), dtype=np.float64)
    s_used = np.array(
        [perturb_value(v, noise, cfg.sigma_s, g) for v, g in zip(s_proto.ravel(), gens, strict=True)]
    )
    layout = EdgeLayout.from_graphs(n, graphs)
    phases = plan_phases(cfg)
    secret = secret_groups_of(cfg, phases)
    t_total = sum(p.t_len for p in phases)
    dep = SimDepartures(cfg, departures, t_total, graphs) if departures else None
    # The targets convergence is judged against: the survivors'. With early stopping a planned
    # departure may not happen (its component stopped first): one target per set of departures
    # that may have happened, the first q departure iterations (q = 0 .. all), picked at the end.
    dep_sets = [dep.at] if dep is not None else [{}]
    if dep is not None and cfg.early_stop:
        times = sorted(set(dep.at.values()))
        dep_sets = [{j: t for j, t in dep.at.items() if t in times[:q]} for q in range(len(times) + 1)]
    targets = [
        (np.array([lo for lo, _ in per_set]), np.array([hi for _, hi in per_set]))
        for per_set in zip(
            *(phase_targets(cfg, phases, s_used.reshape(B, n)[:, survivors(n, d)]) for d in dep_sets),
            strict=True,
        )
    ]
    record = np.array(parse_record_spec(cfg.record, t_total), dtype=np.int64)
    recorded_x = np.empty((len(record), B, n))

    N, E = layout.n_nodes, len(layout.src)
    order, starts = _out_edge_slices(layout)
    pair_start = np.concatenate([[0], np.cumsum([len(g) for g in graphs])]).astype(np.int64)
    matched = np.zeros(N, dtype=bool)
    first_match = np.full(N, -1, dtype=np.int64)
    conv = np.zeros(B, dtype=np.int64)
    all_converged = np.ones(B, dtype=bool)
    finals: list[FloatArray] = []
    identified: list[FloatArray] = []
    z0: dict[str, FloatArray] = {}
    u = np.empty(E)
    x = np.zeros(N)
    recorded_flat = recorded_x.reshape(len(record), N)
    solved_at = np.full(N, -1, dtype=np.int64)
    group = ""
    t0 = 0
    rec_ptr = 0
    # One kernel call per phase, or about fifty when someone watches the progress; a parallel
    # region only for enough trials to share out.
    chunk = max(1, t_total // 50) if progress is not None else max(1, t_total)
    parallel = cfg.trials >= _PARALLEL_TRIALS and numba.get_num_threads() > 1
    loop_seconds = 0.0
    early = cfg.early_stop
    window = cfg.stop_window_value
    reach = np.array([stop_reach(n, g, cfg.may_depart) for g in graphs] if early else [0] * B, dtype=np.int64)
    hist = np.zeros((N, window if early else 1))
    kq = np.zeros(N, dtype=np.int64)
    ev = np.full(N, NO_STOP, dtype=np.int64)
    halt = np.full(N, -1, dtype=np.int64)  # early stop: each node's iterations in the phase once stopped
    dep_t = np.array(sorted(set(dep.at.values())) if dep is not None and early else [], dtype=np.int64)
    dep_known = np.zeros((N, len(dep_t)), dtype=bool)  # departures each node knows of (this phase)
    fresh = np.zeros((N, len(dep_t)), dtype=bool)  # ... and those it detected at the last barrier
    moot = np.zeros(N, dtype=bool)  # planned to depart, but its component had stopped (it finished)
    phase_iterations = np.zeros((B, len(phases)), dtype=np.int64)
    node_iterations = np.zeros((B, n, len(phases)), dtype=np.int64)
    for phase, (tlo, thi) in zip(phases, targets, strict=True):
        c = phase_c(cfg, phase)
        cd = c * layout.degree
        if phase.group != group:
            group = phase.group
            u, z0[group] = _draw_signed_duals(phase, layout, gens, order, starts)
            if dep is not None:
                z0[group] = dep.full_order(z0[group])
            identified = []
        if phase.objective.kind == "quadratic":
            # The first x of an average phase solves for s_i wherever the duals are known.
            known = known_duals(group in secret, layout.src, layout.dst)  # the simulator corrupts no node
            ok = solvable(layout.src, layout.dst, N, known) & (solved_at < 0)
            solved_at[ok] = t0
        skip = bypassed(phase, s_used, np.array(identified).reshape(-1, N), cfg.epsilon)
        s_eff = np.ascontiguousarray(effective_values(phase, s_used, skip), dtype=np.float64)
        if dep is not None:
            s_eff = dep.mask_values(s_eff)
        last_bad = np.full((len(dep_sets), B), -1, dtype=np.int64)
        ran = np.full(B, -1, dtype=np.int64)
        kq[:] = 0
        ev[:] = NO_STOP
        halt[:] = -1
        dep_known[:] = False
        fresh[:] = False
        if early and dep is not None and dep.gone:
            halt.reshape(B, n)[:, sorted(dep.gone)] = 0  # departed: no iteration of this phase
        obj = phase.objective
        cuts = sorted({*range(chunk, phase.t_len, chunk), *(dep.cuts(t0, phase.t_len) if dep else [])})
        for start, stop in zip([0, *cuts], [*cuts, phase.t_len], strict=True):
            if early and (ran >= 0).all():  # every trial has stopped: x is final for the rest
                while rec_ptr < len(record) and record[rec_ptr] < t0 + phase.t_len:
                    recorded_flat[rec_ptr] = x
                    rec_ptr += 1
                break
            steps = stop - start
            tick = time.perf_counter()
            rec_ptr = run_phase(
                u,
                layout.src,
                layout.dst,
                pair_start,
                s_eff,
                s_used,
                cd,
                c,
                cfg.theta,
                obj.kind == "quadratic",
                obj.alpha,
                obj.beta,
                n,
                t0 + start,
                start,
                steps,
                tlo,
                thi,
                cfg.tolerance,
                matched,
                first_match,
                last_bad,
                record,
                recorded_flat,
                rec_ptr,
                x,
                early,
                window,
                reach,
                hist,
                kq,
                ev,
                ran,
                halt,
                dep_t,
                dep_known,
                fresh,
                parallel,
            )
            loop_seconds += time.perf_counter() - tick
            gone = dep.due(t0 + stop) if dep is not None else []
            if dep is not None and gone:
                # Their x^(T) was computed here but never published: not recorded, matches nothing.
                cols = (np.arange(B)[:, None] * n + np.array(gone)[None, :]).ravel()
                recorded_flat[record == t0 + stop - 1, cols[:, None]] = np.nan
                late = cols[first_match[cols] == t0 + stop - 1]
                matched[late], first_match[late] = False, -1
                if early:
                    _detect(layout, cols, t0 + stop - 1, t0, dep_t, halt, x, fresh, moot)
                layout, u, pair_start = dep.apply(gone, layout, u, pair_start)
                order, starts = _out_edge_slices(layout)
                E = len(layout.src)
                cd = c * layout.degree
                s_eff = dep.mask_values(s_eff)
            if progress is not None:
                progress(t0 + start + steps, t_total)
        ran = np.where(ran >= 0, ran, phase.t_len)
        phase_iterations[:, len(finals)] = ran
        if early and dep is not None:  # departures never reached: every trial had stopped before
            late = [j for j, at in dep.at.items() if t0 <= at < t0 + phase.t_len and j not in dep.gone]
            moot.reshape(B, n)[:, late] = True
        if dep is not None and len(dep_sets) > 1:  # the target of the departures that happened
            happened = ~moot.reshape(B, n)[:, np.array(list(dep.at))]
            at = np.array(list(dep.at.values()))
            q = np.array([len(set(at[h].tolist())) for h in happened])
            last_bad = last_bad[q, np.arange(B)]
        else:
            last_bad = last_bad[0]
        node_iterations[:, :, len(finals)] = np.where(halt >= 0, halt, phase.t_len).reshape(B, n)
        all_converged &= last_bad < ran - 1
        conv += last_bad + 1
        finals.append(x.reshape(B, n).copy())
        identified.append(x.copy())
        t0 += phase.t_len
    if progress is not None:
        progress(t_total, t_total)

    output = np.asarray(scale.to_user(combine(cfg, phases, finals)), dtype=np.float64)
    truth_lo, truth_hi = true_aggregate(cfg, s)
    solved = solved_at >= 0
    exposed = matched | solved
    first_exposed = np.where(
        matched & solved, np.minimum(first_match, solved_at), np.where(matched, first_match, solved_at)
    )
    departed_in: list[dict[int, int]] = []
    comps: list[list[list[int]]] = []
    if dep is not None:
        moot_in = moot.reshape(B, n)
        departed_in = [{j: t for j, t in dep.at.items() if not moot_in[b, j]} for b in range(B)]
        comps = [
            dep.components[b] if not moot_in[b].any() else components(n, graphs[b], departed_in[b])
            for b in range(B)
        ]
        starts = np.cumsum([0] + [p.t_len for p in phases])[:-1]
        for b, left in enumerate(departed_in):  # a departed node ran its phases up to its departure
            for j, t_left in left.items():
                node_iterations[b, j] = np.minimum(node_iterations[b, j], np.clip(t_left - starts, 0, None))
        node_lo, node_hi = survivor_truth(cfg, s, comps)
        mse = survivor_mse(output, node_lo, node_hi)
        truth_lo, truth_hi = largest_truth(node_lo, node_hi, comps)
    elif output.ndim == 3:
        err = distance_to(output, truth_lo[:, None, :], truth_hi[:, None, :])
        mse = (err**2).sum(axis=2).mean(axis=1)
    else:
        err = distance_to(output, truth_lo[:, None], truth_hi[:, None])
        mse = (err**2).mean(axis=1)
    rank = np.argsort(np.argsort(-s, axis=1, kind="stable"), axis=1)
    return SimResult(
        config=cfg,
        phases=phases,
        graphs=graphs,
        values=s,
        used_values=np.asarray(scale.to_user(s_used.reshape(B, n)), dtype=np.float64),
        rank=rank,
        output=output,
        truth_lo=truth_lo,
        truth_hi=truth_hi,
        mse=mse,
        matched=matched.reshape(B, n),
        first_match=first_match.reshape(B, n),
        exposed=exposed.reshape(B, n),
        first_exposed=first_exposed.reshape(B, n),
        converged_iterations=np.where(all_converged, conv, -1),
        phase_iterations=phase_iterations,
        node_iterations=node_iterations,
        recorded_t=record,
        recorded_x=recorded_x,
        z0=z0,
        wall_seconds=time.perf_counter() - started,
        extra={"directed_edges": float(E), "loop_seconds": loop_seconds},
        departed=dict(dep.at) if dep is not None else {},
        components=comps,
        departed_in=departed_in,
    )
