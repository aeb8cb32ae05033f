"""The minimal live attack: replay the public z-recursion and spot every x_i^(t) that equals s_i.

An eavesdropper that captured every z^(0) and every x^(t) can recompute every dual: the z-update
of each directed edge only needs the old duals and the published x's. For a piecewise-linear
objective it then knows both linear-branch candidates ``(lo, hi)`` of node i's x-update
(:func:`nlagg_node.pdmm.linear_branch`); a published x_i^(t) equal to neither is s_i itself
(a matching event: the value is exposed, exactly). For the quadratic objective (average part of
the trimmed mean) the update solves for s_i directly: ``s_i = x_i (1 + c d_i) + v_i``.

A node that departs at T (:mod:`nlagg_node.departure`, announced in its neighbours' statuses)
publishes no x from T on; the replay drops its edges after the z-update of T, as the nodes do
(:func:`nlagg_node.departure.drop_pairs`).

With early stopping a phase ends early, and where departures split the graph each connected
component ends it at its own iteration (:mod:`nlagg_node.termination`). A node that has stopped
publishes nothing more in the phase and its duals stay as they were: the replay leaves every pair
whose ends have both stopped (or departed) unchanged, steps the pairs of the nodes still running,
and moves on to the next phase's start once every node has stopped. Live, each accepted x tells
whether its node stops after it (the fields it carries); the replay reads those ends from the
record of whoever accepted it (:class:`adversary.rules.PhaseEnds`, the transcript's rules); from a
finished transcript, a node's phase ends with the last x of its component
(:func:`adversary.spans.node_ends`).

With a sealed initialization (wire protocol v2) the z^(0) of a sealed group never appear in
plaintext; the adversary knows only those a corrupted node forwards (its state at the group's
first iteration holds the z^(0) of its edges, both directions). Every other dual stays NaN, so
the nodes on those edges stay ``unknown``: exactly the threat model of :mod:`nlagg_node.threat`.

All equations come from :mod:`nlagg_node.pdmm`; the replay adds only bookkeeping.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from nlagg_node.arrays import BoolArray, FloatArray, IntArray
from nlagg_node.departure import drop_pairs
from nlagg_node.graphs import EdgeLayout
from nlagg_node.pdmm import dual_sum, linear_branch, z_update
from nlagg_node.runtime.wire import AdvStateMsg
from nlagg_node.schedule import Phase, Schedule

from .rules import PhaseEnds
from .spans import iterations_run, node_ends, node_iterations_run, phase_spans

__all__ = [
    "BRANCH_NAMES",
    "Exposure",
    "Exposures",
    "LiveReplay",
    "PublicRun",
    "forwarded_z0",
    "iterations_run",
    "node_ends",
    "node_iterations_run",
    "phase_spans",
    "replay_exposures",
]


@dataclass(frozen=True)
class PublicRun:
    """What a transcript holds of one run, as arrays: everything the replay and the linear attack read.

    Attributes
    ----------
    n : number of nodes.
    edges : ``(H, 2)`` canonical undirected edges (``nlagg_node.graphs.normalize_edges``).
    phases : :func:`nlagg_node.schedule.plan_phases` of the run's config.
    cs : the step ``c`` of each phase (:func:`nlagg_node.schedule.phase_c`).
    theta : the z-update's averaging parameter.
    z0 : dual group -> ``(2H,)`` z_{i|j}^(0) in :class:`~nlagg_node.graphs.EdgeLayout` order
        (``Transcript.z0`` or ``SimResult.z0`` of a one-trial run); NaN where not captured.
    x : ``(n, T)`` published x's (``Transcript.x``), NaN where not captured; T may be shorter than
        the schedule (the replay stops there).
    departed : ``{node: T}`` departures (:func:`nlagg_node.departure.announced` of the statuses).
    ends : early stopping, per phase, node -> the last iteration it ran where the x it halted with
        was read (:attr:`adversary.rules.PhaseEnds.by_phase`; :func:`~adversary.spans.node_ends`
        infers the others).
    """

    n: int
    edges: IntArray
    phases: Sequence[Phase]
    cs: Sequence[float]
    theta: float
    z0: Mapping[str, FloatArray]
    x: FloatArray
    departed: Mapping[int, int] | None = None
    ends: Sequence[Mapping[int, int]] | None = None


UNKNOWN, LOW, HIGH, VALUE, SOLVED = -1, 0, 1, 2, 3
BRANCH_NAMES = {UNKNOWN: "unknown", LOW: "lo", HIGH: "hi", VALUE: "=s", SOLVED: "solved"}


@dataclass(frozen=True)
class Exposure:
    """Node ``node`` revealed ``value`` at iteration ``t`` (``how``: ``=s`` match or ``solved`` quadratic)."""

    node: int
    t: int
    value: float
    how: str


@dataclass
class Exposures:
    """Result of :func:`replay_exposures`.

    Attributes
    ----------
    branch : int8 ``(n, T)``: -1 unknown (data missing), 0 lower linear branch ``lo``, 1 upper
        linear branch ``hi``, 2 ``x = s`` (exposed), 3 quadratic phase (s solved from x and v).
    first : ``(n,)`` first iteration where node i's value was exposed, -1 if never.
    value : ``(n,)`` the exposed value (NaN if never).
    """

    branch: NDArray[np.int8]
    first: NDArray[np.int64]
    value: FloatArray

    @property
    def exposed_nodes(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.first >= 0)]


class LiveReplay:
    """The replay, one iteration at a time, for a live eavesdropper.

    Feed z^(0) with :meth:`set_z0` (and corrupted nodes' states with :meth:`add_state`) and x's
    with :meth:`add_x`; each call of :meth:`advance` processes every iteration whose x's are all
    known and returns the new exposures. A plain group waits for all its z^(0); a ``sealed`` one
    (whose z^(0) the wire never shows) starts with what the corrupted nodes forwarded.

    ``ends``: in a run with early stopping, where its nodes ended each phase
    (:class:`~adversary.rules.PhaseEnds`, the record of whoever judges the x's: live, the
    transcript's rules, which learn it from the fields each accepted x carries); the replay waits
    for no x of a stopped node for the rest of the phase. Without it a phase is over once nothing
    is published at an iteration and the next phase has begun.

    ``horizon``: the iterations it keeps (and steps) from 0 on; the run's by default. A transcript
    read after the run passes the iterations it captured, so its memory follows the transcript's
    content, not the size the (public, possibly hostile) config announces.
    """

    def __init__(
        self,
        n: int,
        edges: IntArray,
        phases: Sequence[Phase],
        cs: Sequence[float],
        theta: float,
        sealed: Iterable[str] = (),
        *,
        ends: PhaseEnds | None = None,
        horizon: int | None = None,
    ) -> None:
        self.n = n
        self.layout = EdgeLayout.from_graphs(n, [np.asarray(edges, dtype=np.int64)])
        self.index = {
            (int(a), int(b)): e for e, (a, b) in enumerate(zip(self.layout.src, self.layout.dst, strict=True))
        }
        self.phases = list(phases)
        self.cs = list(cs)
        self.theta = theta
        schedule = Schedule.of(self.phases)
        self.t_total = schedule.t_total
        self._phase_of = np.repeat(np.arange(len(self.phases)), np.diff(schedule.starts))
        self._starts = np.asarray(schedule.starts, dtype=np.int64)
        self.ends = ends
        self._no_ends: list[dict[int, int]] = [{} for _ in self.phases]
        self._expected_at: dict[int, int] = {}  # _expected's answers while ends are known
        self._ends_known = 0  # the ends' count those answers hold for
        self.z0: dict[str, FloatArray] = {}
        self.horizon = self.t_total if horizon is None else min(max(horizon, 0), self.t_total)
        self.x = np.full((n, self.horizon), np.nan)
        # Plain lists: read and written per captured x, where numpy's scalar access costs most.
        self._seen = [0] * self.horizon  # x's known per iteration
        self.branch = np.full((n, self.horizon), UNKNOWN, dtype=np.int8)
        self.first = np.full(n, -1, dtype=np.int64)
        self.value = np.full(n, np.nan)
        self.t_next = 0
        self._u: FloatArray | None = None
        self._group = ""
        self.full = self.layout  # the run's layout; ``layout`` loses the pairs of departed nodes
        self.pairs_kept = np.ones(self.layout.n_pairs, dtype=bool)
        self.departed: dict[int, int] = {}
        self._dropped: set[int] = set()  # departed nodes whose pairs are gone from ``layout``
        self._departures: list[int] = []  # their iterations T, sorted: from T on, that node is silent
        self.sealed = frozenset(sealed)
        self._first_t: dict[str, int] = {}  # group -> its first iteration
        for p, start in zip(self.phases, self._starts, strict=False):
            self._first_t.setdefault(p.group, int(start))

    def depart(self, j: int, t: int) -> None:
        """Node j departed at t (its last x was x^(t-1)): from t on nobody waits for it.

        A departure before the iterations already stepped is refused, unless (early stopping) the
        node published nothing there: it left in the iterations its stopped phase skipped.
        """
        if not 0 <= j < self.n or j in self.departed or not 0 <= t < self.t_total:
            return
        if t < self.t_next and (self.ends is None or not np.isnan(self.x[j, t : self.t_next]).all()):
            return
        self.departed[j] = t
        bisect.insort(self._departures, t)
        self._expected_at.clear()

    @property
    def halted(self) -> list[dict[int, int]]:
        """Per phase, node -> the last iteration it ran (it stopped after it): the ``ends`` record."""
        return self.ends.by_phase if self.ends is not None else self._no_ends

    @property
    def _halts(self) -> bool:
        """Whether any node has stopped a phase (the per-message paths check only this)."""
        return self.ends is not None and self.ends.count > 0

    def set_z0(self, group: str, i: int, j: int, z: float) -> None:
        arr = self.z0.setdefault(group, np.full(len(self.full.src), np.nan))
        e = self.index.get((i, j))
        if e is not None:
            arr[e] = z

    def add_state(self, msg: AdvStateMsg) -> None:
        """A corrupted node's forwarded state: at a group's first iteration, the z^(0) of its edges."""
        for group, t0 in self._first_t.items():
            if msg.t != t0:
                continue
            arr = self.z0.setdefault(group, np.full(len(self.full.src), np.nan))
            for j, z in msg.z.items():
                e = self.index.get((msg.node, int(j)))
                if e is not None and np.isnan(arr[e]):
                    arr[e] = z
            for j, z in msg.z_in.items():
                e = self.index.get((int(j), msg.node))
                if e is not None and np.isnan(arr[e]):
                    arr[e] = z

    def add_x(self, i: int, t: int, x: float) -> bool:
        """Keep ``x_i^(t)`` (the first one wins); whether iteration t now has every x it waits for,
        so that :meth:`advance` may move on (an x that completes nothing cannot). Whether node i
        ended its phase at t is the ``ends`` record's, noted before.
        """
        if 0 <= i < self.n and 0 <= t < self.horizon and math.isnan(self.x[i, t]):
            if self._halts and self._stopped_before(i, t):
                return False  # its phase is over: nobody uses it
            self.x[i, t] = x
            self._seen[t] += 1
            return self._seen[t] >= self._expected(t)
        return False

    def _stopped_before(self, i: int, t: int) -> bool:
        """Whether node i stopped its phase before iteration t (of that phase)."""
        at = self.halted[int(self._phase_of[t])].get(i)
        return at is not None and at < t

    def _expected(self, t: int) -> int:
        """How many x's iteration t has: one per node not departed at or before t, nor stopped
        (early) in t's phase before t."""
        if self.ends is None or not self.ends.count:
            return self.n - bisect.bisect_right(self._departures, t) if self._departures else self.n
        if self._ends_known != self.ends.count:  # a node has stopped since: the answers are stale
            self._ends_known = self.ends.count
            self._expected_at.clear()
        got = self._expected_at.get(t)
        if got is None:
            if len(self._expected_at) >= 4096:
                self._expected_at.clear()
            got = self._expected_at[t] = int(self.running_at(t).sum())
        return got

    def running_at(self, t: int) -> BoolArray:
        """The nodes that publish x^(t): not departed at or before t, not stopped in its phase before t."""
        run = np.ones(self.n, dtype=bool)
        for j, at in self.departed.items():
            if at <= t:
                run[j] = False
        for i, at in self.halted[int(self._phase_of[t])].items():
            if at < t:
                run[i] = False
        return run

    def _frozen_at(self, t: int) -> BoolArray | None:
        """Early stopping: the nodes still running at t when some node of t's phase has stopped
        before t (their pairs alone are stepped), None when none has."""
        if not self._halts:
            return None
        done = self.halted[int(self._phase_of[t])]
        if not any(at < t for at in done.values()):
            return None
        return self.running_at(t)

    def add_xs(self, nodes: IntArray, ts: IntArray, xs: FloatArray) -> None:
        """:meth:`add_x` for many messages at once (a reader catching up on a large transcript).

        The first value of each ``(i, t)`` wins, in the given order, as with repeated :meth:`add_x`.
        """
        i = np.asarray(nodes, dtype=np.int64)
        t = np.asarray(ts, dtype=np.int64)
        x = np.asarray(xs, dtype=np.float64)
        keep = (i >= 0) & (i < self.n) & (t >= 0) & (t < self.horizon)
        i, t, x = i[keep], t[keep], x[keep]
        flat = i * self.horizon + t
        _, first = np.unique(flat, return_index=True)
        i, t, x = i[first], t[first], x[first]
        fresh = np.isnan(self.x[i, t])
        i, t, x = i[fresh], t[fresh], x[fresh]
        self.x[i, t] = x
        for u, k in zip(*np.unique(t, return_counts=True), strict=True):
            self._seen[int(u)] += int(k)

    def ready(self, t: int) -> bool:
        if self._seen[t] < self._expected(t):
            return False
        phase = self.phases[self._phase_of[t]]
        if phase.group != self._group and phase.group not in self.sealed:
            z = self.z0.get(phase.group)
            return z is not None and not bool(np.isnan(self._kept(z)).any())
        return True

    def _kept(self, z_full: FloatArray) -> FloatArray:
        """The z's of the edges still here (z^(0) arrays are indexed on the run's layout)."""
        return z_full if self.pairs_kept.all() else z_full[np.concatenate([self.pairs_kept, self.pairs_kept])]

    def advance(self, *, force: bool = False) -> list[Exposure]:
        """Process ready iterations (``force``: also incomplete ones, with NaN for the gaps)."""
        found: list[Exposure] = []
        while self.t_next < self.horizon:
            t = self.t_next
            if self._halts and self.halted[int(self._phase_of[t])] and self._expected(t) == 0:
                nxt = int(self._starts[self._phase_of[t] + 1])
                if nxt >= self.horizon:
                    break  # the run is over: t_next stays just after its last iteration
                self.t_next = nxt  # every node stopped its phase
                continue
            if not (force or self.ready(t)):
                nxt = int(self._starts[self._phase_of[t] + 1])
                if self._seen[t] or nxt >= self.horizon or not self.ready(nxt):
                    break
                self.t_next = nxt  # the phase stopped early (nothing at t, the next one has begun)
                continue
            found += self._step(t, self._frozen_at(t))
            self.t_next += 1
        return found

    def _step(self, t: int, running: BoolArray | None = None) -> list[Exposure]:
        """Iteration t: classify the x's, then the z-update; with ``running`` (early stopping, some
        node stopped) only the pairs with a running end are updated, the others stay as they were."""
        lay = self.layout
        k = int(self._phase_of[t])
        phase, c = self.phases[k], self.cs[k]
        if phase.group != self._group or self._u is None:
            self._group = phase.group
            z = self.z0.get(phase.group, np.full(len(self.full.src), np.nan))
            self._u = lay.sign * self._kept(z)
        u = self._u
        x = self.x[:, t]
        cd = c * lay.degree
        v = dual_sum(u, lay.src, self.n)
        known = ~np.isnan(x) & ~np.isnan(v)
        codes = np.full(self.n, UNKNOWN, dtype=np.int8)
        if phase.objective.kind == "quadratic":
            exposed = known
            codes[exposed] = SOLVED
            estimate = x * (1.0 + cd) + v
        else:
            with np.errstate(divide="ignore", invalid="ignore"):  # a departed node: no edge left
                lo, hi = linear_branch(phase.objective, v, cd)
            at_lo = known & (x == lo)
            at_hi = known & (x == hi)
            exposed = known & ~at_lo & ~at_hi
            codes[at_hi] = HIGH
            codes[at_lo] = LOW  # lo wins where both hold
            codes[exposed] = VALUE
            estimate = x
        self.branch[:, t] = codes
        found: list[Exposure] = []
        for i in np.flatnonzero(exposed & (self.first < 0)):
            self.first[i] = t
            self.value[i] = estimate[i]
            found.append(Exposure(int(i), t, float(estimate[i]), BRANCH_NAMES[int(codes[i])]))
        # The pairs' two directions in one call: u = [forward; reverse], each updated from the other.
        h = lay.n_pairs
        new = z_update(u, np.concatenate((u[h:], u[:h])), x[lay.dst], c, self.theta)
        if running is not None:  # a stopped node's duals stay as they were (its pairs: both ends stopped)
            moved = running[lay.src[:h]] | running[lay.dst[:h]]
            new = np.where(np.concatenate((moved, moved)), new, u)
        self._u = new
        if len(self._dropped) < len(self.departed) and any(
            at <= t and j not in self._dropped for j, at in self.departed.items()
        ):  # drop the edges of those that departed at t (their x^(t) never came), or in the
            # iterations a phase that stopped early skipped
            gone = {j for j, at in self.departed.items() if at <= t}
            self.layout, self._u, keep = drop_pairs(lay, new, gone)
            self.pairs_kept[np.flatnonzero(self.pairs_kept)[~keep]] = False
            self._dropped |= gone
        return found

    @property
    def duals(self) -> FloatArray | None:
        """The signed duals ``u`` after the last iteration stepped (:attr:`layout` order: the pairs
        still here), None before the first."""
        return self._u

    def result(self) -> Exposures:
        return Exposures(self.branch.copy(), self.first.copy(), self.value.copy())


def forwarded_z0(
    n: int,
    edges: IntArray,
    phases: Sequence[Phase],
    z0: Mapping[str, FloatArray],
    states: Iterable[AdvStateMsg],
) -> dict[str, FloatArray]:
    """``z0`` (group -> EdgeLayout order, NaN where unknown) completed by the corrupted nodes' states.

    A corrupted node forwards its duals every iteration; at the first iteration of a dual group
    they are that group's z^(0) on each of its edges, in both directions (sealed or not).
    """
    replay = LiveReplay(n, edges, phases, [1.0] * len(phases), 0.5, horizon=0)  # no x: z^(0) only
    for group, arr in z0.items():
        replay.z0[group] = np.asarray(arr, dtype=np.float64).copy()
    for msg in states:
        replay.add_state(msg)
    return replay.z0


def replay_exposures(run: PublicRun, *, early_stop: bool = False) -> Exposures:
    """Classify every published x_i^(t) from the transcript alone.

    Parameters
    ----------
    run : the transcript's arrays (:class:`PublicRun`).
    early_stop : the run stops its phases early: a phase's iterations after its last captured x
        were never run (the nodes skipped them), so the duals go on from there into the next
        phase, as :meth:`LiveReplay.advance` does live. Where departures split the graph, each
        component ends its phase on its own (:func:`~adversary.spans.node_ends`): the pairs of a
        component that has stopped keep their duals while the others go on. Without it every
        iteration is stepped and missing x's make the nodes unknown.

    Returns
    -------
    Exposures
        Branch code per ``(node, t)``, first exposure per node and the exposed value. Nodes whose
        x or duals depend on missing data are ``unknown`` from then on (NaN propagates).
    """
    n, edges, phases, x, departed = run.n, run.edges, run.phases, run.x, run.departed
    replay = LiveReplay(n, edges, phases, run.cs, run.theta, horizon=x.shape[1])  # sized by what was captured
    for j, at in (departed or {}).items():
        replay.depart(j, at)
    for group, arr in run.z0.items():
        replay.z0[group] = np.asarray(arr, dtype=np.float64).copy()
    t_len = replay.horizon
    replay.x[:, :t_len] = x[:, :t_len]
    if not early_stop:
        for t in range(t_len):
            replay.t_next = t
            replay._step(t)
    else:
        ends = node_ends(phases, x[:, :t_len], edges, departed, run.ends)
        for p, start in enumerate(replay._starts[: len(phases)].tolist()):
            end = ends[p]
            for t in range(start, min(int(end.max()), t_len) if n else start):
                running = end > t
                replay.t_next = t
                replay._step(t, None if running.all() else running)
    out = replay.result()
    return Exposures(out.branch[:, :t_len], out.first, out.value)
