"""The protocol loop: every phase of a run for h hosted nodes at once (h = 1 for a lone node).

Iteration t of node i: ``x_i^(t)`` from its duals, publish it (and, when corrupted, its state),
wait for ``x_j^(t)`` of every neighbour (the barrier), then update its own duals ``u_{i|j}`` and
its copy of the neighbours' duals ``u_{j|i}`` (PDMM's broadcast form: after the z^(0) exchange
only x's travel).

The math is the simulator's, over the hosted nodes' duals (:mod:`.duals`: one flat numpy
vector for several nodes, Python floats for one). The operations are element-wise and each
node's duals are added in the same order, so the numbers are bit for bit those of one node per
process and of ``simulate(cfg, trials=1)``; the generators come from
:func:`nlagg_node.rng.rng_for` in the simulator's order (DP noise first, then z^(0) once per
dual group).

A neighbour that departs at T (:mod:`nlagg_node.departure`) is dropped at the z-update of
iteration T: its slots leave the duals (the others keep their order) and the node's degree
shrinks, exactly as the simulator drops the edge between two kernel calls.

The checkpoint hook (:meth:`PdmmLoop.checkpoint`) saves each node's state before every publish
that depends on it, and a loop started from checkpoints resumes where they left off. Nodes with
checkpoint stores run one loop each (h = 1), so that each resumes on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import numpy as np

from ..errors import NlaggError
from ..init import draw_z0, perturb_value
from ..protocol import output_error
from ..rng import rng_for
from ..schedule import bypassed, effective_values, phase_c, value_noise
from ..termination import (
    NO_CANDIDATE,
    NO_STOP,
    Certificate,
    Fields,
    certificate_sign,
    halts,
    is_certified,
    is_quiet,
    live_stop,
    next_candidate,
    next_pin_run,
    next_quiet,
    next_stop,
    own_candidate,
    recent,
    stop_threshold,
)
from ..valuemap import scale_for
from .checkpoint import Checkpoint, Stage
from .duals import duals_for
from .member import Member, NodeResult
from .pace import Pace
from .routing import Router
from .transport import Transport

__all__ = ["PdmmLoop", "first_error", "gather_first_error", "run_members"]

T = TypeVar("T")


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (possibly nested) exception group: what a task group's caller re-raises,
    so a node failure surfaces as itself (e.g. a neighbour timeout), not as a group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


async def gather_first_error(coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    return [t.result() for t in tasks]


async def run_members(members: list[Member], router: Router, transport: Transport) -> list[NodeResult]:
    """Read ``transport`` through ``router`` while the members run every phase; their results in order."""
    if any(m.store is not None for m in members):
        loops = [PdmmLoop([m]) for m in members]  # resume is per node
    else:
        loops = [PdmmLoop(members)]

    def session(present: bool) -> None:
        for m in members:
            if not present:  # the broker lost what it had queued: publish again what may be missing
                m.outbox.republish()
            else:  # it kept the session but sent our last will: we are back, not departed
                m.outbox.republish_status()

    transport.on_reconnect(session)
    try:
        async with asyncio.TaskGroup() as tg:
            reader = tg.create_task(router.read(transport))
            try:
                done = await gather_first_error([lp.run() for lp in loops])
                await gather_first_error([m.outbox.settle() for m in members])
            finally:
                reader.cancel()
                for m in members:
                    m.close()
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    results = {r.node: r for rs in done for r in rs}
    return [results[m.id] for m in members]


def still_here(slots: list[int], values: list[T]) -> list[T]:
    """A member's per-neighbour ``values`` (one per slot, as a barrier returns them) of the
    neighbours still here (``slots``: their slot numbers, ascending)."""
    return values if len(slots) == len(values) else [values[q] for q in slots]


class _Track:
    """One hosted node's record of the run so far."""

    def __init__(self, member: Member) -> None:
        self.m = member
        self.rng = rng_for(member.seed, "node", 0, member.id)
        self.ck = member.resumed
        self.s_used = 0.0
        self.finals: list[float] = []
        self.identified: list[float] = []
        self.xs: list[float] = []
        self.z0_sent: dict[str, list[float]] = {}
        self.z_out: list[float] = []
        self.got: list[float] = []  # the neighbours' x's last taken
        self.adv: str | None = None
        self.sent: list[int] = []  # early stop: [t, quiet, stop or NO_STOP, *departures] of the last x sent
        self.sent_cand: float | None = None  # the certified stop's candidate sent with it
        ck = self.ck
        if ck is None:
            cfg = member.cfg
            self.s_used = perturb_value(member.value, value_noise(cfg), cfg.sigma_s, self.rng)
        else:
            self.s_used = ck.s_used
            self.rng.bit_generator.state = ck.rng_state
            self.finals, self.identified, self.xs = list(ck.finals), list(ck.identified), list(ck.xs)
            self.z0_sent, self.z_out, self.adv = dict(ck.z0_sent), list(ck.z_out), ck.prev_adv
            self.got = [ck.prev_got[str(j)] for j in member.neighbours] if ck.prev_got else []
            self.sent, self.sent_cand = list(ck.last_sent), ck.last_cand


