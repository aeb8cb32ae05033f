"""The dashboard of an epoch store: the live epoch as for one run, and the series over the epochs.

:class:`EpochDashboardState` follows the newest epoch whose transcript the store holds: a
:class:`~adversary.reporting.dashboard.state.DashboardState` of that file gives everything the
page shows of one run; when a newer epoch appears it moves on to it (the page then receives a
fresh snapshot, :data:`epoch` tells it apart). Beside it, every snapshot carries ``epochs``: per
epoch its output (the attack's, and the median the nodes published), its exposures, and per
node the first epoch it was exposed in (cumulative exposure), read from the store's summaries
(which stay when ``--keep-epochs`` deletes the raw transcripts) and, for the live epoch, from
the exposures found so far.
"""

from __future__ import annotations

import math
import statistics
import threading
from pathlib import Path
from typing import Any, Protocol

from nlagg_node.errors import ConfigError

from ...transcript.store import EpochRow, EpochStore, Result, is_epoch_store
from .state import DashboardState

__all__ = ["DashboardView", "EpochDashboardState", "open_state"]


class DashboardView(Protocol):
    """What the server needs of a dashboard's state (one run's, or an epoch store's)."""

    version: int
    more: bool
    finished: bool
    run_id: str

    @property
    def verdicts_due(self) -> bool: ...

    def poll(self) -> bool: ...

    def compute_verdicts(self) -> None: ...

    def set_truth(self, summary: dict[str, Any]) -> None: ...

    def nodes_at(self, t: int) -> dict[str, Any]: ...

    def snapshot(
        self, columns_from: int = 0, exposures_from: int = 0, *, graph: bool = True
    ) -> dict[str, Any]: ...

    def close(self) -> None: ...


def open_state(path: str | Path, truth: dict[str, Any] | None = None) -> DashboardView:
    """The state of ``path``: an epoch store's folder, or one run's transcript."""
    if is_epoch_store(path):
        return EpochDashboardState(path)
    return DashboardState(path, truth=truth)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


class EpochDashboardState:
    """The dashboard's model of an epoch store (growing, or finished). See the module notes."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.store = EpochStore(self.folder, read_only=True)
        self.run_id = f"{self.store.prefix}/{self.store.run_id}"
        self.lock = threading.Lock()
        self.version = 0
        self.more = False
        self.finished = False
        self.epoch: int | None = None
        self.inner: DashboardState | None = None
        self._seen: tuple[object, ...] = ()
        self._rows: list[EpochRow] = []
        self._results: list[Result] = []

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self.store.close()

    @property
    def verdicts_due(self) -> bool:
        return self.inner is not None and self.inner.verdicts_due

    def compute_verdicts(self) -> None:
        if self.inner is not None:
            self.inner.compute_verdicts()

    def set_truth(self, summary: dict[str, Any]) -> None:
        """Ground truth belongs to one epoch's run: the store's epochs are shown without it."""

    def poll(self) -> bool:
        """Read what is new in the store and in the live epoch's transcript; True when anything changed."""
        with self.lock:
            changed = self._read_store()
        inner = self.inner
        if inner is not None and inner.poll():
            changed = True
        with self.lock:
            self.more = inner is not None and inner.more
            self.finished = inner is not None and inner.finished
            if changed:
                self.version += 1
        return changed

    def _read_store(self) -> bool:
        """Reload the epochs when the store changed; move on to a newer epoch's transcript."""
        seen = tuple(
            self.store.db.execute(
                "SELECT COUNT(*), MAX(epoch), SUM(state = 'open'), SUM(state = 'closed'),"
                " (SELECT COUNT(*) FROM results) FROM epochs"
            ).fetchone()
        )
        if seen == self._seen:
            return False
        self._seen = seen
        self._rows = self.store.epochs()
        self._results = self.store.results()
        live = [r.epoch for r in self._rows if self.store.transcript_path(r.epoch).is_file()]
        if live and live[-1] != self.epoch:
            try:
                inner = DashboardState(self.store.transcript_path(live[-1]))
            except ConfigError:  # created a moment ago, not a transcript yet: the next poll
                self._seen = ()
                return False
            if self.inner is not None:
                self.inner.close()
            self.inner, self.epoch = inner, live[-1]
        return True

    def nodes_at(self, t: int) -> dict[str, Any]:
        if self.inner is None:
            return {"t": -1, "nodes": []}
        return self.inner.nodes_at(t)

    def snapshot(
        self, columns_from: int = 0, exposures_from: int = 0, *, graph: bool = True
    ) -> dict[str, Any]:
        """The live epoch's snapshot (as for one run), with ``epoch`` and the ``epochs`` series."""
        inner = self.inner
        if inner is None:
            doc: dict[str, Any] = {
                "run_id": self.run_id,
                "messages": 0,
                "rejected": 0,
                "t": -1,
                "finished": False,
                "done": 0,
                "early_stop": False,
                "ran": None,
            }
        else:
            doc = inner.snapshot(columns_from, exposures_from, graph=graph)
            doc["run_id"] = f"{self.run_id}, epoch {self.epoch}"
        with self.lock:
            doc["version"] = self.version
            doc["epoch"] = self.epoch
            doc["epochs"] = self._series(inner)
        return doc

    def _series(self, inner: DashboardState | None) -> dict[str, Any]:
        """Per epoch: output, published output, exposures; per node the first epoch it was exposed in."""
        series: list[dict[str, Any]] = []
        first: dict[int, int] = {}
        n = 0
        outputs: dict[int, list[float]] = {}
        for r in self._results:  # once, not per epoch: months of epochs hold millions of results
            outputs.setdefault(r.epoch, []).append(r.output)
        for row in self._rows:
            summary = row.summary or {}
            exposed = [int(i) for i in summary.get("exposed", [])]
            output = _num(summary.get("output"))
            if row.epoch == self.epoch and row.summary is None and inner is not None:
                exposed = sorted({e.node for e in inner.exposures if e.node not in inner.corrupted})
                output = _num(inner.output)
            outs = outputs.get(row.epoch)
            published = statistics.median(outs) if outs else None
            series.append(
                {
                    "epoch": row.epoch,
                    "state": row.state,
                    "output": output,
                    "published": published,
                    "exposed": exposed,
                }
            )
            n = max(n, int(summary.get("n", 0)))
            for i in exposed:
                first.setdefault(i, row.epoch)
        if inner is not None and inner.replay is not None:
            n = max(n, inner.replay.n)
        return {"n": n, "series": series, "cumulative": {str(i): k for i, k in sorted(first.items())}}
