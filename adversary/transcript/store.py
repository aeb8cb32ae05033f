"""The epoch store: every epoch of a continuous deployment captured into one folder, with bounded disk.

A continuous deployment with prefix ``P`` and run id ``R`` runs epoch k as an ordinary run of id
``e{k}`` under prefix ``P/R`` (topics ``P/R/e{k}/...``); each node publishes its output of every
epoch, retained, on ``P/R/results/{i}``. The store is a folder::

    DIR/epochs.sqlite   meta (prefix, run_id), one row per epoch (its state and summary),
                        and the nodes' published results
    DIR/e{k}.sqlite     epoch k's transcript: an ordinary one (run ``e{k}``, prefix ``P/R``)

One transcript per epoch, not an epoch column in one file: every tool that reads a transcript (the
attack, the dashboard, the nodes' acceptance rules, dedup, the guards on what a client may send)
works on an epoch unchanged, and dropping an epoch's raw messages deletes one file, which frees
its disk at once; deleting rows from one large file would need a ``VACUUM`` (a full rewrite, as
much free disk again, the capture stalled meanwhile) before the disk came back.

An epoch is ``open`` while it is captured, ``closed`` once its summary (the attack's report on
it: exposures, intervals, output) is stored, and ``pruned`` once its transcript is deleted
(:meth:`EpochStore.prune`, ``nlagg eavesdrop --keep-epochs N``); its summary stays, so the time
series is complete. The summary is written before the file is deleted: a crash between the two
leaves a file that the next prune deletes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from nlagg_node.errors import ConfigError
from nlagg_node.private import open_private, private_dir
from nlagg_node.runtime.wire import WireError, check_prefix, check_run_id

from .reader import connect_read_only, create_tables, settle

__all__ = ["STORE_FILE", "EpochRow", "EpochState", "EpochStore", "Result", "epoch_run_id", "is_epoch_store"]

STORE_FILE = "epochs.sqlite"
"""The store's own file inside its folder."""

MAX_EPOCH = 999_999_999
"""The largest epoch number the store accepts (``e{k}`` with at most 9 digits)."""

EPOCH_RE = re.compile(r"e(0|[1-9][0-9]{0,8})")

