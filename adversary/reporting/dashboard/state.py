"""What the dashboard shows, read from a transcript file incrementally, by rowid.

:class:`DashboardState` opens the transcript read-only and, on each :meth:`~DashboardState.poll`,
reads only the rows after the last one it has seen (``WHERE id > ?`` on the integer primary
key: O(new messages), never O(all)). The rows feed the same :class:`~adversary.live.LiveReplay`
the eavesdropper runs, so an exposure appears on the page the moment the iteration that reveals
it is complete. Trajectories are kept server-side and sent as at most ``max_columns`` sampled
iterations (every ``ceil(T / max_columns)``-th, plus the last), so a page's payload is bounded by
``n * max_columns`` numbers whatever the number of messages.

Once every node has published ``done`` (and the transcript holds every x, of the iterations run
when the run stopped early, or ``done_grace`` seconds have passed),
:func:`adversary.attack.attack_arrays` runs once on the whole transcript: it gives every node's
final finding (exposed value, or the interval the transcript proves). With the ground truth at
hand (a testbed's ``summary.json``), :func:`adversary.report.leakage_verdicts` then puts each node
beside the ideal-world bound of its rank. :meth:`DashboardState.nodes_at` gives the findings as of
any earlier iteration (the attack on the transcript cut there), for the
page's time slider.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from nlagg_node.departure import announced
from nlagg_node.errors import ConfigError, WireError
from nlagg_node.protocol import RunShape
from nlagg_node.runtime.public import config_from_msg
from nlagg_node.runtime.wire import ConfigMsg, decode
from nlagg_node.schedule import phase_c, plan_phases
from nlagg_node.valuemap import ValueScale, scale_for
from nlagg_node.verdict import output_holders

from ...attack import Halted, NodeFinding, attack_arrays
from ...live import BRANCH_NAMES, Exposure, Exposures, LiveReplay, iterations_run
from ...rules import PhaseEnds
from ...transcript.reader import certified_finals, connect_read_only

__all__ = ["DashboardState", "graph_positions"]

CHUNK = 100_000
"""Rows read per query while catching up on a large transcript (the lock is released in between)."""


def _num(v: float | None) -> float | None:
    """A JSON-safe number, exact (None for NaN and for an unbounded side, +-inf)."""
    if v is None or not math.isfinite(v):
        return None
    return float(v)


def _short(v: float) -> float | None:
    """A trajectory point for the chart: 6 significant digits are plenty (None where missing)."""
    return float(f"{v:.6g}") if math.isfinite(v) else None


def graph_positions(n: int, edges: NDArray[np.int64]) -> list[list[float]]:
    """Node coordinates in [0, 1]^2: a seeded networkx spring layout of the public graph.

    The public config carries the edges but no coordinates (an RGG's positions come from the
    run's private seed), so the page draws a layout of the graph itself.
    """
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((int(a), int(b)) for a, b in edges)
    pos = nx.spring_layout(g, seed=0, iterations=100 if n <= 500 else 30)
    xy = np.array([pos[i] for i in range(n)], dtype=np.float64)
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    xy = (xy - lo) / np.where(hi - lo > 0, hi - lo, 1.0)
    return [[round(float(a), 4), round(float(b), 4)] for a, b in xy]


class DashboardState:
    """The dashboard's model of one (growing or finished) transcript.

    Parameters
    ----------
    path : the transcript (SQLite); opened read-only, never written.
    max_columns : most sampled iterations of the trajectories a page receives.
    truth : a testbed ``summary.json`` document (private values) for the leakage-vs-bound table;
        by default the ``summary.json`` next to the transcript, when it is of the same run.
    done_grace : seconds to wait, once every node is done, for x's still missing before finishing.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_columns: int = 400,
        truth: dict[str, Any] | None = None,
        done_grace: float = 10.0,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError("transcript", str(self.path), "no such file")
        if max_columns < 2:
            raise ConfigError("max_columns", max_columns, "must be at least 2")
        self.db = connect_read_only(self.path)  # leaves no -wal/-shm beside a finished transcript
        try:
            meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise ConfigError("transcript", str(self.path), f"not a transcript ({exc})") from None
        if "run_id" not in meta:
            raise ConfigError("transcript", str(self.path), "not a transcript (no run id)")
        self.run_id = str(meta["run_id"])
        self.prefix = str(meta.get("prefix", "nlagg"))
        self.max_columns = max_columns
        self.done_grace = done_grace
        self.lock = threading.Lock()
        self.version = 0
        self.more = False
        self.last_id = 0
        self.rejected = 0
        self.config: ConfigMsg | None = None
        self.replay: LiveReplay | None = None
        self.edges: NDArray[np.int64] = np.zeros((0, 2), dtype=np.int64)
        self.positions: list[list[float]] = []
        self.sample_t: list[int] = []
        self.columns: list[list[float | None]] = []
        self.corrupted: dict[int, float] = {}  # forwarded values, on the protocol's scale
        self.scale = ValueScale()  # the run's public value range: what the page shows is in user units
        self.status: dict[int, str] = {}
        self.early_stop = False  # the run's, once its config is read
        self.ran: int | None = None  # iterations run by a finished run that stopped early
        self.exposures: list[Exposure] = []
        self.finished = False
        self.findings: list[NodeFinding] | None = None
        self.output: float | None = None
        self.verdicts: list[dict[str, Any]] | None = None
        self.bound_method = ""
        self.truth = truth if truth is not None else self._truth_beside()
        self._early_x: list[tuple[int, int, float]] = []
        self._stops: list[tuple[int, int, int, list[int] | None]] = []  # x's with a stop, not yet fed
        self._follow_stops = True  # whether components may stop apart (the config says; True before)
        self._departed: dict[int, int] = {}  # departures the statuses announced
        self._early_z0: list[tuple[str, int, int, float]] = []
        self._all_done_since: float | None = None
        self._at_cache: OrderedDict[tuple[int, int], list[dict[str, Any]]] = OrderedDict()

    def close(self) -> None:
        self.db.close()

    def _truth_beside(self) -> dict[str, Any] | None:
        """A testbed's ``summary.json`` or a simulation's ``<name>.truth.json`` of this very run."""
        beside = (self.path.with_name("summary.json"), self.path.with_name(self.path.name + ".truth.json"))
        for cand in beside:
            if cand.is_file():
                doc: dict[str, Any] = json.loads(cand.read_text())
                if doc.get("run_id") == self.run_id and "private_values" in doc:
                    return doc
        return None

    def set_truth(self, summary: dict[str, Any]) -> None:
        """Give the ground truth later (the testbed has it once its run is over)."""
        with self.lock:
            self.truth = summary

    # Reading ----------------------------------------------------------------------------------
    def poll(self) -> bool:
        """Read up to :data:`CHUNK` new rows and advance; True when anything changed.

        :attr:`more` tells whether the transcript holds further rows already (a reader catching
        up calls again at once). Blocking (SQLite, numpy): the server calls it in a worker thread.
        """
        with self.lock:
            # The payloads of the statuses (departures) and, where components may stop apart
            # (may_depart), of the x's that carry a stop iteration.
            if self.config is None:
                self._follow_stops = self._stops_may_matter()
            payload = (
                "CASE WHEN valid = 1 AND (kind = 'status' OR (kind = 'x' AND"
                " instr(payload, CAST('\"stop\":' AS BLOB)) > 0)) THEN payload END"
                if self._follow_stops
                else "CASE WHEN kind = 'status' AND valid = 1 THEN id END"  # fetched below, if any
            )
            rows = self.db.execute(
                f"SELECT id, valid, kind, node, peer, t, phase, value, {payload}"
                " FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                (self.last_id, CHUNK),
            ).fetchall()
            if not self._follow_stops:
                rows = self._with_status_payloads(rows)
            if rows:
                self._ingest(rows)
            self.more = len(rows) == CHUNK
            changed = self._progress() or bool(rows)
            if changed:
                self.version += 1
            return changed

    def _stops_may_matter(self) -> bool:
        """Before the config is read: whether the transcript's first valid config (or none yet) may
        let components stop apart (early stopping with ``may_depart``)."""
        row = self.db.execute(
            "SELECT payload FROM messages WHERE kind = 'config' AND valid = 1 ORDER BY id LIMIT 1"
        ).fetchone()
        if row is None:
            return True  # not known yet: keep what the x's say
        try:
            run = json.loads(bytes(row[0])).get("run", {})
        except ValueError:
            return True
        return bool(run.get("early_stop", False) and run.get("may_depart", False))

    def _with_status_payloads(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """``rows`` whose last column holds a valid status's id: that column becomes its payload."""
        ids = [r[8] for r in rows if r[8] is not None]
        if not ids:
            return rows
        found: dict[int, bytes] = {}
        for start in range(0, len(ids), 500):  # SQLite's bound on the number of parameters
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))
            found.update(self.db.execute(f"SELECT id, payload FROM messages WHERE id IN ({marks})", part))
        return [r if r[8] is None else (*r[:8], found.get(r[8])) for r in rows]

    @property
    def verdicts_due(self) -> bool:
        """Whether :meth:`compute_verdicts` has work: the run is over and the truth is at hand."""
        return self.finished and self.truth is not None and self.verdicts is None

    def _ingest(self, rows: list[tuple[Any, ...]]) -> None:
        self.last_id = int(rows[-1][0])
        xs: list[tuple[int, int, float]] = []
        for _id, valid, kind, node, peer, t, phase, value, payload in rows:
            if not valid:
                self.rejected += 1
            elif kind == "x":
                xs.append((node, t, value))
                if payload is not None:  # it carries a stop iteration (early stopping)
                    doc = json.loads(bytes(payload))
                    self._stops.append((int(node), int(t), int(doc["stop"]), doc.get("departures")))
            elif kind == "z0":
                if self.replay is not None:
                    self.replay.set_z0(str(phase), int(node), int(peer), float(value))
                else:
                    self._early_z0.append((str(phase), int(node), int(peer), float(value)))
            elif kind == "adv":
                self.corrupted.setdefault(int(node), float(value))
            elif kind == "status":
                if self.status.get(int(node)) != "done":
                    self.status[int(node)] = str(phase)
                if payload is not None:
                    told = json.loads(bytes(payload)).get("departed")
                    self._departed.update(announced([told]) if isinstance(told, dict) else {})
            elif kind == "config" and self.config is None:
                self._on_config(int(_id))
        if self.replay is None:
            self._early_x += xs
        elif xs:
            arr = np.array(xs, dtype=np.float64)
            self.replay.add_xs(arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2])
        self._feed_stops()

    def _feed_stops(self) -> None:
        """Departures and the x's stop fields tell the replay whom not to wait for (once it exists)."""
        if self.replay is None:
            return
        for j, at in sorted(self._departed.items(), key=lambda kv: kv[1]):
            if j not in self.replay.departed:
                self.replay.depart(j, at)
        if self.replay.ends is not None:
            for i, t, stop, deps in self._stops:
                self.replay.ends.note(i, t, stop, deps)
        self._stops = []

    def _on_config(self, row_id: int) -> None:
        topic, payload = self.db.execute(
            "SELECT topic, payload FROM messages WHERE id = ?", (row_id,)
        ).fetchone()
        try:
            _, msg = decode(str(topic), bytes(payload), self.prefix, self.run_id)
        except WireError:
            return
        if not isinstance(msg, ConfigMsg):
            return
        cfg, edges = config_from_msg(msg)
        phases = plan_phases(cfg)
        self.scale = scale_for(cfg)
        self.config = msg
        self.edges = edges
        self.early_stop = cfg.early_stop
        self._follow_stops = cfg.early_stop and cfg.may_depart
        ends = PhaseEnds(RunShape(cfg, edges)) if self._follow_stops else None  # fed from the x's stops
        self.replay = LiveReplay(
            cfg.n, edges, phases, [phase_c(cfg, p) for p in phases], cfg.theta, ends=ends
        )
        if not self._follow_stops:  # a phase ends for all at once: nothing at t and the next one begun
            self._stops = []
        t_total = self.replay.t_total
        stride = max(1, math.ceil(t_total / (self.max_columns - 1)))
        self.sample_t = list(range(0, t_total, stride))
        if self.sample_t[-1] != t_total - 1:
            self.sample_t.append(t_total - 1)
        self.positions = graph_positions(cfg.n, edges)
        for group, i, j, z in self._early_z0:
            self.replay.set_z0(group, i, j, z)
        if self._early_x:
            arr = np.array(self._early_x, dtype=np.float64)
            self.replay.add_xs(arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2])
        self._early_x, self._early_z0 = [], []

    def _progress(self) -> bool:
        """Advance the replay, sample new trajectory columns, finish when every node is done."""
        replay = self.replay
        if replay is None or self.finished:
            return False
        before = (replay.t_next, len(self.exposures))
        self.exposures += self._user_units(replay.advance())
        if len(self.transcript_done() | set(replay.departed)) == replay.n:  # every node done, or departed
            now = time.monotonic()
            self._all_done_since = self._all_done_since or now
            # A run that stopped early ends before t_total: once every node is done, its x's are in.
            stopped = self.early_stop and not np.isfinite(replay.x[:, replay.t_next :]).any()
            if replay.t_next >= replay.t_total or stopped or now - self._all_done_since >= self.done_grace:
                if not stopped:  # step what is left, the missing x's unknown
                    self.exposures += self._user_units(replay.advance(force=True))
                self._finish()
        while len(self.columns) < len(self.sample_t) and self.sample_t[len(self.columns)] < replay.t_next:
            col = self.scale.to_user(replay.x[:, self.sample_t[len(self.columns)]])
            self.columns.append([_short(float(v)) for v in col])
        return self.finished or (replay.t_next, len(self.exposures)) != before

    def _user_units(self, found: list[Exposure]) -> list[Exposure]:
        """Exposures found on the wire's scale, in the user's units (:mod:`nlagg_node.valuechecks`)."""
        return [replace(e, value=self.scale.user_float(e.value)) for e in found]

    def transcript_done(self) -> set[int]:
        n = self.replay.n if self.replay is not None else 0
        return {i for i, s in self.status.items() if s == "done" and 0 <= i < n}

    def _attack(self, t_len: int) -> tuple[list[NodeFinding], float | None]:
        replay = self.replay
        assert replay is not None
        assert self.config is not None
        cfg, _ = config_from_msg(self.config)
        report = attack_arrays(
            replay.n,
            self.edges,
            replay.phases,
            replay.cs,
            replay.theta,
            replay.z0,
            replay.x[:, :t_len],
            op=cfg.op,
            epsilon=cfg.epsilon,
            corrupted={i: self.scale.user_float(v) for i, v in self.corrupted.items()},
            replayed=Exposures(replay.branch, replay.first, replay.value),
            departed=dict(replay.departed),
            scale=self.scale,
            early_stop=cfg.early_stop,
            halted=Halted(
                replay.ends.by_phase if replay.ends is not None else None,
                certified_finals(self.db, replay.n, t_len, RunShape(cfg, self.edges).reach)
                if cfg.certified
                else None,
            ),
        )
        return report.findings, report.output

    def _finish(self) -> None:
        replay = self.replay
        assert replay is not None
        self.finished = True
        self.findings, self.output = self._attack(replay.t_next)
        if self.early_stop:  # the iterations the run ran, its phases each up to where it stopped
            self.ran = len(iterations_run(replay.phases, replay.x[:, : replay.t_next]))

    def compute_verdicts(self) -> None:
        """Each node beside its ideal-world bound (a Monte Carlo: seconds; the lock is not held)."""
        from ...report import leakage_verdicts

        with self.lock:
            truth, findings, config = self.truth, self.findings, self.config
        assert truth is not None
        assert findings is not None
        assert config is not None
        cfg, edges = config_from_msg(config)
        values = np.array([float(truth["private_values"][str(i)]) for i in range(cfg.n)])
        try:
            rows, bound = leakage_verdicts(cfg, findings, values, sorted(self.corrupted), edges)
        except ConfigError as exc:  # an operator without an ideal-world bound (average)
            with self.lock:
                self.verdicts, self.bound_method = [], str(exc)
                self.version += 1
            return
        with self.lock:
            self.verdicts = [{k: _num(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows]
            self.bound_method = bound.method
            self.version += 1

    # Views ------------------------------------------------------------------------------------
    @property
    def t(self) -> int:
        """The latest iteration whose every x is in (the one the page shows live); -1 before any."""
        return (self.replay.t_next - 1) if self.replay is not None else -1

    def _node_views(self, findings: list[NodeFinding] | None, t: int) -> list[dict[str, Any]]:
        replay = self.replay
        if replay is None:
            return []
        out = []
        exposed = {f.node: f.distance for f in findings or [] if f.status == "exposed"}
        op = str(self.config.run.get("op", "")) if self.config is not None else ""
        holders = output_holders(op, exposed, self.scale.span)  # the one rule of nlagg_node.verdict
        for i in range(replay.n):
            view: dict[str, Any] = {"node": i, "run": self.status.get(i, "-")}
            if 0 <= t < replay.t_total:
                view["branch"] = BRANCH_NAMES[int(replay.branch[i, t])]
            f = findings[i] if findings is not None else None
            if i in self.corrupted:
                view.update(state="corrupted", value=_num(self.scale.user_float(self.corrupted[i])))
            elif f is not None and f.status == "exposed":
                view.update(state="exposed", value=_num(f.value), t=f.t, how=f.how, unavoidable=i in holders)
            elif f is None and 0 <= replay.first[i] <= t:
                value = self.scale.user_float(float(replay.value[i]))
                view.update(state="exposed", value=_num(value), t=int(replay.first[i]))
            elif f is not None and (math.isfinite(f.lower) or math.isfinite(f.upper)):
                view.update(state="interval", lower=_num(f.lower), upper=_num(f.upper))
            else:
                view["state"] = "honest"
            out.append(view)
        return out

    def nodes_at(self, t: int) -> dict[str, Any]:
        """Every node's state as the transcript up to iteration ``t`` proves it (the time slider)."""
        with self.lock:
            replay = self.replay
            if replay is None:
                return {"t": -1, "nodes": []}
            t = max(-1, min(int(t), self.t))
            if t == self.t and self.finished:
                return {"t": t, "nodes": self._node_views(self.findings, t), "output": _num(self.output)}
            key = (t, len(self.corrupted))  # a corrupted node's state may arrive late
            if key not in self._at_cache:
                findings, _ = self._attack(t + 1) if t >= 0 else (None, None)
                self._at_cache[key] = self._node_views(findings, t)
                while len(self._at_cache) > 64:
                    self._at_cache.popitem(last=False)
            return {"t": t, "nodes": self._at_cache[key]}

    def snapshot(
        self, columns_from: int = 0, exposures_from: int = 0, *, graph: bool = True
    ) -> dict[str, Any]:
        """The page's state: everything (``graph``) or what a client lacks (``*_from`` cursors)."""
        with self.lock:
            cfg = self.config
            doc: dict[str, Any] = {
                "run_id": self.run_id,
                "version": self.version,
                "messages": self.last_id,
                "rejected": self.rejected,
                "t": self.t,
                "finished": self.finished,
                "done": len(self.transcript_done()),
                "early_stop": self.early_stop,
                "ran": self.ran,
            }
            if cfg is None:
                return doc
            if graph:
                doc["config"] = {
                    "n": cfg.n,
                    "op": cfg.run.get("op"),
                    "graph": cfg.run.get("graph"),
                    "phases": [[p["name"], p["t_len"]] for p in cfg.phases],
                    "t_total": self.replay.t_total if self.replay is not None else 0,
                    "sample_t": self.sample_t,
                }
                doc["positions"] = self.positions
                doc["edges"] = [[int(a), int(b)] for a, b in self.edges]
            doc["columns_from"] = columns_from
            doc["columns"] = self.columns[columns_from:]
            honest = [e for e in self.exposures if e.node not in self.corrupted]
            doc["exposures_from"] = exposures_from
            doc["exposures"] = [
                {"node": e.node, "t": e.t, "value": _num(e.value), "how": e.how}
                for e in honest[exposures_from:]
            ]
            doc["nodes"] = self._node_views(self.findings if self.finished else None, self.t)
            doc["output"] = _num(self.output)
            doc["verdicts"] = self.verdicts
            doc["bound_method"] = self.bound_method
            doc["truth"] = self.truth is not None
            return doc
