"""The transcript attack: what a passive adversary provably learns about every honest node.

Input is the public part of one run as plain arrays: the graph, the phase schedule, z^(0)
of every directed edge, every published x (an ``(n, T)`` matrix) and whatever corrupted
nodes forwarded. :func:`adversary.live.replay_exposures` replays the public z-recursion
with the functions of :mod:`nlagg_node.pdmm` and classifies each x_i^(t) as the lower
linear branch ``lo`` (so ``s_i <= lo``), the upper branch ``hi`` (so ``s_i >= hi``), a
matching event (``x_i^(t) = s_i``: exposed exactly) or, in an average-consensus phase, a
solved value (``s_i = x_i (1 + c d_i) + v_i``, exact up to rounding). This module turns
those codes into one finding per node: the exposed value with the iteration of the
matching event, or the tightest interval the transcript proves, and scores the findings
against ground truth when it is known.

Top-K rounds after the first let nodes that hold an identified value bypass the max (their
x is then ``lo`` whatever s_i is). A ``lo`` there proves ``s_i <= lo`` only for nodes the
transcript already shows to lie more than epsilon below every value they identified; for
the others the round adds nothing (and symmetrically for the min rounds of the trimmed mean).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import numpy as np

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.errors import ConfigError
from nlagg_node.protocol import phase_final
from nlagg_node.schedule import Phase
from nlagg_node.valuemap import ValueScale

from .linear import LinearFindings, RelationJson, attack_linear, relations_json, tightened
from .live import HIGH, LOW, SOLVED, VALUE, Exposures, PublicRun, replay_exposures
from .spans import node_ends, node_iterations_run, phase_spans
from .transcript.arrays import first_matches, load_transcript_arrays, read_truth

if TYPE_CHECKING:
    pass

Status = Literal["exposed", "interval", "corrupted"]

SUM_SOLVED = "solved from component sum"
"""``how`` of a value the average phases' linear relations determine (:mod:`adversary.linear`)."""

SOLVED_TOLERANCE = 1e-9
"""Relative tolerance of a value solved from an average-consensus x (exact up to rounding)."""


@dataclass(frozen=True)
class Halted:
    """What the x's the nodes ended their phases with said, where they were read (a transcript).

    Attributes
    ----------
    ends : with early stopping, per phase, node -> the last iteration it ran
        (:attr:`adversary.rules.PhaseEnds.by_phase`); the others are inferred from the x's
        (:func:`~adversary.spans.node_ends`).
    finals : ``(n, T'')``, a run that stops on the certificate: the candidate published with the x
        at which a node ended its phase, NaN elsewhere
        (:func:`~adversary.transcript.reader.certified_finals`). There it is the node's final, not
        its last x (the output: exactly the extremum).
    """

    ends: Sequence[Mapping[int, int]] | None = None
    finals: FloatArray | None = None


@dataclass(frozen=True)
class NodeFinding:
    """What the transcript proves about one node.

    ``lower <= s_i <= upper`` always holds; for an exposed node both equal ``value``.
    ``t`` is the iteration of the first matching event (or solved x), -1 otherwise.
    ``side`` places the interval against the final output: ``above``, ``below``,
    ``at`` (exposed and equal), or ``unknown`` when the interval contains the output.
    ``distance`` is how far the interval lies from the output (0 when it touches it).
    """

    node: int
    status: Status
    value: float | None
    t: int
    how: str
    lower: float
    upper: float
    side: str
    distance: float


class AttackExtra(TypedDict, total=False):
    """What an attack adds beyond the findings: the replay's and the transcript's facts."""

    solved_phase: bool  # an average-consensus phase let the replay solve values
    run_id: str
    captured_x: int  # x messages in the transcript
    expected_x: int  # the x's of the iterations each node ran (n x T on the fixed schedule)
    departed: dict[str, int]  # nodes that left the run: node -> the iteration (announced in statuses)
    determined: list[int]  # every node whose value the transcript determines (corrupted included)
    relations: list[RelationJson]  # what the average phases fix beyond them (adversary.linear)


class FindingJson(TypedDict):
    """One :class:`NodeFinding` in JSON (``null`` for an unbounded side, or no iteration)."""

    node: int
    status: Status
    value: float | None
    t: int | None
    how: str
    lower: float | None
    upper: float | None
    side: str
    distance: float | None


