"""Privacy over time: what the transcripts of many epochs of a deployment prove together.

Each epoch is attacked on its own (:func:`adversary.attack.attack_transcript`, with the linear
attack of :mod:`adversary.linear`): per node an exposed value or an interval
``lower_k <= s_i(k) <= upper_k``. Across epochs the values may move; under a declared drift D
(``|s_i(k) - s_i(m)| <= D |k - m|`` for every node and pair of epochs), the interval of epoch m
also bounds epoch k once widened by ``D |k - m|``, so

    lower*_k = max_m (lower_m - D |k - m|),    upper*_k = min_m (upper_m + D |k - m|)

is sound for s_i(k) whenever the drift holds, and never wider than epoch k's own interval. Two
passes (forward and backward, each ``L_k = max(lower_k, L_prev - D (k - prev))``) compute it in
O(epochs x n). An empty result (``lower* > upper*``) proves that some value moved further than
the declared drift: the node is reported ``consistent: false``.

A node is *cumulatively exposed* from the first epoch its value was exposed in: an adversary that
keeps listening learns, epoch after epoch, every node exposed in at least one of them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from nlagg_node.arrays import FloatArray
from nlagg_node.errors import ConfigError

from .attack import SOLVED_TOLERANCE, attack_transcript, incomplete_note
from .transcript.store import EpochRow, EpochStore, Result

__all__ = [
    "EpochEntry",
    "EpochsReport",
    "NodeSeries",
    "attack_epochs",
    "combine_intervals",
    "epoch_summary",
    "summary_intervals",
]


def epoch_summary(path: str | Path) -> dict[str, Any]:
    """What the store keeps of an epoch once its raw messages may go: the attack's report on its
    transcript (:meth:`~adversary.attack.AttackReport.to_json`: exposures, intervals, the output)
    and whether the transcript was complete. An epoch without a configuration captured has no
    report: its summary says why."""
    try:
        report = attack_transcript(path)
    except ConfigError as exc:
        return {"error": str(exc), "complete": False}
    doc: dict[str, Any] = dict(report.to_json())
    doc["complete"] = incomplete_note(report) is None
    return doc


def combine_intervals(
    epochs: Sequence[int], lower: FloatArray, upper: FloatArray, drift: float
) -> tuple[FloatArray, FloatArray]:
    """Each epoch's interval intersected with every other epoch's, widened by the drift per epoch.

    Parameters
    ----------
    epochs
        The epochs' numbers, ascending (gaps allowed: the distance is ``k - m``).
    lower, upper
        ``(len(epochs), n)`` bounds per epoch and node (``-inf``/``inf`` where unbounded, equal
        where exposed).
    drift
        D >= 0, in the values' units: the most a value moves from one epoch to the next.

    Returns
    -------
    ``(lower*, upper*)`` of the same shape (see the module notes); ``lower* > upper*`` where
    the intervals contradict the drift.
    """
    ks = np.asarray(epochs, dtype=np.float64)
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    if lo.shape != hi.shape or lo.ndim != 2 or lo.shape[0] != len(ks):
        raise ConfigError("intervals", f"shapes {lo.shape}, {hi.shape}", f"expected ({len(ks)}, n) each")
    if len(ks) > 1 and not (np.diff(ks) > 0).all():
        raise ConfigError("epochs", list(epochs), "must be strictly ascending")
    if not (math.isfinite(drift) and drift >= 0):
        raise ConfigError("drift", drift, "must be a finite number >= 0")
    out_lo, out_hi = lo.copy(), hi.copy()
    for order in (range(1, len(ks)), range(len(ks) - 2, -1, -1)):
        run_lo, run_hi = lo.copy(), hi.copy()
        for k in order:
            prev = k - 1 if order.step == 1 else k + 1
            widen = drift * abs(ks[k] - ks[prev])
            run_lo[k] = np.maximum(lo[k], run_lo[prev] - widen)
            run_hi[k] = np.minimum(hi[k], run_hi[prev] + widen)
        out_lo, out_hi = np.maximum(out_lo, run_lo), np.minimum(out_hi, run_hi)
    return out_lo, out_hi


def summary_intervals(summary: dict[str, Any], n: int) -> tuple[FloatArray, FloatArray]:
    """``(lower, upper)`` of ``n`` nodes from an epoch's summary (unbounded where it says nothing)."""
    lo, hi = np.full(n, -np.inf), np.full(n, np.inf)
    for f in summary.get("nodes", []):
        i = int(f["node"])
        if 0 <= i < n:
            lo[i] = -np.inf if f["lower"] is None else float(f["lower"])
            hi[i] = np.inf if f["upper"] is None else float(f["upper"])
    return lo, hi


class CombinedJson(TypedDict):
    epoch: int
    lower: float | None
    upper: float | None


@dataclass(frozen=True)
class EpochEntry:
    """One epoch of the series: its state in the store, output and exposures."""

    epoch: int
    state: str
    output: float | None  # what the attack replayed (the nodes' final x's)
    published: float | None  # the median of the outputs the nodes published on P/R/results
    iterations: int | None
    exposed: list[int]
    complete: bool
    error: str | None = None


@dataclass(frozen=True)
class NodeSeries:
    """One node over the epochs: where it was exposed and its combined intervals."""

    node: int
    exposed_in: list[int]
    combined: list[CombinedJson]
    consistent: bool