class PdmmLoop:
    """Every phase for the hosted ``members`` (one run, one configuration, one connection)."""

    def __init__(self, members: list[Member]) -> None:
        first = members[0]
        self.members = members
        self.cfg, self.phases = first.cfg, first.phases
        self.tracks = [_Track(m) for m in members]
        resumed = {(ck.stage, ck.t, ck.phase) for ck in (tr.ck for tr in self.tracks) if ck is not None}
        if resumed and (len(resumed) > 1 or any(tr.ck is None for tr in self.tracks)):
            raise NlaggError("the nodes of one loop must resume from the same point of the run")
        self.start = self.tracks[0].ck
        if len(members) > 1 and any(m.leave_at is not None for m in members):
            raise NlaggError("a hosted node cannot leave on its own: run it as a process of its own")
        self.slots = [list(range(len(m.neighbours))) for m in members]  # the neighbours still here
        self.duals = duals_for([len(m.neighbours) for m in members])
        self.reach = first.shape.reach
        self.stopping: Stopping | None = None
        self.pace = Pace([m.id for m in members], first.t_total)

    def signs(self, k: int) -> list[float]:
        """``a_ij`` of hosted node k for its neighbours j still here, ascending."""
        m = self.members[k]
        return [1.0 if m.id < j else -1.0 for j in m.active]

    def _drop(self, t: int) -> list[bool] | None:
        """Drop the neighbours that departed at t (their x^(t) never came); which slots of the
        duals are kept (node after node), or None if all are."""
        keep: list[bool] = []
        for k, m in enumerate(self.members):
            here = [q for q in self.slots[k] if m.departed.get(m.neighbours[q]) != t]
            keep += [m.departed.get(m.neighbours[q]) != t for q in self.slots[k]]
            self.slots[k] = here
            m.active = [m.neighbours[q] for q in here]
        if all(keep):
            return None
        cfg = self.cfg
        if (cfg.early_stop and not cfg.may_depart) or cfg.op == "trimmed-mean":
            gone = {m.id: sorted(j for j, u in m.departed.items() if u == t) for m in self.members}
            why = (
                "a trimmed mean cannot go on without them"
                if cfg.op == "trimmed-mean"
                else "this early-stopping run cannot go on without them (plan a run whose nodes may leave"
                " for good with --may-depart, or --no-early-stop)"
            )
            raise NlaggError(f"neighbours departed at t={t} ({gone}): {why}")
        if self.stopping is not None:
            for k, m in enumerate(self.members):
                if any(u == t for u in m.departed.values()):
                    self.stopping.detect(k, t)
        return keep

    async def run(self) -> list[NodeResult]:
        """Announce, wait for the neighbours, run every phase, publish ``done``; the results."""
        members, tracks = self.members, self.tracks
        ck = self.start
        if ck is not None and ck.stage == "done":
            # Restarted after finishing: announce the result again at once. The neighbours are not
            # waited for: they may have finished and gone, a broken close leaving their will retained.
            for m in members:
                await m.status("done", final=ck.finals, output=ck.output, iterations=m.iterations_run)
            return [m.result(ck.finals, ck.output, ck.xs, ck.z0_sent, 0.0) for m in members]
        await gather_first_error([m.announce() for m in members])
        await gather_first_error([m.status("running") for m in members])
        for m in members:
            m.start_running()
        started = time.perf_counter()
        left = await self.iterate()
        if left is not None:  # the lone node leaves the run cleanly
            (m,) = members
            if m.leave_quietly:  # a neighbour's x^(T) proves it holds our x^(T-1)
                await m.x_in.take(left)
                return [m.left(left)]
            result = m.left(left)
            await m.status("leaving", iterations=left)
            return [result]
        seconds = time.perf_counter() - started
        self._check_outputs()
        return await gather_first_error(
            [m.finish(tr.finals, tr.xs, tr.z0_sent, seconds) for m, tr in zip(members, tracks, strict=True)]
        )

    def checkpoint(self, stage: Stage, t: int, p_idx: int, group: str) -> None:
        """The checkpoint hook: each node's state before it publishes what depends on it.

        A departed neighbour's x is NaN (:meth:`~nlagg_node.runtime.barrier.Barrier.take`): not kept.
        """
        early = self.stopping
        for k, (m, tr) in enumerate(zip(self.members, self.tracks, strict=True)):
            if m.store is None:
                continue
            in_x = stage == "x"
            u_out, u_in = self.duals.of(k) if in_x else ([], [])
            m.save(
                Checkpoint(
                    m.fingerprint,
                    stage,
                    t,
                    p_idx,
                    group,
                    tr.s_used,
                    dict(tr.rng.bit_generator.state),
                    u_out=u_out,
                    u_in=u_in,
                    z_out=[] if in_x else tr.z0_sent[group],
                    z0_sent=tr.z0_sent,
                    finals=tr.finals,
                    identified=tr.identified if in_x else [],
                    xs=tr.xs,
                    prev_got={str(j): v for j, v in zip(m.neighbours, tr.got, strict=False) if v == v},
                    prev_adv=tr.adv if in_x else None,
                    last_sent=tr.sent,
                    last_cand=tr.sent_cand,
                    prev_quiet=[[q, e, *dep] for q, e, dep, _ in early.nbr[k]] if in_x and early else [],
                    prev_cand=[f[3] for f in early.nbr[k]] if in_x and early else [],
                    skipped=m.t_total - m.iterations_run,
                )
            )

    async def _exchange(self, p_idx: int, t: int, fresh: bool) -> None:
        """The z^(0) exchange that starts a dual group: draw (unless resumed), save, publish, wait."""
        phase = self.phases[p_idx]
        group = phase.group
        signs = [self.signs(k) for k in range(len(self.members))]
        if fresh:
            for k, tr in enumerate(self.tracks):
                first = self.members[k].first_init if p_idx == 0 else None  # an epoch's warm start
                tr.z_out = draw_z0(first or phase.init, np.array(signs[k]), tr.rng).tolist()  # those here
                tr.z0_sent[group] = tr.z_out
                tr.identified = []
            self.checkpoint("z0", t, p_idx, group)
        z_in = await gather_first_error(
            [m.exchange_z0(group, tr.z_out) for m, tr in zip(self.members, self.tracks, strict=True)]
        )
        u_out, u_in = [], []
        for k, (sg, tr) in enumerate(zip(signs, self.tracks, strict=True)):
            u_out.append([a * z for a, z in zip(sg, tr.z_out, strict=True)])
            u_in.append([-a * z for a, z in zip(sg, still_here(self.slots[k], z_in[k]), strict=True)])
        self.duals.start(u_out, u_in)

    def _republish_last(self, t: int) -> None:
        """Resumed mid-phase: what we may have published just before the crash goes out again."""
        phase = self.members[0].phase_at[t - 1]
        for m, tr in zip(self.members, self.tracks, strict=True):
            if tr.sent:  # early stop: the last x may precede t - 1 (its phase stopped early)
                last, quiet, stop, *known = tr.sent
                stop_or_none = None if stop == NO_STOP else stop
                m.outbox.send_x(last, m.phase_at[last], tr.xs[-1], (quiet, stop_or_none, known, tr.sent_cand))
            else:
                m.outbox.send_x(t - 1, phase, tr.xs[-1])
            if tr.adv is not None:
                m.outbox.send_adv(tr.adv.encode())

    def _check_outputs(self) -> None:
        """With a declared value range, an output outside it fails the run, naming the neighbours
        whose duals pulled it there (:func:`~nlagg_node.protocol.output_error`)."""
        envelope = self.members[0].shape.envelope
        if envelope is None:
            return
        c, scale = phase_c(self.cfg, self.phases[-1]), scale_for(self.cfg)
        for k, (m, tr) in enumerate(zip(self.members, self.tracks, strict=True)):
            pulls = {j: -u / c for j, u in zip(m.active, self.duals.of(k)[0], strict=True)}
            why = output_error(envelope, m.id, m.output_of(tr.finals), pulls, scale)
            if why is not None:
                raise NlaggError(why)

    async def iterate(self) -> int | None:
        """Every phase from the start, or from the checkpoint; a checkpoint precedes every publish.

        Returns None, or the iteration T at which a node given ``leave_after`` leaves.
        """
        cfg, members, tracks, duals = self.cfg, self.members, self.tracks, self.duals
        h = len(members)
        lone = members[0] if h == 1 else None  # may leave (leave_after, or a SIGTERM mid-run)
        saving = any(m.store is not None for m in members)
        ck = self.start
        p_first, t, group, resuming = (0, 0, "", False) if ck is None else (ck.phase, ck.t, ck.group, True)
        if ck is not None and ck.stage == "x":
            duals.start([tr.ck.u_out for tr in tracks], [tr.ck.u_in for tr in tracks])  # type: ignore[union-attr]
        s_used = np.array([tr.s_used for tr in tracks])
        shape = members[0].shape
        phase_start = shape.starts
        for p_idx in range(p_first, len(self.phases)):
            phase = self.phases[p_idx]
            c, theta, objective = phase_c(cfg, phase), cfg.theta, phase.objective
            first_round = -1
            opens = shape.opens_exchange(p_idx)
            if (resuming and ck is not None and ck.stage == "z0") or (not resuming and opens):
                group = phase.group
                await self._exchange(p_idx, t, fresh=not resuming)
                first_round = t
            elif resuming and t > 0:
                self._republish_last(t)
            resumed_at = t if resuming else -1
            resuming = False
            identified = np.array([tr.identified for tr in tracks]).T.reshape(-1, h)
            skip = bypassed(phase, s_used, identified, cfg.epsilon)
            s_eff: list[float] = effective_values(phase, s_used, skip).tolist()
            name = phase.name
            end = phase_start[p_idx] + phase.t_len
            cert = Certificate(s_eff, certificate_sign(cfg.op)) if cfg.certified else None
            early = (
                Stopping(members, self.cfg.stop_window_value, self.reach, cfg.tolerance, self.slots, cert)
                if cfg.early_stop
                else None
            )
            stopped = False
            if early is not None and resumed_at > phase_start[p_idx]:
                early.restore(resumed_at - phase_start[p_idx], tracks)
            self.stopping = early
            for t in range(t, end):  # noqa: B020 - t carries on across phases
                if lone is not None and lone.leave_at is not None and t >= lone.leave_at:
                    return t
                if not t & 63:
                    self.pace.tick(t, name)
                if saving:
                    self.checkpoint("x", t, p_idx, group)
                x_list = duals.x(objective, s_eff, c)
                fields = early.step(t - phase_start[p_idx], t, x_list) if early is not None else None
                got_flat: list[float] = []
                for k, m in enumerate(members):
                    tr = tracks[k]
                    tr.xs.append(x_list[k])
                    if m.corrupt:
                        tr.adv = m.publish_state(t, tr.s_used, self.signs(k), *duals.of(k))
                    if fields is None:
                        m.outbox.send_x(t, name, x_list[k])
                    else:
                        m.outbox.send_x(t, name, x_list[k], fields[k])
                        tr.sent = [t, early.k[k], early.e[k], *early.known[k]]  # type: ignore[union-attr]
                        tr.sent_cand = fields[k][3]
                for k, m in enumerate(members):
                    tracks[k].got = got = await m.x_in.take(t)
                    got_flat += still_here(self.slots[k], got)
                if t == first_round:
                    for m in members:
                        m.outbox.z0_done()  # every neighbour has finished this exchange
                kept = None
                if any(m.departed for m in members) and any(
                    u == t for m in members for u in m.departed.values()
                ):
                    kept = self._drop(t)
                duals.update(got_flat, c, theta, kept)
                if early is not None and early.received(t):
                    stopped = True
                    for m in members:
                        m.iterations_run -= end - 1 - t
                        if end < phase_start[-1]:
                            m.x_in.skip_to(end)
                    break
            t = end
            for k, tr in enumerate(tracks):
                cand = early.final(k) if early is not None and stopped else None
                final = tr.xs[-1] if cand is None else cand  # a certified stop outputs its candidate
                tr.finals.append(final)
                tr.identified.append(final)
        return None


