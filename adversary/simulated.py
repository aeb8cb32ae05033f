"""Simulated runs as transcripts: the simulator's trial b seen exactly as the eavesdropper sees a testbed.

:func:`write_sim_transcript` writes one trial of a :class:`~nlagg_node.sim.SimResult` through
the same :class:`adversary.transcript.Transcript` writer and wire encoding as a live capture
(config, every z^(0), every x, final statuses, and the forwarded state of corrupted nodes), so
``nlagg attack`` reads both the same way. :func:`attack_simulation` runs the attack directly on
the arrays of one trial and scores it against the simulator's ground truth.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError
from nlagg_node.graphs import EdgeLayout, neighbours
from nlagg_node.schedule import Schedule, phase_c, sealed_groups_of, secret_groups_of
from nlagg_node.sim import SimResult
from nlagg_node.threat import known_duals
from nlagg_node.valuemap import scale_for

from .attack import AttackReport, Halted, attack_arrays, score

if TYPE_CHECKING:
    from nlagg_node.runtime.wire import topics

    from .transcript import Transcript


def _check_trial(result: SimResult, trial: int) -> None:
    B = result.values.shape[0]
    if not 0 <= trial < B:
        raise ConfigError("trial", trial, f"the run has trials 0..{B - 1}")
    t_total = result.t_total
    if len(result.recorded_t) != t_total or not np.array_equal(result.recorded_t, np.arange(t_total)):
        raise ConfigError("record", result.config.record, "the attack needs every x: use record='all'")


def trial_z0(result: SimResult, trial: int) -> dict[str, FloatArray]:
    """z^(0) of one trial per dual group, in the single-graph EdgeLayout order."""
    sizes = [len(g) for g in result.graphs]
    total = sum(sizes)
    off = sum(sizes[:trial])
    h = sizes[trial]
    return {
        group: np.concatenate([z[off : off + h], z[total + off : total + off + h]])
        for group, z in result.z0.items()
    }


def adversary_z0(result: SimResult, trial: int, corrupted: Sequence[int] = ()) -> dict[str, FloatArray]:
    """The z^(0) of one trial as the adversary knows them: NaN for a secret (sealed, random) group's
    duals, except on the edges of the ``corrupted`` nodes, which forward them."""
    cfg = result.config
    secret = secret_groups_of(cfg, result.phases)
    layout = EdgeLayout.from_graphs(cfg.n, [result.graphs[trial]])
    out: dict[str, FloatArray] = {}
    for group, z in trial_z0(result, trial).items():
        known = known_duals(group in secret, layout.src, layout.dst, [int(c) for c in corrupted])
        out[group] = np.where(known, z, np.nan)
    return out


def trial_x(result: SimResult, trial: int) -> FloatArray:
    """Every x of one trial as ``(n, T)`` (needs ``record='all'``); with early stopping, NaN at the
    iterations each node skipped in each phase, after its own (its component's) stop: nothing was
    published there, where the simulator records its final x."""
    _check_trial(result, trial)
    x = np.ascontiguousarray(result.recorded_x[:, trial, :].T)
    if result.config.early_stop:
        schedule = Schedule.of(result.phases)
        for p in range(len(result.phases)):
            for i, ran in enumerate(result.node_iterations[trial, :, p].tolist()):
                x[i, schedule.start(p) + int(ran) : schedule.end(p)] = np.nan
    return x


def _corrupted_values(result: SimResult, trial: int, corrupted: Sequence[int]) -> dict[int, float]:
    n = result.values.shape[1]
    bad = [c for c in corrupted if not 0 <= int(c) < n]
    if bad:
        raise ConfigError("corrupted", bad, f"node ids must lie in 0..{n - 1}")
    return {int(c): float(result.used_values[trial, int(c)]) for c in corrupted}


def attack_simulation(result: SimResult, trial: int = 0, corrupted: Sequence[int] = ()) -> AttackReport:
    """Attack trial ``trial`` of a simulation and score it against the simulator's truth."""
    _check_trial(result, trial)
    cfg = result.config
    x = trial_x(result, trial)
    report = attack_arrays(
        cfg.n,
        result.graphs[trial],
        result.phases,
        [phase_c(cfg, ph) for ph in result.phases],
        cfg.theta,
        adversary_z0(result, trial, corrupted),
        x,
        op=cfg.op,
        epsilon=cfg.epsilon,
        corrupted=_corrupted_values(result, trial, corrupted),
        scale=scale_for(cfg),
        departed=result.departures_of(trial),
        early_stop=cfg.early_stop,
        halted=Halted(finals=_certified_finals(result, trial, x)),
    )
    return score(
        report,
        result.used_values[trial],
        result.first_match[trial],
        note=f"simulator ground truth, trial {trial}",
    )


def _certified_finals(result: SimResult, trial: int, x: FloatArray) -> FloatArray | None:
    """A run that stops on the certificate: ``(n, T)``, each node's candidate at the x it ended a
    phase with (its final there), NaN elsewhere; None for any other run."""
    if not result.config.certified:
        return None
    finals: dict[tuple[int, int], float] = {}
    for _ in _early_x(result, trial, x, finals):
        pass
    out = np.full(x.shape, np.nan)
    schedule = Schedule.of(result.phases)
    for (i, p), final in finals.items():
        out[i, schedule.start(p) + int(result.node_iterations[trial, i, p]) - 1] = final
    return out


def write_sim_transcript(
    result: SimResult,
    path: str | Path,
    *,
    trial: int = 0,
    corrupted: Sequence[int] = (),
    run_id: str | None = None,
    prefix: str = "nlagg",
) -> Path:
    """Write trial ``trial`` of a simulation as an eavesdropper transcript (SQLite).

    Messages are those a testbed run publishes, encoded by the wire protocol: the
    retained config, z^(0) of every directed edge and dual group (in plaintext; a sealed
    group's are left out, as the wire never shows them), x_i^(t) of every node and iteration,
    a ``done`` status per node with its final x per phase and its output, and for every
    corrupted node its forwarded state at the first iteration of each dual group (its value
    and that group's z^(0); the duals between follow from the public recursion). The
    simulation must record every iteration (``record='all'``). An existing file is refused
    rather than mixed with another run.
    The ground truth (values the dynamics used, first matching events) goes to a
    separate ``<path>.truth.json`` for scoring. Returns the transcript's path.
    """
    from nlagg_node.runtime.public import build_config_msg
    from nlagg_node.runtime.wire import encode, topics

    from .transcript import Transcript

    _check_trial(result, trial)
    out = Path(path)
    if out.exists():
        raise ConfigError("transcript", str(out), "already exists; choose a new path")
    cfg = result.config
    rid = run_id if run_id is not None else f"sim-{uuid.uuid4().hex[:12]}"
    tp = topics(prefix, rid)
    messages = _TrialMessages(result, trial, tp)
    corrupt = _corrupted_values(result, trial, corrupted)
    with Transcript(out, run_id=rid, prefix=prefix) as tr:
        tr.set_meta("source", f"nlagg simulator, trial {trial}, seed {cfg.seed}")
        tr.add(tp.config, encode(build_config_msg(cfg, rid, messages.edges)), retained=True, received=0.0)
        messages.write_z0(tr)
        messages.write_x(tr)
        messages.write_forwarded(tr, corrupt)
        messages.write_finals(tr)
        tr.commit()
    truth = {
        "run_id": rid,
        "note": "ground truth of a simulated transcript (never part of a capture)",
        "private_values": {str(i): float(result.used_values[trial, i]) for i in range(cfg.n)},
        "first_match": {str(i): int(result.first_match[trial, i]) for i in range(cfg.n)},
    }
    truth_path(out).write_text(json.dumps(truth, indent=2))
    return out


class _TrialMessages:
    """The messages a network running trial ``trial`` of ``result`` publishes on the topics ``tp``,
    written into a transcript kind by kind: its graph, duals and x's are the trial's."""

    def __init__(self, result: SimResult, trial: int, tp: topics) -> None:
        self.result, self.trial, self.tp = result, trial, tp
        self.edges: IntArray = result.graphs[trial]
        self.layout = EdgeLayout.from_graphs(result.config.n, [self.edges])
        self.nbrs = neighbours(result.config.n, self.edges)
        self.gone = result.departures_of(trial)
        self.z0 = trial_z0(result, trial)
        self.x = trial_x(result, trial)
        self.finals: dict[tuple[int, int], float] = {}  # (node, phase) -> its final where it stopped early

    def write_z0(self, tr: Transcript) -> None:
        """Every z^(0) of the plain dual groups (a sealed group's never show on the wire)."""
        from nlagg_node.runtime.wire import Z0Msg, encode

        layout = self.layout
        sealed = sealed_groups_of(self.result.config, self.result.phases)
        for group, z in self.z0.items():
            if group in sealed:
                continue
            for e in range(len(z)):
                i, j = int(layout.src[e]), int(layout.dst[e])
                if np.isnan(z[e]):
                    continue  # an edge of a node that had departed before this exchange
                msg = Z0Msg.model_validate({"from": i, "to": j, "group": group, "z": float(z[e])})
                tr.add(self.tp.z0(i, j), encode(msg), received=0.0)

    def write_x(self, tr: Transcript) -> None:
        """Every x the nodes publish, in time order, with a departure's will and its neighbours'
        statuses before their next x (with early stopping, each x with its stop fields)."""
        from nlagg_node.runtime.wire import encode_x

        result, x, tp = self.result, self.x, self.tp
        names = np.repeat([ph.name for ph in result.phases], [ph.t_len for ph in result.phases])
        # Early stopping: the x's of the iterations each node ran, with their fields.
        stream = _early_x(result, self.trial, x, self.finals) if result.config.early_stop else None
        due = next(stream, None) if stream is not None else None
        for t in range(x.shape[1]):
            self._write_departures(tr, t)
            if stream is not None:
                if due is not None and due[0] == t:
                    for i, payload in due[1]:
                        tr.add(tp.x(i), payload, received=float(t))
                    due = next(stream, None)
                continue
            for i in range(result.config.n):
                if np.isnan(x[i, t]):
                    continue  # departed
                tr.add(
                    tp.x(i),
                    encode_x(node=i, t=t, phase=str(names[t]), x=float(x[i, t])),
                    received=float(t),
                )

    def _write_departures(self, tr: Transcript, t: int) -> None:
        """The wills of the nodes that departed at ``t - 1`` and their neighbours' statuses naming
        them, published before the neighbours' x^(t), as on a network."""
        from nlagg_node.runtime.wire import StatusMsg, encode

        gone, nbrs, tp = self.gone, self.nbrs, self.tp
        for j in sorted(k for k, at in gone.items() if at + 1 == t):
            offline = encode(StatusMsg(node=j, state="offline"))
            tr.add(tp.status(j), offline, retained=True, received=t - 0.5)
            for i in nbrs[j]:
                if gone.get(i, t) < t:
                    continue  # gone before it
                told = {str(k): at for k, at in sorted(gone.items()) if k in nbrs[i] and at < t}
                status = StatusMsg(node=i, state="running", departed=told)
                tr.add(tp.status(i), encode(status), retained=True, received=t - 0.5)

    def write_forwarded(self, tr: Transcript, corrupt: Mapping[int, float]) -> None:
        """The state each corrupted node (``{node: its value}``) forwards at the first iteration of
        each dual group."""
        from nlagg_node.runtime.wire import AdvStateMsg, encode

        result, layout = self.result, self.layout
        starts: dict[str, int] = {}
        for ph, t0 in zip(result.phases, Schedule.of(result.phases).starts, strict=False):
            starts.setdefault(ph.group, t0)
        scale = scale_for(result.config)
        for i, s_user in corrupt.items():
            s = scale.protocol_float(s_user)  # a node forwards the value it runs the protocol on
            for group, t0 in starts.items():
                zg = self.z0[group]
                zs = {str(int(layout.dst[e])): float(zg[e]) for e in np.flatnonzero(layout.src == i)}
                zin = {str(int(layout.src[e])): float(zg[e]) for e in np.flatnonzero(layout.dst == i)}
                adv = AdvStateMsg(node=i, t=t0, s=s, z=zs, z_in=zin)
                tr.add(self.tp.adv(i), encode(adv), received=float(t0))

    def write_finals(self, tr: Transcript) -> None:
        """Each node's last status: ``done`` with its final x per phase (its last iteration run in
        each: ``t_len - 1``, or earlier where its component stopped early; at a certified stop its
        candidate, as a node's), output and the departures it knows of; ``offline`` for a departed
        node."""
        from nlagg_node.runtime.wire import StatusMsg, encode

        result, trial, x, gone, nbrs = self.result, self.trial, self.x, self.gone, self.nbrs
        offsets = np.asarray(Schedule.of(result.phases).starts[:-1])
        ends = offsets[None, :] + result.node_iterations[trial] - 1  # (n, phases)
        iterations = result.node_iterations[trial].sum(axis=1)  # (n,) each node's
        output = np.asarray(result.output[trial], dtype=np.float64)
        for i in range(result.config.n):
            final_told = {str(j): t for j, t in sorted(gone.items()) if j in nbrs[i]} or None
            status = (
                StatusMsg(node=i, state="offline")
                if i in gone
                else StatusMsg(
                    node=i,
                    state="done",
                    final=[self.finals.get((i, p), float(x[i, e])) for p, e in enumerate(ends[i])],
                    output=[float(v) for v in np.atleast_1d(output[i])],
                    iterations=int(iterations[i]),
                    departed=final_told,
                )
            )
            tr.add(self.tp.status(i), encode(status), retained=True, received=float(x.shape[1]))


def _early_x(
    result: SimResult, trial: int, x: FloatArray, finals: dict[tuple[int, int], float]
) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
    """Every x_i^(t) the nodes of an early-stopping run publish, encoded, as ``(t, [(i, payload)])``
    in the order of t: up to each node's stop (its component's) in each phase, before its
    departure, with the quiet counter, the stop iteration, the departures it knows of and, in a
    certified run, the candidate (:func:`nlagg_node.protocol.fields_along`). ``finals`` gets
    ``(node, phase) -> final`` of every node that ended a phase on its stop
    (:func:`~nlagg_node.protocol.phase_final`: at a certified stop, its candidate)."""
    from nlagg_node.protocol import fields_along, phase_final
    from nlagg_node.runtime.wire import encode_x
    from nlagg_node.termination import NO_STOP, Certificate, certificate_sign, halts, stop_reach

    cfg = result.config
    edges = result.graphs[trial]
    reach = stop_reach(cfg.n, edges, cfg.may_depart)
    gone = result.departures_of(trial)
    cert = (
        Certificate(result.protocol_values[trial].tolist(), certificate_sign(cfg.op))
        if cfg.certified
        else None
    )
    for p, (phase, start) in enumerate(zip(result.phases, Schedule.of(result.phases).starts, strict=False)):
        ran = int(result.phase_iterations[trial, p])
        seg = x[:, start : start + ran].T
        rows = fields_along(
            seg, edges, start, cfg.stop_window_value, reach, cfg.tolerance, departed=gone, certificate=cert
        )
        for lt, row in enumerate(rows):
            t = start + lt
            payloads: list[tuple[int, bytes]] = []
            for i, fields in enumerate(row):
                if fields is not None:  # None: node i publishes nothing at t
                    k, e, deps, cand = fields
                    stop = None if e == NO_STOP else e
                    payloads.append(
                        (i, encode_x(i, t, phase.name, float(x[i, t]), k, stop, deps or None, cand))
                    )
                    if halts(e, t, deps, reach):
                        finals[i, p] = phase_final(float(x[i, t]), cand, stopped=True)
            yield t, payloads


def truth_path(transcript: Path) -> Path:
    """Where :func:`write_sim_transcript` puts the ground truth of a simulated transcript."""
    return transcript.with_name(transcript.name + ".truth.json")


def simulate_transcript(
    cfg: RunConfig,
    path: str | Path,
    *,
    corrupted: Sequence[int] = (),
    run_id: str | None = None,
    prefix: str = "nlagg",
    departures: Mapping[int, int] | None = None,
) -> Path:
    """Simulate trial 0 of ``cfg`` alone, recording every x, and write it as a transcript.

    With ``departures`` (``{node: T}``) a departed node's x's stop at T - 1, its status is its last
    will (``offline``) and its neighbours' ``done`` statuses name it, as on a network.

    This is what ``nlagg sim --transcript PATH`` writes: trial 0 of a run does not depend
    on the number of trials (every stream is keyed by trial), so a one-trial simulation
    with ``record='all'`` reproduces it exactly without keeping every x of every trial,
    and it is also the run a testbed with the same seed performs.
    """
    from nlagg_node.sim import simulate

    one = cfg.model_copy(update={"trials": 1, "record": "all"})
    result = simulate(one, departures=departures)
    return write_sim_transcript(result, path, corrupted=corrupted, run_id=run_id, prefix=prefix)