@dataclass
class EpochsReport:
    """``nlagg attack`` on an epoch store."""

    prefix: str
    run_id: str
    op: str
    n: int
    drift: float | None  # as declared
    drift_units: float | None  # in the values' units
    value_range: tuple[float, float] | None
    epochs: list[EpochEntry]
    nodes: list[NodeSeries] = field(default_factory=list)

    @property
    def cumulative(self) -> dict[int, int]:
        """Node -> the first epoch it was exposed in."""
        return {s.node: s.exposed_in[0] for s in self.nodes if s.exposed_in}

    def interval_soundness(self, truth: Mapping[int, Sequence[float] | FloatArray]) -> float:
        """The share of (node, epoch) combined intervals that contain the truth, ``truth[k][i]`` the
        value of node i in epoch k (epochs missing from ``truth`` are not scored). As in
        :func:`adversary.attack.score`, a bound may miss by rounding: 1e-9 of the value range."""
        span = 0.0 if self.value_range is None else self.value_range[1] - self.value_range[0]
        tol = SOLVED_TOLERANCE * max(1.0, span)
        hits = [
            (-math.inf if c["lower"] is None else c["lower"]) - tol
            <= float(truth[c["epoch"]][s.node])
            <= (math.inf if c["upper"] is None else c["upper"]) + tol
            for s in self.nodes
            for c in s.combined
            if c["epoch"] in truth
        ]
        return sum(hits) / len(hits) if hits else 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "run_id": self.run_id,
            "op": self.op,
            "n": self.n,
            "drift": self.drift,
            "drift_units": self.drift_units,
            "value_range": list(self.value_range) if self.value_range is not None else None,
            "epochs": [asdict(e) for e in self.epochs],
            "cumulative_exposed": {str(i): k for i, k in sorted(self.cumulative.items())},
            "nodes": [asdict(s) for s in self.nodes],
        }


def _num(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _published(results: list[Result], epoch: int) -> float | None:
    outs = [r.output for r in results if r.epoch == epoch]
    return statistics.median(outs) if outs else None


def _entry(row: EpochRow, summary: dict[str, Any], results: list[Result]) -> EpochEntry:
    return EpochEntry(
        epoch=row.epoch,
        state=row.state,
        output=summary.get("output"),
        published=_published(results, row.epoch),
        iterations=summary.get("iterations"),
        exposed=list(summary.get("exposed", [])),
        complete=bool(summary.get("complete", False)),
        error=summary.get("error"),
    )


def _summaries(store: EpochStore) -> list[tuple[EpochRow, dict[str, Any]]]:
    """Every epoch with its summary: the stored one, or (an epoch still open) the attack on its file now."""
    out = []
    for row in store.epochs():
        if row.summary is not None:
            out.append((row, row.summary))
        elif store.transcript_path(row.epoch).is_file():
            out.append((row, epoch_summary(store.transcript_path(row.epoch))))
    return out


def attack_epochs(folder: str | Path, drift: float | None = None) -> EpochsReport:
    """Attack every epoch of a store and combine the nodes' intervals under ``drift``.

    ``drift`` is a fraction of the declared value range when the epochs declare one, else in the
    values' units (as ``nlagg sim --drift``); None: no combination (each node's exposures only).
    """
    with EpochStore(folder, read_only=True) as store:
        found = _summaries(store)
        results = store.results()
        prefix, run_id = store.prefix, store.run_id
    attacked = [(row, s) for row, s in found if "nodes" in s]
    n = max((int(s["n"]) for _, s in attacked), default=0)
    ops = {str(s["op"]) for _, s in attacked}
    ranges = [s["value_range"] for _, s in attacked if s.get("value_range") is not None]
    value_range = (float(ranges[-1][0]), float(ranges[-1][1])) if ranges else None
    units = None
    if drift is not None:
        if not (math.isfinite(drift) and drift >= 0):
            raise ConfigError("drift", drift, "must be a finite number >= 0")
        units = drift * (value_range[1] - value_range[0]) if value_range is not None else drift
    report = EpochsReport(
        prefix=prefix,
        run_id=run_id,
        op="/".join(sorted(ops)),
        n=n,
        drift=drift,
        drift_units=units,
        value_range=value_range,
        epochs=[_entry(row, s, results) for row, s in found],
    )
    report.nodes = _node_series(attacked, n, units)
    return report


def _node_series(
    attacked: list[tuple[EpochRow, dict[str, Any]]], n: int, drift: float | None
) -> list[NodeSeries]:
    ks = [row.epoch for row, _ in attacked]
    bounds = [summary_intervals(s, n) for _, s in attacked]
    lo = np.array([b[0] for b in bounds]).reshape(len(ks), n)
    hi = np.array([b[1] for b in bounds]).reshape(len(ks), n)
    if drift is not None and ks:
        lo, hi = combine_intervals(ks, lo, hi, drift)
    series = []
    for i in range(n):
        exposed_in = [row.epoch for row, s in attacked if i in s.get("exposed", [])]
        combined: list[CombinedJson] = [
            {"epoch": k, "lower": _num(lo[e, i]), "upper": _num(hi[e, i])} for e, k in enumerate(ks)
        ]
        series.append(NodeSeries(i, exposed_in, combined, bool((lo[:, i] <= hi[:, i]).all())))
    return series
