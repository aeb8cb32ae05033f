"""The transcript's SQLite file: its schema, how it is opened and checked, and the read side.

One row per distinct message (see :mod:`adversary.transcript.writer` for what is stored and how it is
judged): topic, raw payload, receive time, whether the broker flagged it retained, and the parsed
fields (kind, node, peer, t, phase, value; ``valid = 0`` with the error otherwise). ``dedup`` is a
digest of topic + payload. The index is on ``(kind, t)``: the rows of one commit share the last
pages of the index instead of one page per node.

:class:`TranscriptReader` gives what the analysis needs: the public config, z^(0) per directed
edge (EdgeLayout order, like :attr:`nlagg_node.sim.SimResult.z0`), x as an ``(n, T)`` array with
NaN where nothing was captured, the corrupted nodes' forwarded states, and the final statuses.
The writer, :class:`adversary.transcript.writer.Transcript`, is a reader that also captures.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
from numpy.typing import NDArray

from nlagg_node.arrays import FloatArray
from nlagg_node.errors import ConfigError
from nlagg_node.graphs import EdgeLayout
from nlagg_node.runtime.wire import (
    AdvStateMsg,
    ConfigMsg,
    SealedZ0Msg,
    StatusMsg,
    TopicInfo,
    WireMessage,
    XMsg,
    Z0Msg,
    decode,
)
from nlagg_node.schedule import Phase
from nlagg_node.termination import halts

from ..spans import node_ends, node_iterations_run

__all__ = [
    "MAX_INVALID_PAYLOAD",
    "META_SCHEMA",
    "NO_FIELDS",
    "SCHEMA",
    "TranscriptReader",
    "captured_count",
    "certified_finals",
    "check_tables",
    "connect_read_only",
    "create_tables",
    "row_fields",
]

MAX_INVALID_PAYLOAD = 4096  # bytes kept of a payload that is not protocol v1 (the digest covers it all)


META_SCHEMA = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
"""The key/value table every capture file keeps (its run id and prefix; a transcript's ``source``
and ``dropped``), a transcript's and an epoch store's alike: see :func:`create_tables`."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    received REAL NOT NULL,
    retained INTEGER NOT NULL DEFAULT 0,
    valid INTEGER NOT NULL,
    error TEXT,
    kind TEXT,
    node INTEGER,
    peer INTEGER,
    t INTEGER,
    phase TEXT,
    value REAL,
    dedup TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_kind_t ON messages (kind, t);
"""


def create_tables(db: sqlite3.Connection, schema: str) -> None:
    """Create a capture file's tables: the :data:`META_SCHEMA` table and ``schema``'s own (a
    transcript's :data:`SCHEMA`, an epoch store's :data:`adversary.transcript.store.SCHEMA`)."""
    db.executescript(META_SCHEMA + schema)


NO_FIELDS = (None, None, None, None, None, None)  # kind, node, peer, t, phase, value of an invalid row


def row_fields(info: TopicInfo, msg: WireMessage) -> tuple[int | None, str | None, float | None]:
    if isinstance(msg, XMsg):
        return msg.t, msg.phase, msg.x
    if isinstance(msg, Z0Msg):
        return None, msg.group, msg.z
    if isinstance(msg, SealedZ0Msg):
        return None, msg.group, None  # the value is sealed: the eavesdropper stores the ciphertext only
    if isinstance(msg, AdvStateMsg):
        return msg.t, None, msg.s
    if isinstance(msg, StatusMsg):
        return msg.iterations, msg.state, None
    return None, None, None


_COLUMNS = {
    "meta": {"key", "value"},
    "messages": {"topic", "payload", "valid", "kind", "node", "peer", "t", "phase", "value", "dedup"},
}


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write ``path`` nor leave files beside it.

    With no ``-wal`` file next to it no writer is attached (the eavesdropper keeps one while it
    captures), so the file is read as immutable: SQLite then creates no ``-shm``/``-wal`` either.
    A live transcript is read through ``mode=ro``, which sees the writer's WAL.
    """
    from urllib.parse import quote

    base = "file:" + quote(str(path.resolve())) + "?mode=ro"
    live = Path(str(path) + "-wal").exists()
    tries = (base, base + "&immutable=1") if live else (base + "&immutable=1",)
    last: sqlite3.Error | None = None
    for uri in tries:
        db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.DatabaseError as exc:
            db.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise ConfigError(
                    "transcript", str(path), f"not a transcript: not an SQLite file ({exc})"
                ) from None
            last = exc
    raise ConfigError("transcript", str(path), f"cannot open it read-only ({last})")