Published = tuple[int, int | None, tuple[int, ...], float | None]
"""What a node publishes with its x (:meth:`Stopping.step`): quiet counter, stop (None while
unknown), departures, candidate (None: none)."""


class Stopping:
    """The early-stop state of the hosted nodes in one phase (:mod:`nlagg_node.termination`).

    Per node: its last ``window`` x's, its quiet counter, stop iteration and the departures it knows
    of, the neighbours' fields received with their x of the previous iteration (those still here:
    ``slots``, shared with the loop) and the departures it detected at the last barrier. With a
    ``certificate`` (the certified stop: each node's value as its x-update uses it, and the sign)
    also its pin run and candidate, and the quiet test is the certificate's
    (:func:`~nlagg_node.termination.fields_along` is the rule this follows step by step).
    """

    def __init__(
        self,
        members: list[Member],
        window: int,
        reach: int,
        tolerance: float,
        slots: list[list[int]],
        certificate: Certificate | None = None,
    ) -> None:
        self.members = members
        self.window, self.reach, self.tolerance = window, reach, tolerance
        self.threshold = stop_threshold(reach, window)
        self.slots = slots
        h = len(members)
        self.hist = [[0.0] * window for _ in range(h)]
        self.k = [0] * h
        self.e = [NO_STOP] * h
        self.known: list[tuple[int, ...]] = [()] * h
        self.caught: list[tuple[int, ...]] = [()] * h
        self.nbr: list[list[Fields]] = [[] for _ in range(h)]
        self.cert = certificate
        self.values = [float(v) for v in certificate.values] if certificate is not None else []
        self.sign = certificate.sign if certificate is not None else 1.0
        self.signed = [self.sign * v for v in self.values]
        self.run = [0] * h  # the pin runs r_i
        self.b = [NO_CANDIDATE] * h  # the candidates b_i (signed)

    def detect(self, k: int, t: int) -> None:
        """Hosted node k took x^(t) and found neighbours departed at t: not quiet at t + 1."""
        self.caught[k] = (t,)

    def step(self, lt: int, t: int, xs: list[float]) -> list[Published]:
        """Iteration t (``lt`` within the phase): each node's ``(quiet, stop, departures, cand)`` to
        publish with x^(t): departures merged first, then the candidate, the quiet test, k and e."""
        slot = lt % self.window
        out: list[Published] = []
        for k, xk in enumerate(xs):
            caught, nbr = self.caught[k], self.nbr[k]
            if caught or self.known[k] or any(f[2] for f in nbr):
                merged = set(self.known[k]).union(caught, *(f[2] for f in nbr))
                self.known[k] = tuple(sorted(d for d in merged if recent(d, t, self.reach)))
                self.caught[k] = ()
            if self.cert is None:
                quiet = not caught and lt >= self.window and is_quiet(xk, self.hist[k][slot], self.tolerance)
                self.hist[k][slot] = xk
            else:
                quiet = self._certified(k, xk, nbr)
            k_min = min([self.k[k]] + [f[0] for f in nbr])
            e_min = min([live_stop(self.e[k], t)] + [live_stop(f[1], t) for f in nbr])
            self.k[k] = next_quiet(quiet, k_min)
            self.e[k] = next_stop(e_min, self.k[k], t, self.threshold, self.reach)
            stop = None if self.e[k] == NO_STOP else self.e[k]
            out.append((self.k[k], stop, self.known[k], self.final(k)))
        return out

    def _certified(self, k: int, x: float, nbr: list[Fields]) -> bool:
        """Node k's pin run and candidate after taking ``x``; whether it is quiet (the certificate)."""
        sign = self.sign
        self.run[k] = next_pin_run(x, self.values[k], self.run[k])
        own = own_candidate(self.signed[k], self.run[k], self.window)
        b_max = max([self.b[k]] + [sign * f[3] for f in nbr if f[3] is not None])
        resetting = bool(self.known[k])
        self.b[k] = next_candidate(b_max, own, resetting)
        return not resetting and is_certified(self.signed[k], self.b[k])

    def final(self, k: int) -> float | None:
        """Node k's candidate on the protocol's scale (its output at a certified stop); None without
        one, or without the certificate."""
        return None if self.cert is None or self.b[k] == NO_CANDIDATE else self.sign * self.b[k]

    def restore(self, lt: int, tracks: list[_Track]) -> None:
        """Resumed at phase-local iteration ``lt > 0``: the state after iteration ``lt - 1``, from the
        x's run (the window, the pin runs), the fields last published and the neighbours' (the
        checkpoint)."""
        for k, tr in enumerate(tracks):
            xs = tr.xs[len(tr.xs) - lt :]
            for lt_past in range(max(0, lt - self.window), lt):
                self.hist[k][lt_past % self.window] = xs[lt_past]
            _, self.k[k], self.e[k], *known = tr.sent
            self.known[k] = tuple(known)
            ck = tr.ck
            quiet = ck.prev_quiet if ck is not None else []
            cands = ck.prev_cand if ck is not None and ck.prev_cand else [None] * len(quiet)
            self.nbr[k] = [(f[0], f[1], tuple(f[2:]), c) for f, c in zip(quiet, cands, strict=True)]
            if self.cert is not None:
                self.run[k] = _trailing(xs, self.values[k])
                self.b[k] = NO_CANDIDATE if tr.sent_cand is None else self.sign * tr.sent_cand

    def received(self, t: int) -> bool:
        """After taking x^(t): keep the fields of the neighbours still here; whether the phase ends
        with iteration t."""
        for k, m in enumerate(self.members):
            self.nbr[k] = still_here(self.slots[k], m.take_quiet(t))
        stops = [halts(e, t, known, self.reach) for e, known in zip(self.e, self.known, strict=True)]
        if any(stops) and not all(stops):
            raise NlaggError(
                f"hosted nodes disagree on the stop at t={t}: {self.e} (a departure split them into"
                " components that stop apart: host them as processes of their own)"
            )
        return stops[0]


def _trailing(xs: list[float], value: float) -> int:
    """How many of the last ``xs`` equal ``value`` in a row: a pin run rebuilt from the x's run."""
    run = 0
    for x in reversed(xs):
        if x != value:
            break
        run += 1
    return run
