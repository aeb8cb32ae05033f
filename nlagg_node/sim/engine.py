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
from ..epochplan import epoch_seed
from ..graphs import EdgeLayout, sample_graphs
from ..init import DualInitSpec, draw_z0, perturb_value
from ..rng import rng_for_each
from ..schedule import (
    Phase,
    Schedule,
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
from ..termination import NO_CANDIDATE, NO_STOP, certificate_sign
from ..threat import known_duals, solvable
from ..valuemap import ValueScale, scale_for
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
    # (B, n) the same in protocol units, bit for bit what each node's x-update compares x with (the
    # certified stop's pin test, nlagg_node.termination.Certificate)
    protocol_values: FloatArray
    # (B, n) the certified stop: nodes whose value entered a candidate (their x stayed pinned at it
    # stop_window iterations in a row); a node other than the aggregate's holder is the one case in
    # which the stop's quiet bits say more than the ideal world (docs/protocol.md)
    offered: BoolArray
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
    recorded_x: FloatArray  # (R, B, n), in protocol units (what the wire carries; see nlagg_node.valuechecks)
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
        return Schedule.of(self.phases).t_total

    def by_rank(self, per_node: NDArray[np.generic]) -> NDArray[np.generic]:
        """Reorder the node axis (axis 1 of ``(B, n, ...)``) so that column r is rank r."""
        order = np.argsort(self.rank, axis=1)
        idx = order.reshape(order.shape + (1,) * (per_node.ndim - 2))
        return np.take_along_axis(per_node, idx, axis=1)

    def stray_candidates(self) -> BoolArray:
        """``(B,)``: a node whose value is not the aggregate's entered a certified stop's candidate
        (:attr:`offered`), the case in which the stop's quiet bits reveal which nodes lie above it."""
        v = self.protocol_values
        extreme = np.nanmin(v, axis=1) if self.config.op == "min" else np.nanmax(v, axis=1)
        return np.asarray((self.offered & (v != extreme[:, None])).any(axis=1), dtype=bool)

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

    Each node draws its DP noise first, then z^(0) per dual group. An epoch of a multi-epoch run
    (:mod:`nlagg_node.sim.multiepoch`) draws with the epoch's seed
    (:func:`~nlagg_node.epochplan.epoch_seed`), as a node of a deployment does.
    """
    index = np.stack(np.meshgrid(np.arange(trials), np.arange(n), indexing="ij"), axis=-1).reshape(-1, 2)
    return rng_for_each(seed, ("node",), index)


@dataclass(frozen=True)
class EpochInputs:
    """What one epoch of a multi-epoch run (:mod:`nlagg_node.sim.multiepoch`) puts in place of a single
    run's draws: its index (fresh generators), its values, and per trial the first dual group's
    z^(0) distribution (a warm start) and the values the dynamics use (a warm start's compressed
    values, protocol units; None: the values themselves)."""

    epoch: int
    values: FloatArray  # (B, n), user units
    inits: tuple[DualInitSpec | None, ...] | None = None  # per trial; None: the phase's own
    used: FloatArray | None = None  # (B, n), protocol units, before any DP noise
    rerun: bool = False  # the epoch's cold rerun (its own fresh generators)


def _out_edge_slices(layout: EdgeLayout) -> tuple[IntArray, IntArray]:
    order = np.argsort(layout.src, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(layout.src, minlength=layout.n_nodes))])
    return order, starts


def _draw_signed_duals(
    phase: Phase,
    layout: EdgeLayout,
    gens: list[np.random.Generator],
    order: IntArray,
    starts: IntArray,
    inits: tuple[DualInitSpec | None, ...] | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Signed duals u^(0) = a z^(0) and z^(0) for every directed edge, each node drawing its own
    (from its trial's ``inits`` entry where one is given, else from the phase's)."""
    z = np.empty(len(layout.src))
    per_trial = len(gens) // len(inits) if inits else 0
    for g, gen in enumerate(gens):
        pos = order[starts[g] : starts[g + 1]]
        spec = inits[g // per_trial] if inits else None
        z[pos] = draw_z0(spec or phase.init, layout.sign[pos], gen)
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


@dataclass
class _Plan:
    """What a run is before its first iteration: graphs, values, phases, departures, targets."""

    cfg: RunConfig
    graphs: list[IntArray]
    s: FloatArray  # (B, n) private values, user units
    s_used: FloatArray  # (B n,) what the dynamics use, protocol units
    scale: ValueScale
    gens: list[np.random.Generator]
    phases: list[Phase]
    secret: frozenset[str]
    dep: SimDepartures | None
    # With early stopping a planned departure may not happen (its component stopped first): one
    # target per set of departures that may have happened, the first q departure iterations
    # (q = 0 .. all), picked at the end.
    dep_sets: list[dict[int, int]]
    targets: list[tuple[FloatArray, FloatArray]]  # per phase: (Q, B) lo and hi, Q = len(dep_sets)
    record: IntArray
    chunk: int  # iterations per kernel call
    parallel: bool
    inits: tuple[DualInitSpec | None, ...] | None = None  # per trial, the first group's (an epoch's)

    @property
    def t_total(self) -> int:
        return Schedule.of(self.phases).t_total


def _plan(
    cfg: RunConfig, departures: Mapping[int, int] | None, watched: bool, epoch: EpochInputs | None = None
) -> _Plan:
    """Draw the graphs and values of a resolved ``cfg`` (an ``epoch``'s values where given), plan its
    phases and their targets."""
    import numba

    B, n = cfg.trials, cfg.n
    graphs = sample_graphs(cfg.graph_spec(), cfg.seed, cfg.trials)
    s = run_values(cfg) if epoch is None else epoch.values  # user units, checked against the range
    scale = scale_for(cfg)
    seed = cfg.seed if epoch is None else epoch_seed(cfg.seed, epoch.epoch, rerun=epoch.rerun)
    assert seed is not None  # a simulation's seed is an int
    gens = node_generators(seed, B, n)
    noise = value_noise(cfg)
    s_proto = np.asarray(scale.to_protocol(s), dtype=np.float64)
    if epoch is not None and epoch.used is not None:
        s_proto = np.asarray(epoch.used, dtype=np.float64)
    s_used = np.array(
        [perturb_value(v, noise, cfg.sigma_s, g) for v, g in zip(s_proto.ravel(), gens, strict=True)]
    )
    phases = plan_phases(cfg)
    t_total = Schedule.of(phases).t_total
    dep = SimDepartures(cfg, departures, t_total, graphs) if departures else None
    dep_sets = [dep.at] if dep is not None else [{}]
    if dep is not None and cfg.early_stop:
        times = sorted(set(dep.at.values()))
        dep_sets = [{j: t for j, t in dep.at.items() if t in times[:q]} for q in range(len(times) + 1)]
    # The targets convergence is judged against: the survivors'.
    per_set = (phase_targets(cfg, phases, s_used.reshape(B, n)[:, survivors(n, d)]) for d in dep_sets)
    targets = [
        (np.array([lo for lo, _ in rows]), np.array([hi for _, hi in rows]))
        for rows in zip(*per_set, strict=True)
    ]
    return _Plan(
        cfg=cfg,
        graphs=graphs,
        s=s,
        s_used=s_used,
        scale=scale,
        gens=gens,
        phases=phases,
        secret=secret_groups_of(cfg, phases),
        dep=dep,
        dep_sets=dep_sets,
        targets=targets,
        record=np.array(parse_record_spec(cfg.record, t_total), dtype=np.int64),
        # One kernel call per phase, or about fifty when someone watches the progress; a parallel
        # region only for enough trials to share out.
        chunk=max(1, t_total // 50) if watched else max(1, t_total),
        parallel=cfg.trials >= _PARALLEL_TRIALS and numba.get_num_threads() > 1,
        inits=epoch.inits if epoch is not None else None,
    )


def _stop_reaches(cfg: RunConfig, graphs: list[IntArray], layout: EdgeLayout) -> IntArray:
    """Each trial's stop reach :func:`~nlagg_node.termination.stop_reach` (0 without early stopping).

    The diameters come from compiled code, once per distinct graph (trials of a fixed graph
    kind share theirs), all at once.
    """
    if not cfg.early_stop:
        return np.zeros(len(graphs), dtype=np.int64)
    if cfg.may_depart:
        return np.full(len(graphs), cfg.n - 1, dtype=np.int64)
    from .kernel import diameters

    first: dict[int, int] = {}
    owner = np.array([first.setdefault(id(g), b) for b, g in enumerate(graphs)], dtype=np.int64)
    distinct = np.array(sorted(first.values()), dtype=np.int64)
    order, starts = _out_edge_slices(layout)
    found = diameters(starts.astype(np.int64), layout.dst[order].astype(np.int64), cfg.n, distinct)
    if (found < 0).any():
        raise ValueError("the graph is not connected")
    by_trial = np.zeros(len(graphs), dtype=np.int64)
    by_trial[distinct] = found
    return np.asarray(by_trial[owner], dtype=np.int64)


@dataclass
class _State:
    """What the iterations change: the layout (departures drop edges), duals, x and what is tracked."""

    layout: EdgeLayout
    pair_start: IntArray
    u: FloatArray
    x: FloatArray
    recorded_x: FloatArray  # (R, B, n)
    matched: BoolArray
    first_match: IntArray
    solved_at: IntArray
    conv: IntArray
    all_converged: BoolArray
    phase_iterations: IntArray
    node_iterations: IntArray
    # Early stop (nlagg_node.termination), per node: the last W x's (W x N), quiet counter, stop iteration,
    # iterations in the phase once stopped (-1 while running); the departure iterations each node
    # knows of (this phase), those it detected at the last barrier, and the planned departures that
    # did not happen (the node's component had stopped: it finished).
    reach: IntArray
    hist: FloatArray
    kq: IntArray
    ev: IntArray
    halt: IntArray
    dep_t: IntArray
    dep_known: BoolArray
    fresh: BoolArray
    moot: BoolArray
    calm_from: IntArray  # per trial: the phase's first iteration with every node quiet (-1 before)
    # The certified stop, per node: pin run and signed candidate (nlagg_node.termination).
    pin: IntArray
    bc: FloatArray
    offered: BoolArray  # over the run: the node's value entered a candidate
    finals: list[FloatArray] = field(default_factory=list)
    identified: list[FloatArray] = field(default_factory=list)
    z0: dict[str, FloatArray] = field(default_factory=dict)
    group: str = ""
    t0: int = 0
    rec_ptr: int = 0
    loop_seconds: float = 0.0

    @property
    def recorded_flat(self) -> FloatArray:
        """``recorded_x`` as (R, B n), the kernel's view."""
        return self.recorded_x.reshape(self.recorded_x.shape[0], self.x.shape[0])


def _new_state(plan: _Plan) -> _State:
    cfg, dep = plan.cfg, plan.dep
    B, n = cfg.trials, cfg.n
    layout = EdgeLayout.from_graphs(n, plan.graphs)
    N = layout.n_nodes
    early = cfg.early_stop
    dep_t = np.array(sorted(set(dep.at.values())) if dep is not None and early else [], dtype=np.int64)
    return _State(
        layout=layout,
        pair_start=np.concatenate([[0], np.cumsum([len(g) for g in plan.graphs])]).astype(np.int64),
        u=np.empty(len(layout.src)),
        x=np.zeros(N),
        recorded_x=np.empty((len(plan.record), B, n)),
        matched=np.zeros(N, dtype=bool),
        first_match=np.full(N, -1, dtype=np.int64),
        solved_at=np.full(N, -1, dtype=np.int64),
        conv=np.zeros(B, dtype=np.int64),
        all_converged=np.ones(B, dtype=bool),
        phase_iterations=np.zeros((B, len(plan.phases)), dtype=np.int64),
        node_iterations=np.zeros((B, n, len(plan.phases)), dtype=np.int64),
        reach=_stop_reaches(cfg, plan.graphs, layout),
        hist=np.zeros((cfg.stop_window_value if early else 1, N)),
        kq=np.zeros(N, dtype=np.int64),
        ev=np.full(N, NO_STOP, dtype=np.int64),
        halt=np.full(N, -1, dtype=np.int64),
        dep_t=dep_t,
        dep_known=np.zeros((N, len(dep_t)), dtype=bool),
        fresh=np.zeros((N, len(dep_t)), dtype=bool),
        moot=np.zeros(N, dtype=bool),
        calm_from=np.full(B, -1, dtype=np.int64),
        pin=np.zeros(N, dtype=np.int64),
        bc=np.full(N, NO_CANDIDATE),
        offered=np.zeros(N, dtype=bool),
    )


def _enter_phase(plan: _Plan, st: _State, phase: Phase) -> FloatArray:
    """Duals of a new group, the average's solved values, the stop state reset; the phase's values."""
    cfg, dep = plan.cfg, plan.dep
    layout = st.layout
    N = layout.n_nodes
    if phase.group != st.group:
        st.group = phase.group
        order, starts = _out_edge_slices(layout)
        inits = plan.inits if not st.z0 else None  # an epoch's warm start: the first group
        st.u, z0 = _draw_signed_duals(phase, layout, plan.gens, order, starts, inits)
        st.z0[st.group] = dep.full_order(z0) if dep is not None else z0
        st.identified = []
    if phase.objective.kind == "quadratic":
        # The first x of an average phase solves for s_i wherever the duals are known.
        known = known_duals(st.group in plan.secret, layout.src, layout.dst)  # the simulator corrupts no node
        ok = solvable(layout.src, layout.dst, N, known) & (st.solved_at < 0)
        st.solved_at[ok] = st.t0
    skip = bypassed(phase, plan.s_used, np.array(st.identified).reshape(-1, N), cfg.epsilon)
    s_eff = np.ascontiguousarray(effective_values(phase, plan.s_used, skip), dtype=np.float64)
    if dep is not None:
        s_eff = dep.mask_values(s_eff)
    st.kq[:] = 0
    st.ev[:] = NO_STOP
    st.halt[:] = -1
    st.dep_known[:] = False
    st.fresh[:] = False
    st.calm_from[:] = -1
    st.pin[:] = 0
    st.bc[:] = NO_CANDIDATE
    if cfg.early_stop and dep is not None and dep.gone:
        st.halt.reshape(cfg.trials, cfg.n)[:, sorted(dep.gone)] = 0  # departed: no iteration of this phase
    return s_eff


def _run_span(
    plan: _Plan,
    st: _State,
    phase: Phase,
    s_eff: FloatArray,
    targets: tuple[FloatArray, FloatArray],
    span: tuple[int, int],
    judged: tuple[IntArray, IntArray],
) -> None:
    """Iterations ``span = (start, stop)`` of the phase (phase-local) in one kernel call."""
    from .kernel import run_phase  # numba: compiled (or loaded from cache) on first use

    cfg, layout, obj = plan.cfg, st.layout, phase.objective
    c = phase_c(cfg, phase)
    start, stop = span
    last_bad, ran = judged
    tick = time.perf_counter()
    run = (
        (st.u, layout.src, layout.dst, st.pair_start, c * layout.degree),
        (s_eff, plan.s_used),
        (c, cfg.theta, obj.kind == "quadratic", obj.alpha, obj.beta),
        (cfg.n, st.t0 + start, start, stop - start),
        (targets[0], targets[1], cfg.tolerance, st.matched, st.first_match, last_bad),
        (plan.record, st.recorded_flat, st.rec_ptr),
        st.x,
        (
            cfg.early_stop,
            cfg.stop_window_value,
            st.reach,
            st.hist,
            st.kq,
            st.ev,
            ran,
            st.halt,
            st.calm_from,
            cfg.certified,
            certificate_sign(cfg.op),
            st.pin,
            st.bc,
            st.offered,
        ),
        (st.dep_t, st.dep_known, st.fresh),
    )
    st.rec_ptr = run_phase(run, plan.parallel)
    st.loop_seconds += time.perf_counter() - tick


def _depart(plan: _Plan, st: _State, dep: SimDepartures, gone: list[int], t_end: int) -> None:
    """The nodes ``gone`` depart after iteration ``t_end - 1``: their last x is dropped, their
    neighbours detect it (early stop) and their edges leave the layout."""
    B, n = plan.cfg.trials, plan.cfg.n
    # Their x^(T) was computed here but never published: not recorded, matches nothing.
    cols = (np.arange(B)[:, None] * n + np.array(gone)[None, :]).ravel()
    recorded_flat = st.recorded_flat
    recorded_flat[plan.record == t_end - 1, cols[:, None]] = np.nan
    late = cols[st.first_match[cols] == t_end - 1]
    st.matched[late], st.first_match[late] = False, -1
    if plan.cfg.early_stop:
        _detect(st.layout, cols, t_end - 1, st.t0, st.dep_t, st.halt, st.x, st.fresh, st.moot)
    st.layout, st.u, st.pair_start = dep.apply(gone, st.layout, st.u, st.pair_start)


def _record_rest(plan: _Plan, st: _State, until: int) -> None:
    """Every trial has stopped: x is final for the recorded iterations before ``until``."""
    flat = st.recorded_flat
    while st.rec_ptr < len(plan.record) and plan.record[st.rec_ptr] < until:
        flat[st.rec_ptr] = st.x
        st.rec_ptr += 1


def _run_phase(
    plan: _Plan, st: _State, phase: Phase, targets: tuple[FloatArray, FloatArray], progress: Progress | None
) -> None:
    """One phase: kernel calls between the progress reports and departures, then its accounting."""
    cfg, dep = plan.cfg, plan.dep
    s_eff = _enter_phase(plan, st, phase)
    last_bad = np.full((len(plan.dep_sets), cfg.trials), -1, dtype=np.int64)
    ran = np.full(cfg.trials, -1, dtype=np.int64)
    cuts = sorted(
        {*range(plan.chunk, phase.t_len, plan.chunk), *(dep.cuts(st.t0, phase.t_len) if dep else [])}
    )
    for start, stop in zip([0, *cuts], [*cuts, phase.t_len], strict=True):
        if cfg.early_stop and (ran >= 0).all():
            _record_rest(plan, st, st.t0 + phase.t_len)
            break
        _run_span(plan, st, phase, s_eff, targets, (start, stop), (last_bad, ran))
        gone = dep.due(st.t0 + stop) if dep is not None else []
        if dep is not None and gone:
            _depart(plan, st, dep, gone, st.t0 + stop)
            s_eff = dep.mask_values(s_eff)
        if progress is not None:
            progress(st.t0 + stop, plan.t_total)
    _end_phase(plan, st, phase, targets, last_bad, np.where(ran >= 0, ran, phase.t_len))


def _end_phase(
    plan: _Plan,
    st: _State,
    phase: Phase,
    targets: tuple[FloatArray, FloatArray],
    last_bad: IntArray,
    ran: IntArray,
) -> None:
    """The phase's iterations, convergence (against the target of the departures that happened)
    and finals: each node's x, or the candidate a certified stop ended it with."""
    cfg, dep = plan.cfg, plan.dep
    B, n = cfg.trials, cfg.n
    p = len(st.finals)
    st.phase_iterations[:, p] = ran
    if cfg.early_stop and dep is not None:  # departures never reached: every trial had stopped before
        late = [j for j, at in dep.at.items() if st.t0 <= at < st.t0 + phase.t_len and j not in dep.gone]
        st.moot.reshape(B, n)[:, late] = True
    q = np.zeros(B, dtype=np.int64)
    if dep is not None and len(plan.dep_sets) > 1:
        happened = ~st.moot.reshape(B, n)[:, np.array(list(dep.at))]
        at = np.array(list(dep.at.values()))
        q = np.array([len(set(at[h].tolist())) for h in happened])
    rows = np.arange(B)
    bad = last_bad[q, rows]
    finals = st.x.copy()
    converged, taken = bad < ran - 1, bad + 1
    if cfg.certified:
        exact, certified = _certified_finals(plan, st, finals, (targets[0][q, rows], targets[1][q, rows]))
        converged, taken = np.where(certified, exact, converged), np.where(certified, ran, taken)
    st.node_iterations[:, :, p] = np.where(st.halt >= 0, st.halt, phase.t_len).reshape(B, n)
    st.all_converged &= converged
    st.conv += taken
    st.finals.append(finals.reshape(B, n))
    st.identified.append(finals)
    st.t0 += phase.t_len


def _certified_finals(
    plan: _Plan, st: _State, finals: FloatArray, target: tuple[FloatArray, FloatArray]
) -> tuple[BoolArray, BoolArray]:
    """A certified phase's finals: the candidate of every node its stop ended (departed ones keep
    NaN), in place. Per trial: whether its outputs all lie within ``tolerance`` of its target,
    and whether the certificate ended it (else it ran to ``t_max``: its finals are its x's)."""
    B, n = plan.cfg.trials, plan.cfg.n
    stopped = (st.halt >= 0) & np.isfinite(st.bc) & ~np.isnan(st.x)
    finals[stopped] = certificate_sign(plan.cfg.op) * st.bc[stopped]
    out = finals.reshape(B, n)
    tol = plan.cfg.tolerance
    inside = (out >= target[0][:, None] - tol) & (out <= target[1][:, None] + tol)
    exact = np.asarray((inside | np.isnan(out)).all(axis=1), dtype=bool)
    return exact, np.asarray(stopped.reshape(B, n).any(axis=1), dtype=bool)


def simulate(
    cfg: RunConfig,
    progress: Progress | None = None,
    departures: Mapping[int, int] | None = None,
    epoch: EpochInputs | None = None,
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
    epoch
        One epoch of a multi-epoch run (:mod:`nlagg_node.sim.multiepoch`): its values, fresh
        generators and warm start in place of the run's draws.
    """
    started = time.perf_counter()
    plan = _plan(cfg.resolved(), departures, progress is not None, epoch)
    st = _new_state(plan)
    for phase, targets in zip(plan.phases, plan.targets, strict=True):
        _run_phase(plan, st, phase, targets, progress)
    if progress is not None:
        progress(plan.t_total, plan.t_total)
    return _result(plan, st, time.perf_counter() - started)


def _departure_outcome(
    plan: _Plan, st: _State, dep: SimDepartures
) -> tuple[list[dict[int, int]], list[list[list[int]]]]:
    """Per trial, the departures that happened and the components they left; a departed node's
    iterations end at its departure."""
    B, n = plan.cfg.trials, plan.cfg.n
    moot_in = st.moot.reshape(B, n)
    departed_in = [{j: t for j, t in dep.at.items() if not moot_in[b, j]} for b in range(B)]
    comps = [
        dep.components[b] if not moot_in[b].any() else components(n, plan.graphs[b], departed_in[b])
        for b in range(B)
    ]
    starts = np.asarray(Schedule.of(plan.phases).starts[:-1])
    for b, left in enumerate(departed_in):  # a departed node ran its phases up to its departure
        for j, t_left in left.items():
            st.node_iterations[b, j] = np.minimum(st.node_iterations[b, j], np.clip(t_left - starts, 0, None))
    return departed_in, comps


def _result(plan: _Plan, st: _State, wall: float) -> SimResult:
    """The run's outputs, their errors against the truth and what the adversary saw."""
    cfg, dep, s = plan.cfg, plan.dep, plan.s
    B, n = cfg.trials, cfg.n
    output = np.asarray(plan.scale.to_user(combine(cfg, plan.phases, st.finals)), dtype=np.float64)
    truth_lo, truth_hi = true_aggregate(cfg, s)
    solved = st.solved_at >= 0
    matched, first_match, solved_at = st.matched, st.first_match, st.solved_at
    first_exposed = np.where(
        matched & solved, np.minimum(first_match, solved_at), np.where(matched, first_match, solved_at)
    )
    departed_in: list[dict[int, int]] = []
    comps: list[list[list[int]]] = []
    if dep is not None:
        departed_in, comps = _departure_outcome(plan, st, dep)
        node_lo, node_hi = survivor_truth(cfg, s, comps)
        mse = survivor_mse(output, node_lo, node_hi)
        truth_lo, truth_hi = largest_truth(node_lo, node_hi, comps)
    elif output.ndim == 3:
        err = distance_to(output, truth_lo[:, None, :], truth_hi[:, None, :])
        mse = (err**2).sum(axis=2).mean(axis=1)
    else:
        err = distance_to(output, truth_lo[:, None], truth_hi[:, None])
        mse = (err**2).mean(axis=1)
    return SimResult(
        config=cfg,
        phases=plan.phases,
        graphs=plan.graphs,
        values=s,
        used_values=np.asarray(plan.scale.to_user(plan.s_used.reshape(B, n)), dtype=np.float64),
        protocol_values=plan.s_used.reshape(B, n).copy(),
        offered=st.offered.reshape(B, n).copy(),
        rank=np.argsort(np.argsort(-s, axis=1, kind="stable"), axis=1),
        output=output,
        truth_lo=truth_lo,
        truth_hi=truth_hi,
        mse=mse,
        matched=matched.reshape(B, n),
        first_match=first_match.reshape(B, n),
        exposed=(matched | solved).reshape(B, n),
        first_exposed=first_exposed.reshape(B, n),
        converged_iterations=np.where(st.all_converged, st.conv, -1),
        phase_iterations=st.phase_iterations,
        node_iterations=st.node_iterations,
        recorded_t=plan.record,
        recorded_x=st.recorded_x,
        z0=st.z0,
        wall_seconds=wall,
        extra={"directed_edges": float(len(st.layout.src)), "loop_seconds": st.loop_seconds},
        departed=dict(dep.at) if dep is not None else {},
        components=comps,
        departed_in=departed_in,
    )