def settle(db: sqlite3.Connection) -> None:
    """Make the file self-contained before ``db`` closes: move the WAL into it and, when no other
    connection reads it, leave WAL mode (SQLite then deletes ``-wal`` and ``-shm``). Without this,
    a reader still attached at the writer's close (a dashboard) keeps the WAL alive, and the main
    file alone (copied, or opened immutable) misses the messages in it. A no-op for a reader."""
    with contextlib.suppress(sqlite3.Error):
        db.execute("PRAGMA busy_timeout = 0")  # another reader attached: do not wait for it
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            return
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE")


def settle_file(path: Path) -> None:
    """:func:`settle` the transcript at ``path`` once its writer and readers are gone (if it exists)."""
    if not path.is_file():
        return
    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(path)) as db:
        settle(db)


def check_tables(db: sqlite3.Connection, path: Path, *, allow_empty: bool) -> None:
    """Refuse a file that is not a transcript, naming what is missing (an empty database is fine
    for the writer, which creates the tables)."""
    try:
        tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise ConfigError("transcript", str(path), f"not a transcript: not an SQLite file ({exc})") from None
    if allow_empty and not tables:
        return
    for table, wanted in _COLUMNS.items():
        if table not in tables:
            raise ConfigError("transcript", str(path), f"not an nlagg transcript: no table '{table}'")
        have = {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}
        lacking = sorted(wanted - have)
        if lacking:
            raise ConfigError(
                "transcript",
                str(path),
                f"not an nlagg transcript: table '{table}' has no column '{lacking[0]}'",
            )