EpochState = Literal["open", "closed", "pruned"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS epochs (
    epoch INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    opened REAL NOT NULL,
    closed REAL,
    summary TEXT
);
CREATE TABLE IF NOT EXISTS results (
    epoch INTEGER NOT NULL,
    node INTEGER NOT NULL,
    output REAL NOT NULL,
    iterations INTEGER NOT NULL,
    time REAL NOT NULL,
    received REAL NOT NULL,
    PRIMARY KEY (epoch, node)
);
"""


def epoch_run_id(epoch: int) -> str:
    """The run id of epoch ``epoch`` under the deployment's prefix: ``e{k}``."""
    return f"e{epoch}"


def epoch_of(level: str) -> int | None:
    """The epoch a topic level ``e{k}`` names (None if it names none)."""
    return int(level[1:]) if EPOCH_RE.fullmatch(level) else None


def is_epoch_store(path: str | Path) -> bool:
    """Whether ``path`` is an epoch store's folder."""
    return (Path(path) / STORE_FILE).is_file()


@dataclass(frozen=True)
class EpochRow:
    """One epoch of the store: its state and, once closed, its summary (a JSON document)."""

    epoch: int
    state: EpochState
    opened: float
    closed: float | None
    summary: dict[str, Any] | None


@dataclass(frozen=True)
class Result:
    """A node's published output of one epoch (``P/R/results/{i}``)."""

    epoch: int
    node: int
    output: float
    iterations: int
    time: float


class EpochStore:
    """An epoch store's folder, opened for capture (created when missing) or read only.

    Parameters
    ----------
    folder : the store's folder.
    prefix, run_id : the deployment's; they must match what an existing store holds, and are read
        from it when None.
    read_only : never create or write anything (the attack, the dashboard).
    """

    def __init__(
        self,
        folder: str | Path,
        prefix: str | None = None,
        run_id: str | None = None,
        *,
        read_only: bool = False,
    ) -> None:
        self.folder = Path(folder)
        self.read_only = read_only
        if self.folder.exists() and not self.folder.is_dir():
            raise ConfigError("transcript", str(self.folder), "is a file; an epoch store is a folder")
        if read_only:
            if not is_epoch_store(self.folder):
                raise ConfigError("transcript", str(self.folder), f"not an epoch store: no {STORE_FILE}")
            self.db = connect_read_only(self.folder / STORE_FILE)
        else:
            private_dir(self.folder)  # 0700, its files 0600: the epochs' transcripts hold private values
            os.close(open_private(self.folder / STORE_FILE, os.O_RDWR))
            self.db = sqlite3.connect(self.folder / STORE_FILE, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            create_tables(self.db, SCHEMA)
        try:
            self.prefix, self.run_id = self._identity(prefix, run_id)
        except BaseException:
            self.db.close()
            raise

    def _identity(self, prefix: str | None, run_id: str | None) -> tuple[str, str]:
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        out: dict[str, str] = {}
        for key, given in (("prefix", prefix), ("run_id", run_id)):
            stored = meta.get(key)
            if stored is not None and given is not None and stored != given:
                raise ConfigError(key, given, f"{self.folder} holds the epochs of {key} {stored!r}")
            value = stored if stored is not None else given
            if value is None:
                raise ConfigError(key, None, f"{self.folder} holds no {key}; give it")
            try:
                out[key] = check_prefix(value) if key == "prefix" else check_run_id(value)
            except WireError as exc:
                raise ConfigError(key, value, str(exc)) from None
            if stored is None:
                self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))
        return out["prefix"], out["run_id"]

    @property
    def epoch_prefix(self) -> str:
        """The prefix of every epoch's topics: ``P/R`` (epoch k is run ``e{k}`` under it)."""
        return f"{self.prefix}/{self.run_id}"

    def transcript_path(self, epoch: int, *, rerun: bool = False) -> Path:
        """Epoch ``epoch``'s transcript file (it may be pruned, or not created yet); ``rerun``: the
        one of its cold rerun ``e{k}r`` (its warm run fell back), beside it."""
        return self.folder / f"{epoch_run_id(epoch)}{'r' if rerun else ''}.sqlite"

    # Reading ---------------------------------------------------------------------------------
    def epochs(self) -> list[EpochRow]:
        """Every epoch the store knows, ascending."""
        rows = self.db.execute("SELECT epoch, state, opened, closed, summary FROM epochs ORDER BY epoch")
        return [
            EpochRow(int(k), state, float(opened), closed, None if summary is None else json.loads(summary))
            for k, state, opened, closed, summary in rows
        ]

    def state(self, epoch: int) -> EpochState | None:
        row = self.db.execute("SELECT state FROM epochs WHERE epoch = ?", (epoch,)).fetchone()
        return None if row is None else row[0]

    def closed_count(self) -> int:
        """Epochs closed or pruned."""
        return int(self.db.execute("SELECT COUNT(*) FROM epochs WHERE state != 'open'").fetchone()[0])

    def result_count(self, epoch: int) -> int:
        """Results stored of epoch ``epoch``."""
        return int(self.db.execute("SELECT COUNT(*) FROM results WHERE epoch = ?", (epoch,)).fetchone()[0])

    def results(self, since: int = 0, until: int = MAX_EPOCH + 1) -> list[Result]:
        """The published results of the epochs ``since <= k < until`` (default: every one), by epoch
        then node (an index range: a deployment's months of results are not read for a few epochs)."""
        sql = (
            "SELECT epoch, node, output, iterations, time FROM results"
            " WHERE epoch >= ? AND epoch < ? ORDER BY epoch, node"
        )
        return [
            Result(int(k), int(i), float(o), int(it), float(t))
            for k, i, o, it, t in self.db.execute(sql, (since, until))
        ]

    # Writing ---------------------------------------------------------------------------------
    def open_epoch(self, epoch: int) -> None:
        """Record that epoch ``epoch`` is being captured (nothing changes when it is known)."""
        if not 0 <= epoch <= MAX_EPOCH:
            raise ConfigError("epoch", epoch, f"must lie in 0..{MAX_EPOCH}")
        self.db.execute(
            "INSERT OR IGNORE INTO epochs (epoch, state, opened) VALUES (?, 'open', ?)", (epoch, time.time())
        )

    def close_epoch(self, epoch: int, summary: dict[str, Any]) -> None:
        """Store epoch ``epoch``'s summary: it is closed (its transcript stays until pruned)."""
        self.db.execute(
            "UPDATE epochs SET state = 'closed', closed = ?, summary = ? WHERE epoch = ? AND state = 'open'",
            (time.time(), json.dumps(summary, allow_nan=False), epoch),
        )

    def prune(self, keep: int) -> list[int]:
        """Delete the transcripts of the closed epochs beyond the newest ``keep`` closed or pruned ones
        (their summaries stay); the epochs pruned now, ascending. Open epochs are never touched."""
        if keep < 0:
            raise ConfigError("keep_epochs", keep, "must be 0 or more")
        done = [r.epoch for r in self.epochs() if r.state != "open"]
        old = set(done[: max(0, len(done) - keep)])
        pruned = []
        for row in self.epochs():
            if row.epoch not in old:
                continue
            for path in self._files(row.epoch):
                path.unlink(missing_ok=True)  # an earlier prune may have died between two files
            if row.state == "closed":
                self.db.execute("UPDATE epochs SET state = 'pruned' WHERE epoch = ?", (row.epoch,))
                pruned.append(row.epoch)
        return pruned

    def _files(self, epoch: int) -> list[Path]:
        bases = (self.transcript_path(epoch), self.transcript_path(epoch, rerun=True))
        return [Path(f"{base}{end}") for base in bases for end in ("", "-wal", "-shm")]

    def add_result(self, result: Result, received: float | None = None) -> bool:
        """Store a node's published result; False when that node's result of that epoch is already
        stored (the first one is kept, as the transcript keeps the first message of a slot)."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO results (epoch, node, output, iterations, time, received)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                result.epoch,
                result.node,
                result.output,
                result.iterations,
                result.time,
                time.time() if received is None else received,
            ),
        )
        return cur.rowcount == 1

    def close(self) -> None:
        if not self.read_only:
            with contextlib.suppress(sqlite3.Error):
                settle(self.db)
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