class AttackJson(AttackExtra):
    """``nlagg attack --json`` and ``report.json``."""

    op: str
    n: int
    iterations: int
    output: float | None
    exposed: list[int]
    precision: float | None
    recall: float | None
    iteration_agreement: float | None
    interval_soundness: float | None
    truth: str
    value_range: list[float] | None  # values, intervals and the output are in its units
    nodes: list[FindingJson]


@dataclass
class AttackReport:
    """Findings for every node, and scores when the truth is known."""

    op: str
    n: int
    iterations: int
    output: float | None
    findings: list[NodeFinding]
    precision: float | None = None
    recall: float | None = None
    iteration_agreement: float | None = None
    interval_soundness: float | None = None
    truth_note: str = ""
    value_range: tuple[float, float] | None = None
    extra: AttackExtra = field(default_factory=lambda: AttackExtra())

    @property
    def exposed(self) -> dict[int, NodeFinding]:
        return {f.node: f for f in self.findings if f.status == "exposed"}

    def to_json(self) -> AttackJson:
        """Plain JSON: numbers, and ``null`` where there is none (an unbounded side of an interval,
        no iteration for a node never exposed, no distance without an output)."""

        def clean(key: str, v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if key == "t" and v == -1:
                return None
            return v

        nodes = [cast(FindingJson, {k: clean(k, v) for k, v in asdict(f).items()}) for f in self.findings]
        return {
            "op": self.op,
            "n": self.n,
            "iterations": self.iterations,
            "output": clean("output", self.output) if self.output is not None else None,
            "exposed": sorted(self.exposed),
            "precision": self.precision,
            "recall": self.recall,
            "iteration_agreement": self.iteration_agreement,
            "interval_soundness": self.interval_soundness,
            "truth": self.truth_note,
            "value_range": list(self.value_range) if self.value_range is not None else None,
            "nodes": nodes,
            **self.extra,
        }


def _bypass_allows(
    phase: Phase, lower: float, upper: float, identified: Sequence[float], epsilon: float
) -> bool:
    """Whether a branch code of this phase proves anything about the node (see module notes)."""
    if phase.bypass == "none" or not identified:
        return True
    if phase.bypass == "max":
        return upper < min(identified) - epsilon
    return lower > max(identified) + epsilon


def attack_arrays(
    n: int,
    edges: IntArray,
    phases: Sequence[Phase],
    cs: Sequence[float],
    theta: float,
    z0: Mapping[str, FloatArray],
    x: FloatArray,
    *,
    op: str = "",
    epsilon: float = 1e-3,
    corrupted: Mapping[int, float] | None = None,
    replayed: Exposures | None = None,
    departed: Mapping[int, int] | None = None,
    scale: ValueScale | None = None,
    early_stop: bool = False,
    halted: Halted | None = None,
) -> AttackReport:
    """Run the attack on one transcript given as arrays.

    The replay runs on the wire's (protocol) scale; every value, interval and the output of
    the report are in the user's units (``scale`` maps them back; identity by default).

    Parameters
    ----------
    n, edges
        Number of nodes and canonical undirected edges.
    phases, cs, theta
        The schedule (:func:`nlagg_node.schedule.plan_phases`), each phase's c and the
        averaging constant: all public.
    z0
        Dual group -> z_{i|j}^(0) per directed edge in EdgeLayout order (NaN where missing).
    x
        ``(n, T)`` published states, NaN where not captured.
    op
        Operator name, for the report.
    epsilon
        Top-K tolerance (public; decides which nodes may bypass).
    corrupted
        Node id -> private value forwarded by that corrupted node, in the user's units.
    replayed
        The replay of these very arrays when the caller already ran it (a
        :class:`~adversary.live.LiveReplay` that kept up with a live capture): its
        ``(n, T')`` branch codes, ``T' >= T``, are cut to T instead of replaying again
        (the replay is causal: iteration t depends on nothing later).
    scale
        The run's public value range (:func:`nlagg_node.valuechecks.scale_for`).
    early_stop
        The run stops phases early (its public config says so): the iterations a phase skipped
        are skipped by the replay too (:func:`~adversary.live.replay_exposures`).
    halted
        Where the nodes ended their phases and, at a certified stop, with which candidate, as the x's
        they halted with said (:class:`Halted`); None: inferred from ``x`` alone.
    """
    ends, finals = (None, None) if halted is None else (halted.ends, halted.finals)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != n:
        raise ConfigError("x", f"shape {x.shape}", f"expected (n={n}, T)")
    corrupt = dict(corrupted or {})
    bad = [i for i in corrupt if not 0 <= i < n]
    if bad:
        raise ConfigError("corrupted", bad, f"node ids must lie in 0..{n - 1}")
    run = PublicRun(n, edges, phases, cs, theta, z0, x, departed, ends)
    if replayed is None:
        rep = replay_exposures(run, early_stop=early_stop)
    else:
        rep = _cut_replay(replayed, n, x.shape[1])
    T = rep.branch.shape[1]
    # With early stopping a phase's final x is where it stopped, not at the end of its t_len; where
    # departures split the graph, each node's is where its component stopped.
    own_ends = node_ends(phases, x[:, :T], edges, departed, ends) if early_stop else None
    lower, upper, last_t, final_t = _branch_bounds(phases, x[:, :T], rep, epsilon, own_ends, early_stop)
    sc = scale or ValueScale()
    lin = attack_linear(replace(run, x=x[:, :T]), rep, corrupt, sc, early_stop)
    if lin is not None and len(lin.relations):
        lower, upper = tightened(lin, rep, corrupt, sc, lower, upper)
    lower, upper = np.asarray(sc.to_user(lower)), np.asarray(sc.to_user(upper))
    last = _last_values(x[:, :T], last_t, finals)
    if own_ends is not None and departed:  # a departed node's last x is no output
        last[[j for j in departed if 0 <= j < n]] = np.nan
    output = sc.user_float(float(np.nanmedian(last))) if np.isfinite(last).any() else None
    findings = _findings(n, rep, lin, corrupt, sc, (lower, upper), output)
    codes_used = {int(c) for c in np.unique(rep.branch)} if T else set()
    extra: AttackExtra = {"solved_phase": SOLVED in codes_used}
    extra["determined"] = [f.node for f in findings if f.status != "interval"]
    if lin is not None:
        extra["relations"] = relations_json(lin, sc)
    return AttackReport(
        op=op,
        n=n,
        iterations=final_t + 1 if early_stop else T,  # up to the last iteration run
        output=output,
        findings=findings,
        value_range=None if sc.identity else (sc.lo, sc.hi),
        extra=extra,
    )


def _last_values(x: FloatArray, last_t: IntArray, finals: FloatArray | None) -> FloatArray:
    """Each node's final in the last phase reached: its x at ``last_t``, or the candidate it ended
    the phase with there (a certified stop, ``finals``)."""
    n, T = x.shape
    if not T:
        return np.full(n, np.nan)
    last = x[np.arange(n), last_t]
    if finals is None:
        return last
    cands = np.full((n, T), np.nan)
    given = np.asarray(finals, dtype=np.float64)[:, :T]
    cands[:, : given.shape[1]] = given
    at_end = cands[np.arange(n), last_t]
    pairs = zip(last.tolist(), at_end.tolist(), strict=True)
    return np.array([phase_final(xi, c if c == c else None, stopped=True) for xi, c in pairs])


def _cut_replay(replayed: Exposures, n: int, T: int) -> Exposures:
    """A live replay's exposures cut to the first ``T`` iterations (the replay is causal)."""
    if replayed.branch.shape[0] != n or replayed.branch.shape[1] < T:
        raise ConfigError("replayed", f"shape {replayed.branch.shape}", f"expected (n={n}, >= {T})")
    seen = (replayed.first >= 0) & (replayed.first < T)
    return Exposures(
        replayed.branch[:, :T], np.where(seen, replayed.first, -1), np.where(seen, replayed.value, np.nan)
    )


def _branch_bounds(
    phases: Sequence[Phase],
    x: FloatArray,
    rep: Exposures,
    epsilon: float,
    own_ends: IntArray | None,
    early_stop: bool,
) -> tuple[FloatArray, FloatArray, IntArray, int]:
    """``(lower, upper, last_t, final_t)``: each node's interval from the branches its x's took
    (an x on the low branch bounds s_i from above, one on the high branch from below), each
    node's final iteration in the last phase reached and that phase's last iteration."""
    n, T = x.shape
    lower = np.full(n, -np.inf)
    upper = np.full(n, np.inf)
    spans = phase_spans(phases, x) if early_stop else None
    t0, final_t = 0, T - 1
    last_t = np.full(n, T - 1, dtype=np.int64)  # each node's final iteration in the last phase reached
    ends: dict[str, list[IntArray]] = {}
    for k, phase in enumerate(phases):
        t1 = min(t0 + phase.t_len, T)
        if t1 <= t0:
            break
        earlier = ends.get(phase.group, [])
        for i in range(n):
            identified = [float(x[i, e[i]]) for e in earlier if math.isfinite(x[i, e[i]])]
            if not _bypass_allows(phase, float(lower[i]), float(upper[i]), identified, epsilon):
                continue
            codes = rep.branch[i, t0:t1]
            xi = x[i, t0:t1]
            lows = xi[codes == LOW]
            highs = xi[codes == HIGH]
            if len(lows):
                upper[i] = min(upper[i], float(lows.min()))
            if len(highs):
                lower[i] = max(lower[i], float(highs.max()))
        final_t = spans[k][1] - 1 if spans is not None and spans[k][1] > spans[k][0] else t1 - 1
        last_t = np.full(n, final_t, dtype=np.int64)
        if own_ends is not None:
            last_t = np.where(own_ends[k] > t0, own_ends[k] - 1, last_t)
        ends.setdefault(phase.group, []).append(last_t)
        t0 = t1
    return lower, upper, last_t, final_t


def _findings(
    n: int,
    rep: Exposures,
    lin: LinearFindings | None,
    corrupt: Mapping[int, float],
    sc: ValueScale,
    interval: tuple[FloatArray, FloatArray],
    output: float | None,
) -> list[NodeFinding]:
    """Each node's finding: forwarded, exposed (=s, solved, solved from a component sum) or the
    interval the transcript proves (``interval``: lower and upper bounds in the user's units)."""
    lower, upper = interval
    findings: list[NodeFinding] = []
    for i in range(n):
        if i in corrupt:
            v = float(corrupt[i])
            findings.append(_finding(i, "corrupted", v, -1, "forwarded", v, v, output))
        elif rep.first[i] >= 0:
            v = sc.user_float(float(rep.value[i]))
            how = "=s" if rep.branch[i, rep.first[i]] == VALUE else "solved"
            findings.append(_finding(i, "exposed", v, int(rep.first[i]), how, v, v, output))
        elif lin is not None and math.isfinite(lin.value[i]):
            v = sc.user_float(float(lin.value[i]))
            findings.append(_finding(i, "exposed", v, int(lin.t[i]), SUM_SOLVED, v, v, output))
        else:
            findings.append(_finding(i, "interval", None, -1, "", float(lower[i]), float(upper[i]), output))
    return findings


def _finding(
    i: int, status: Status, value: float | None, t: int, how: str, lo: float, hi: float, output: float | None
) -> NodeFinding:
    if output is None:
        side, dist = "unknown", math.nan
    elif lo > output:
        side, dist = "above", lo - output
    elif hi < output:
        side, dist = "below", output - hi
    elif lo == hi == output:
        side, dist = "at", 0.0
    else:
        side, dist = "unknown", 0.0
    return NodeFinding(i, status, value, t, how, lo, hi, side, dist)


def score(
    report: AttackReport,
    true_values: Sequence[float] | FloatArray,
    true_first_match: Sequence[int] | IntArray | None = None,
    *,
    note: str = "",
) -> AttackReport:
    """Fill precision, recall, iteration agreement and interval soundness from the truth.

    Parameters
    ----------
    true_values
        The value each node's dynamics used (``SimResult.used_values``: the DP baselines
        expose the perturbed value, which is what they put into the protocol).
    true_first_match
        First iteration with ``x_i^(t) = s_i`` per node (-1 if none), for recall.
    """
    s = np.asarray(true_values, dtype=np.float64)
    if s.shape != (report.n,):
        raise ConfigError("true_values", f"shape {s.shape}", f"expected ({report.n},)")
    honest = [f for f in report.findings if f.status != "corrupted"]
    claims = [f for f in honest if f.status == "exposed"]

    # Mapped back from the protocol's scale, a value is exact up to rounding relative to hi - lo.
    span = 0.0 if report.value_range is None else report.value_range[1] - report.value_range[0]
    mapped = SOLVED_TOLERANCE * span

    def right(f: NodeFinding) -> bool:
        truth = float(s[f.node])
        assert f.value is not None
        if f.how == "=s":
            return abs(f.value - truth) <= mapped
        return abs(f.value - truth) <= SOLVED_TOLERANCE * max(1.0, abs(truth), span)

    report.precision = sum(right(f) for f in claims) / len(claims) if claims else 1.0
    sound = [
        f.lower - mapped <= s[f.node] <= f.upper + mapped or (f.status == "exposed" and right(f))
        for f in honest
    ]
    report.interval_soundness = sum(sound) / max(1, len(sound))
    if true_first_match is not None:
        first = np.asarray(true_first_match, dtype=np.int64)
        events = [f for f in honest if 0 <= first[f.node] < report.iterations]
        found = [f for f in events if f.status == "exposed" and f.how == "=s"]
        report.recall = len(found) / len(events) if events else 1.0
        same = [f for f in found if f.t == first[f.node]]
        report.iteration_agreement = len(same) / len(found) if found else 1.0
    report.truth_note = note
    return report


def incomplete_note(report: AttackReport) -> str | None:
    """A warning when the transcript holds fewer x messages than the run published (None when whole)."""
    captured, expected = report.extra.get("captured_x"), report.extra.get("expected_x")
    if captured is None or expected is None or captured >= expected:
        return None
    return (
        f"transcript incomplete: {captured} of {expected} x messages captured (a capture cut short, or"
        " a copy without its -wal file); the replay, its output and its findings may be wrong"
    )


def report_json(report: AttackReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def attack_transcript(path: str | Path, truth: Path | None = None) -> AttackReport:
    """Attack a transcript file; score it when ground truth is at hand.

    ``truth`` is a testbed ``summary.json`` (its ``private_values``); by default the
    ``summary.json`` next to the transcript is used when it exists.
    """
    data = load_transcript_arrays(path)
    cfg = data["cfg"]
    report = attack_arrays(
        data["n"],
        data["edges"],
        data["phases"],
        data["cs"],
        data["theta"],
        data["z0"],
        data["x"],
        op=cfg.op,
        epsilon=cfg.epsilon,
        corrupted=data["corrupted"],
        scale=data["scale"],
        departed=data["departed"],
        early_stop=cfg.early_stop,
        halted=Halted(data["ends"], data["finals"]),
    )
    report.extra["run_id"] = data["run_id"]
    if not cfg.early_stop and data["x"].shape[1] < data["t_total"]:
        report.output = None  # the schedule's last iteration was not captured: no output to read
    if data["departed"]:
        report.extra["departed"] = {str(j): t for j, t in sorted(data["departed"].items())}
    report.extra["captured_x"] = int(np.isfinite(data["x"]).sum())
    # Early stopping: x's only of the iterations the phases ran (as far as the capture shows them).
    x = data["x"]
    report.extra["expected_x"] = (
        int(
            node_iterations_run(
                data["phases"], x, node_ends(data["phases"], x, data["edges"], data["departed"], data["ends"])
            ).sum()
        )
        if cfg.early_stop
        else int(data["n"] * data["t_total"])
    )
    # A node's 'done' status says how many x it published: more than captured = a cut transcript.
    said = sum(
        max(0, (st.iterations or 0) - int(np.isfinite(x[i]).sum()))
        for i, st in data["statuses"].items()
        if st.state == "done" and 0 <= i < x.shape[0]
    )
    report.extra["expected_x"] = max(report.extra["expected_x"], report.extra["captured_x"] + said)
    candidates = (
        [truth]
        if truth is not None
        else [
            Path(path).with_name("summary.json"),
            Path(path).with_name(Path(path).name + ".truth.json"),
        ]
    )
    for cand in candidates:
        if cand is None or (truth is None and not cand.is_file()):
            continue
        doc = read_truth(cand)
        if doc.get("run_id") not in (None, data["run_id"]) or "private_values" not in doc:
            if truth is not None:
                raise ConfigError("truth", str(cand), f"holds no private_values of run {data['run_id']}")
            continue
        try:
            vals = np.array([float(doc["private_values"][str(i)]) for i in range(cfg.n)])
            first_doc = doc.get("first_match")
            known = None if first_doc is None else [int(first_doc[str(i)]) for i in range(cfg.n)]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError("truth", str(cand), f"malformed ground truth ({exc!r})") from None
        if known is not None:
            first = np.array(known, dtype=np.int64)
        elif cfg.init in ("dp-gauss", "dp-laplace"):
            report.truth_note = f"{cand}: DP baseline (exposures are perturbed inputs), not scored"
            break
        else:
            first = first_matches(data["x"], np.asarray(data["scale"].to_protocol(vals)))
        score(report, vals, first, note=f"ground truth from {cand}")
        break
    return report