class TranscriptReader:
    """Queries over an open transcript database (``db``) of run ``run_id`` under ``prefix``.

    Every query commits first (:meth:`commit`; a reader has nothing buffered, the writer
    overrides it), so a writer's queries see every message it added.
    """

    path: Path
    db: sqlite3.Connection
    run_id: str
    prefix: str

    def commit(self) -> None:
        """Write what is buffered (nothing, for a reader)."""

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        """Run a read query; rows still buffered by the writer are committed first, so they count."""
        self.commit()
        return self.db.execute(sql, params)

    def close(self) -> None:
        self.commit()
        settle(self.db)
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def complete(
        self,
        n: int,
        t_total: int,
        edges: list[list[int]],
        groups: set[str],
        *,
        early_stop: bool = False,
        phases: Sequence[Phase] | None = None,
        departed: Mapping[int, int] | None = None,
        known: Sequence[Mapping[int, int]] | None = None,
    ) -> tuple[int, int]:
        """Missing ``(x, z0)`` of a run: x_i^(t) for i < n, t < t_total, and z_{i|j}^(0) for both
        directions of every edge and every dual group. Valid-looking messages outside the run
        (another node, group or edge) do not count. With ``early_stop`` the phases may end early,
        so only the iterations of which some x was captured are expected; given the run's
        ``phases`` (and its ``departed`` nodes), only each node's own: those of its phases up to
        where it stopped: where the x it halted with says (``known``, the transcript's record
        :attr:`adversary.rules.PhaseEnds.by_phase`), else where its connected component stopped
        (:func:`adversary.spans.node_ends`), a departed node's up to its departure."""
        if early_stop and phases is not None:
            x = self.x(n, t_total)
            pairs = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
            ends = node_ends(phases, x, pairs, departed, known)
            expected_x = int(node_iterations_run(phases, x, ends).sum())
            return expected_x - int(np.isfinite(x).sum()), self._missing_z0(edges, groups)
        if early_stop:
            t_total_seen = self._query(
                "SELECT COUNT(DISTINCT t) FROM messages"
                " WHERE valid = 1 AND kind = 'x' AND node < ? AND t < ?",
                (n, t_total),
            ).fetchone()[0]
        xs = self._query(
            "SELECT COUNT(*) FROM (SELECT DISTINCT node, t FROM messages WHERE valid = 1 AND kind = 'x'"
            " AND node < ? AND t < ?)",
            (n, t_total),
        ).fetchone()[0]
        expected = n * (int(t_total_seen) if early_stop else t_total)
        return expected - int(xs), self._missing_z0(edges, groups)

    def _missing_z0(self, edges: list[list[int]], groups: set[str]) -> int:
        wanted = {(a, b) for a, b in edges} | {(b, a) for a, b in edges}
        z0 = {
            (int(i), int(j), str(g))
            for i, j, g in self._query(
                "SELECT DISTINCT node, peer, phase FROM messages WHERE valid = 1 AND kind = 'z0'"
            )
            if (int(i), int(j)) in wanted and g in groups
        }
        return len(wanted) * len(groups) - len(z0)

    def missing_adv(self, n: int, t_total: int) -> int:
        """Adversary states missing of the corrupted nodes (those that forwarded any): every
        iteration of which a node's x was captured must have its state too."""
        row = self._query(
            "SELECT COUNT(*) FROM (SELECT DISTINCT node, t FROM messages WHERE valid = 1 AND kind = 'x'"
            " AND node < ? AND t < ? AND node IN (SELECT node FROM messages WHERE valid = 1 AND kind = 'adv')"
            " EXCEPT SELECT DISTINCT node, t FROM messages WHERE valid = 1 AND kind = 'adv')",
            (n, t_total),
        ).fetchone()
        return int(row[0])

    def done_nodes(self) -> set[int]:
        """Nodes of which a valid ``done`` status was captured."""
        rows = self._query(
            "SELECT DISTINCT node FROM messages WHERE valid = 1 AND kind = 'status' AND phase = 'done'"
        )
        return {int(r[0]) for r in rows}

    def count(self, *, valid_only: bool = False) -> int:
        """Number of stored (distinct) messages."""
        sql = "SELECT COUNT(*) FROM messages" + (" WHERE valid = 1" if valid_only else "")
        return int(self._query(sql).fetchone()[0])

    def valid_counts(self, z0_groups: Iterable[str]) -> dict[str, int]:
        """Valid rows per kind: every x and forwarded state, and the z^(0) of ``z0_groups`` only.

        A well-formed z^(0) of a group the run does not have is injected junk, not the run's.
        """
        groups = sorted(set(z0_groups))
        marks = ",".join("?" * len(groups))
        rows = self._query(
            "SELECT kind, COUNT(*) FROM messages WHERE valid = 1 AND (kind IN ('x', 'adv')"
            f" OR (kind = 'z0' AND phase IN ({marks}))) GROUP BY kind",
            tuple(groups),
        )
        return {str(kind): int(count) for kind, count in rows}

    def rejected(self) -> list[tuple[str, str]]:
        """``(topic, error)`` of every stored message that is not valid protocol v1."""
        return [(str(a), str(b)) for a, b in self._query("SELECT topic, error FROM messages WHERE valid = 0")]

    def _payloads(self, kind: str) -> list[tuple[str, bytes]]:
        sql = "SELECT topic, payload FROM messages WHERE valid = 1 AND kind = ? ORDER BY id"
        rows = self._query(sql, (kind,))
        return [(str(t), bytes(p)) for t, p in rows]

    def _decode(self, topic: str, payload: bytes) -> WireMessage:
        return decode(topic, payload, self.prefix, self.run_id)[1]

    def dropped(self) -> dict[int, tuple[int, int]]:
        """``node -> (messages, bytes)`` the capture counted but did not store: messages the nodes
        would not use, beyond the node's storage quota (-1: topics naming no node of the run;
        :mod:`adversary.transcript.quota`)."""
        rows = list(self._query("SELECT value FROM meta WHERE key = 'dropped'"))
        if not rows:
            return {}
        doc = json.loads(str(rows[0][0]))
        return {int(k): (int(v["messages"]), int(v["bytes"])) for k, v in doc.items()}

    def config(self) -> ConfigMsg | None:
        """The retained public configuration, if it was captured."""
        rows = self._payloads("config")
        if not rows:
            return None
        msg = self._decode(*rows[-1])
        return msg if isinstance(msg, ConfigMsg) else None

    def z0(self, n: int, edges: NDArray[np.int64]) -> dict[str, FloatArray]:
        """z_{i|j}^(0) per dual group, in :class:`EdgeLayout` order of ``edges`` (NaN if not captured)."""
        layout = EdgeLayout.from_graphs(n, [edges])
        index = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(layout.src, layout.dst, strict=True))}
        out: dict[str, FloatArray] = {}
        for topic, payload in self._payloads("z0"):
            msg = self._decode(topic, payload)
            if not isinstance(msg, Z0Msg):
                continue
            arr = out.setdefault(msg.group, np.full(len(layout.src), np.nan))
            e = index.get((msg.from_, msg.to))
            if e is not None:
                arr[e] = msg.z
        return out

    def x(self, n: int, t_total: int | None = None) -> FloatArray:
        """x_i^(t) as an ``(n, T)`` array, NaN where no message was captured."""
        rows = self._query("SELECT node, t, value FROM messages WHERE valid = 1 AND kind = 'x'").fetchall()
        if t_total is None:
            t_total = 1 + max((int(t) for _, t, _ in rows), default=-1)
        out = np.full((n, t_total), np.nan)
        if rows:
            node = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            t = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
            value = np.fromiter((r[2] for r in rows), dtype=np.float64, count=len(rows))
            inside = (node >= 0) & (node < n) & (t >= 0) & (t < t_total)
            out[node[inside], t[inside]] = value[inside]  # a slot's valid rows agree (conflicts are invalid)
        return out

    def x_stops(self, n: int, t_total: int) -> dict[tuple[int, int], tuple[int, list[int] | None]]:
        """``(node, t) -> (stop, departures)`` of the x's that carry a stop iteration (early stopping):
        what tells a reader whether that node ended its phase after t
        (:func:`nlagg_node.termination.halts`)."""
        rows = self._query(
            "SELECT node, t, payload FROM messages WHERE valid = 1 AND kind = 'x'"
            " AND instr(payload, CAST('\"stop\":' AS BLOB)) > 0"
        ).fetchall()
        out: dict[tuple[int, int], tuple[int, list[int] | None]] = {}
        for node, t, payload in rows:
            if not (0 <= node < n and 0 <= t < t_total):
                continue
            doc = json.loads(bytes(payload))
            stop, deps = doc.get("stop"), doc.get("departures")
            if isinstance(stop, int):
                out.setdefault((int(node), int(t)), (stop, [int(d) for d in deps] if deps else None))
        return out

    def x_finals(self, n: int, t_total: int, reach: int) -> FloatArray:
        """The certified stop's outputs: :func:`certified_finals` of this transcript."""
        return certified_finals(self.db, n, t_total, reach, self.commit)

    def adv_states(self) -> list[AdvStateMsg]:
        """Every state a corrupted node forwarded, in capture order."""
        return [m for m in (self._decode(*r) for r in self._payloads("adv")) if isinstance(m, AdvStateMsg)]

    def corrupted(self) -> list[int]:
        """Nodes that forwarded their state."""
        sql = "SELECT DISTINCT node FROM messages WHERE valid = 1 AND kind = 'adv' ORDER BY node"
        rows = self._query(sql)
        return [int(r[0]) for r in rows]

    def statuses(self) -> dict[int, StatusMsg]:
        """The last captured status of every node; ``done`` is final.

        A node's ``offline`` last will may come after its ``done`` (a connection that ended
        without a clean DISCONNECT): the node has finished, and its ``done`` (with its output)
        stays its status.
        """
        out: dict[int, StatusMsg] = {}
        for topic, payload in self._payloads("status"):
            msg = self._decode(topic, payload)
            if isinstance(msg, StatusMsg):
                seen = out.get(msg.node)
                if seen is None or seen.state != "done" or msg.state == "done":
                    out[msg.node] = msg
        return out


