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

from ..departure import departure_refusal
from ..errors import NlaggError, StopRequested
from ..init import draw_z0, perturb_value
from ..protocol import NO_HALT, halt_span, output_error
from ..protocol.machine import PhaseNode, StopRule
from ..rng import rng_for
from ..schedule import bypassed, effective_values, phase_c, value_noise
from ..termination import NO_STOP, Fields, certificate_sign
from ..valuemap import scale_for
from .checkpoint import Checkpoint, Stage
from .coalesce import Coalescer
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


async def run_members(
    members: list[Member], router: Router, transport: Transport, stop: asyncio.Event | None = None
) -> list[NodeResult]:
    """Read ``transport`` through ``router`` while the members run every phase; their results in order.

    ``stop`` set (a SIGTERM to a lone node): the member leaves before its next x (:meth:`Member.leave`);
    one that has published no x yet has nothing to leave, and the run ends with
    :class:`~nlagg_node.errors.StopRequested` at once, whatever it was waiting for.
    """
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
            leaving = None if stop is None else tg.create_task(_leave_on(stop, members))
            try:
                done = await gather_first_error([lp.run() for lp in loops])
                await gather_first_error([m.outbox.settle() for m in members])
            finally:
                reader.cancel()
                if leaving is not None:
                    leaving.cancel()
                for m in members:
                    m.close()
    except BaseExceptionGroup as group:
        raise first_error(group) from None
    results = {r.node: r for rs in done for r in rs}
    return [results[m.id] for m in members]


async def _leave_on(stop: asyncio.Event, members: list[Member]) -> None:
    await stop.wait()
    if not all([m.leave() for m in members]):
        raise StopRequested("told to stop before the first x: nothing to leave")


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
        why = departure_refusal(cfg.op, cfg.early_stop, cfg.may_depart)
        if why is not None:
            gone = {m.id: sorted(j for j, u in m.departed.items() if u == t) for m in self.members}
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
        batch = None if h == 1 else Coalescer(members)  # a host's x's: one message an iteration
        saving = any(m.store is not None for m in members)
        ck = self.start
        p_first, t, group, resuming = (0, 0, "", False) if ck is None else (ck.phase, ck.t, ck.group, True)
        if ck is not None and ck.stage == "x":
            duals.start([tr.ck.u_out for tr in tracks], [tr.ck.u_in for tr in tracks])  # type: ignore[union-attr]
        s_used = np.array([tr.s_used for tr in tracks])
        shape = members[0].shape
        schedule = shape.schedule
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
            start, end = schedule.start(p_idx), schedule.end(p_idx)
            sign = certificate_sign(cfg.op) if cfg.certified else None
            rule = StopRule(cfg.stop_window_value, self.reach, cfg.tolerance, sign)
            early = Stopping(members, rule, start, self.slots, s_eff) if cfg.early_stop else None
            stopped = False
            if early is not None and resumed_at > start:
                early.restore(resumed_at - start, tracks)
            self.stopping = early
            for t in range(t, end):  # noqa: B020 - t carries on across phases
                if lone is not None and lone.leave_at is not None and t >= lone.leave_at:
                    return t
                if not t & 63:
                    self.pace.tick(t, name)
                if saving:
                    self.checkpoint("x", t, p_idx, group)
                x_list = duals.x(objective, s_eff, c)
                fields = early.step(t, x_list) if early is not None else None
                got_flat: list[float] = []
                items: list[bytes] = []
                for k, m in enumerate(members):
                    tr = tracks[k]
                    tr.xs.append(x_list[k])
                    if m.corrupt:
                        tr.adv = m.publish_state(t, tr.s_used, self.signs(k), *duals.of(k))
                    fk = None if fields is None else fields[k]
                    if batch is None:
                        m.outbox.send_x(t, name, x_list[k], fk)
                    else:
                        items.append(m.outbox.x_item(t, name, x_list[k], fk))
                    if fk is not None:
                        tr.sent = early.sent(k, t)  # type: ignore[union-attr]
                        tr.sent_cand = fk[3]
                if batch is not None:
                    batch.publish(items)
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
                        if end < schedule.t_total:
                            m.x_in.skip_to(end)
                    break
            t = end
            for k, tr in enumerate(tracks):
                final = tr.xs[-1] if early is None else early.nodes[k].final(tr.xs[-1], stopped)
                tr.finals.append(final)
                tr.identified.append(final)
        return None