_HALTING_CANDIDATES = (
    "SELECT node, t, payload FROM messages WHERE valid = 1 AND kind = 'x'"
    " AND instr(payload, CAST('\"cand\":' AS BLOB)) > 0"
    " AND instr(payload, CAST('\"stop\":' || t AS BLOB)) > 0"
)


def certified_finals(
    db: sqlite3.Connection, n: int, t_total: int, reach: int, before: Callable[[], None] | None = None
) -> FloatArray:
    """``(n, t_total)``: the candidate an x carries where its node ends its phase with it
    (:func:`nlagg_node.termination.halts`), NaN elsewhere. In a run that stops on the certificate,
    that candidate, not the x, is the node's final of the phase (:mod:`nlagg_node.termination`).

    ``db``: a transcript's connection; ``before``: called first (a writer commits what it buffers).
    """
    if before is not None:
        before()
    out = np.full((n, t_total), np.nan)
    for node, t, payload in db.execute(_HALTING_CANDIDATES):
        if not (0 <= node < n and 0 <= t < t_total):
            continue
        doc = json.loads(bytes(payload))
        stop, cand, deps = doc.get("stop"), doc.get("cand"), doc.get("departures")
        if stop == t and isinstance(cand, int | float) and halts(stop, t, deps or (), reach):
            out[node, t] = float(cand)
    return out


def captured_count(path: str | Path, kind: str) -> int:
    """Valid rows of ``kind`` in a transcript that another process may be writing.

    Opens the file read-only (it never creates it or its schema) and answers 0 while the file is
    missing, still empty or locked: a progress probe, not a reader.
    """
    if not Path(path).exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)) as db:
            row = db.execute("SELECT COUNT(*) FROM messages WHERE valid = 1 AND kind = ?", (kind,)).fetchone()
    except sqlite3.Error:
        return 0
    return int(row[0])