Published = tuple[int, int | None, tuple[int, ...], float | None]
"""What a node publishes with its x (:meth:`Stopping.step`): quiet counter, stop (None while
unknown), departures, candidate (None: none)."""


class Stopping:
    """The early stop of the hosted nodes in one phase: one state machine each
    (:class:`~nlagg_node.protocol.machine.PhaseNode`), fed with its x and the fields its neighbours
    still here (``slots``, shared with the loop) sent with their x of the previous iteration."""

    def __init__(
        self, members: list[Member], rule: StopRule, t0: int, slots: list[list[int]], values: list[float]
    ) -> None:
        self.members, self.slots = members, slots
        self.nodes = [PhaseNode(rule, t0, v) for v in values]
        self.nbr: list[list[Fields]] = [[] for _ in members]

    def detect(self, k: int, t: int) -> None:
        """Hosted node k took x^(t) and found neighbours departed at t: not quiet at t + 1."""
        self.nodes[k].neighbour_departed(t)

    def step(self, t: int, xs: list[float]) -> list[Published]:
        """Iteration t: each node's ``(quiet, stop, departures, cand)`` to publish with x^(t), after
        refusing, named, every stop claim of a neighbour it can contradict
        (:meth:`~nlagg_node.protocol.machine.PhaseNode.stop_error`): the claim is dropped, the rest of
        the fields kept; a neighbour that ended its phase on a false stop (one its x's acceptance
        took as its last, :func:`~nlagg_node.protocol.halt_span`) fails the run, named."""
        out: list[Published] = []
        for m, node, xk, nbr in zip(self.members, self.nodes, xs, self.nbr, strict=True):
            for q, f in enumerate(nbr):
                if f[1] != NO_STOP and (why := node.stop_error(m.active[q], t, f[1])) is not None:
                    if f[1] == t - 1 and halt_span(m.shape, t - 1, f[1], f[2]) != NO_HALT:
                        raise NlaggError(
                            f"node {m.id}: refused {why}; node {m.active[q]} ended its phase on it"
                        )
                    m.reject(why)
                    nbr[q] = (f[0], NO_STOP, f[2], f[3])
            k, e, known, cand = node.tick(t, xk, nbr)
            out.append((k, None if e == NO_STOP else e, known, cand))
        return out

    def sent(self, k: int, t: int) -> list[int]:
        """Node k's fields as a checkpoint keeps them: ``[t, quiet, stop or NO_STOP, *departures]``."""
        node = self.nodes[k]
        return [t, node.k, node.e, *node.known]

    def restore(self, lt: int, tracks: list[_Track]) -> None:
        """Resumed at phase-local iteration ``lt > 0``: the state after iteration ``lt - 1``, from the
        x's run, the fields last published and the neighbours' (the checkpoint)."""
        for k, tr in enumerate(tracks):
            _, quiet, stop, *known = tr.sent
            self.nodes[k].restore(tr.xs[len(tr.xs) - lt :], (quiet, stop, tuple(known), tr.sent_cand))
            ck = tr.ck
            prev = ck.prev_quiet if ck is not None else []
            cands = ck.prev_cand if ck is not None and ck.prev_cand else [None] * len(prev)
            self.nbr[k] = [(f[0], f[1], tuple(f[2:]), c) for f, c in zip(prev, cands, strict=True)]

    def received(self, t: int) -> bool:
        """After taking x^(t): keep the fields of the neighbours still here; whether the phase ends
        with iteration t."""
        for k, m in enumerate(self.members):
            self.nbr[k] = still_here(self.slots[k], m.take_quiet(t))
        stops = [node.halts(t) for node in self.nodes]
        if any(stops) and not all(stops):
            raise NlaggError(
                f"hosted nodes disagree on the stop at t={t}: {[node.e for node in self.nodes]} (a"
                " departure split them into components that stop apart: host them as processes of"
                " their own)"
            )
        return stops[0]
