"""The eavesdropper's transcript: every captured message of one run in SQLite (WAL).

One row per distinct message: topic, raw payload, receive time, whether the broker flagged it
retained, and the parsed fields (kind, node, peer, t, phase, value; ``valid = 0`` with the error
for anything that does not follow wire protocol v1). ``dedup`` is a digest of topic + payload, so a
QoS 1 redelivery or a second capture of the same message is stored once. An x, z^(0) or adversary
state is valid once per topic and iteration (group for z^(0)): a later message with the same topic
and iteration but another payload is stored with ``valid = 0`` ("conflicts with ..."), the first
one is kept, as the nodes do.

The writer keeps both checks in memory (loaded from the file on the first :meth:`Transcript.add`,
so a restarted eavesdropper continues where it stopped) and buffers rows until :meth:`commit`:
a UNIQUE index on random digests and a lookup per message would make every commit rewrite
dozens of scattered pages, which at thousands of messages per second is most of the capture's CPU.
For the same reason the index is on ``(kind, t)``: the rows of one commit share the last pages
of the index instead of one page per node.

Readers give what the analysis needs: the public config, z^(0) per directed edge (EdgeLayout
order, like :attr:`nlagg_node.sim.SimResult.z0`), x as an ``(n, T)`` array with NaN where nothing
was captured, the corrupted nodes' forwarded states, and the final statuses.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import numpy as np
from numpy.typing import NDArray

from nlagg_node.errors import ConfigError
from nlagg_node.graphs import EdgeLayout
from nlagg_node.runtime.wire import (
    AdvStateMsg,
    ConfigMsg,
    StatusMsg,
    TopicInfo,
    WireError,
    WireMessage,
    XMsg,
    Z0Msg,
    check_prefix,
    check_run_id,
    decode,
)

__all__ = ["Captured", "Transcript"]

FloatArray = NDArray[np.float64]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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

Captured = tuple[TopicInfo, WireMessage] | None
_NO_FIELDS = (None, None, None, None, None, None)  # kind, node, peer, t, phase, value of an invalid row


def _fields(info: TopicInfo, msg: WireMessage) -> tuple[int | None, str | None, float | None]:
    if isinstance(msg, XMsg):
        return msg.t, msg.phase, msg.x
    if isinstance(msg, Z0Msg):
        return None, msg.group, msg.z
    if isinstance(msg, AdvStateMsg):
        return msg.t, None, msg.s
    if isinstance(msg, StatusMsg):
        return msg.iterations, msg.state, None
    return None, None, None


class Transcript:
    """A transcript file, opened for writing (the eavesdropper) or reading (the analysis).

    Parameters
    ----------
    path : the SQLite file; created when missing.
    run_id, prefix : the run it captures. When the file exists they must match what it holds;
        when None they are read from the file.
    """

    def __init__(self, path: str | Path, run_id: str | None = None, prefix: str | None = None) -> None:
        self.path = Path(path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        for key, given in (("run_id", run_id), ("prefix", prefix)):
            stored = meta.get(key)
            if stored is not None and given is not None and stored != given:
                raise ConfigError(key, given, f"{self.path} holds a transcript of {key} {stored!r}")
            if stored is None:
                if given is None:
                    given = "nlagg" if key == "prefix" else None
                if given is None:
                    raise ConfigError("run_id", None, f"{self.path} is not a transcript; give the run id")
                self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, given))
                meta[key] = given
        self.run_id = check_run_id(meta["run_id"])
        self.prefix = check_prefix(meta["prefix"])
        self._rows: list[tuple[object, ...]] = []
        # Writer state, loaded lazily: digests stored, and (kind, topic, t or group) -> digest of
        # the valid x/z0/adv message that holds that slot.
        self._seen: dict[str, bool] | None = None  # digest -> stored as valid
        self._slots: dict[tuple[str, str, object], str] = {}

    # Writing ------------------------------------------------------------------------------
    def add(
        self, topic: str, payload: bytes, *, received: float | None = None, retained: bool = False
    ) -> Captured:
        """Store one message (parsed when valid); return the parsed message, or None if invalid.

        A message already stored (same topic and payload) is not stored again and is judged as
        its first copy was: returned parsed if that one was valid (handling it twice is the
        caller's idempotent business), None if it was rejected. Rows are written by
        :meth:`commit` (the eavesdropper commits every fraction of a second and at exit); the
        read methods below commit first, so they see everything added.
        """
        if self._seen is None:
            self._load_writer_state()
            assert self._seen is not None
        when = time.time() if received is None else received
        key = hashlib.blake2b(topic.encode() + b"\0" + payload, digest_size=16).hexdigest()
        try:
            info, msg = decode(topic, payload, self.prefix, self.run_id)
        except WireError as exc:
            if key not in self._seen:
                self._seen[key] = False
                self._rows.append((topic, payload, when, int(retained), 0, str(exc), *_NO_FIELDS, key))
            return None
        if key in self._seen:  # a redelivery: stored once, judged as the first copy was
            return (info, msg) if self._seen[key] else None
        t, phase, value = _fields(info, msg)
        clash = self._claim(key, topic, info, t, phase)
        self._seen[key] = clash is None
        if clash is not None:
            self._rows.append((topic, payload, when, int(retained), 0, clash, *_NO_FIELDS, key))
            return None
        fields = (info.kind, info.node, info.peer, t, phase, value)
        self._rows.append((topic, payload, when, int(retained), 1, None, *fields, key))
        return (info, msg)

    def _claim(self, key: str, topic: str, info: TopicInfo, t: int | None, phase: str | None) -> str | None:
        """Why a valid x/z0/adv message must not count (another payload for its topic and iteration)."""
        if info.kind not in ("x", "z0", "adv"):
            return None
        slot = (info.kind, topic, phase if info.kind == "z0" else t)
        holder = self._slots.setdefault(slot, key)
        if holder == key:
            return None
        what = f"group {phase}" if info.kind == "z0" else f"t={t}"
        return f"conflicts with the {info.kind} already stored for {topic} at {what}; the first one is kept"

    def _load_writer_state(self) -> None:
        rows = self.db.execute("SELECT dedup, valid, kind, topic, t, phase FROM messages ORDER BY id")
        self._seen = {}
        for key, valid, kind, topic, t, phase in rows:
            self._seen[str(key)] = bool(valid)
            if valid and kind in ("x", "z0", "adv"):
                self._slots.setdefault((str(kind), str(topic), phase if kind == "z0" else t), str(key))

    def complete(self, n: int, t_total: int, edges: list[list[int]], groups: set[str]) -> tuple[int, int]:
        """Missing ``(x, z0)`` of a run: x_i^(t) for i < n, t < t_total, and z_{i|j}^(0) for both
        directions of every edge and every dual group. Valid-looking messages outside the run
        (another node, group or edge) do not count."""
        xs = self._query(
            "SELECT COUNT(*) FROM (SELECT DISTINCT node, t FROM messages WHERE valid = 1 AND kind = 'x'"
            " AND node < ? AND t < ?)",
            (n, t_total),
        ).fetchone()[0]
        wanted = {(a, b) for a, b in edges} | {(b, a) for a, b in edges}
        z0 = {
            (int(i), int(j), str(g))
            for i, j, g in self._query(
                "SELECT DISTINCT node, peer, phase FROM messages WHERE valid = 1 AND kind = 'z0'"
            )
            if (int(i), int(j)) in wanted and g in groups
        }
        return n * t_total - int(xs), len(wanted) * len(groups) - len(z0)

    def done_nodes(self) -> set[int]:
        """Nodes of which a valid ``done`` status was captured."""
        rows = self._query(
            "SELECT DISTINCT node FROM messages WHERE valid = 1 AND kind = 'status' AND phase = 'done'"
        )
        return {int(r[0]) for r in rows}

    def commit(self) -> None:
        """Write and make durable everything added so far (one transaction)."""
        if not self._rows:
            return
        self.db.execute("BEGIN")
        try:
            self.db.executemany(
                "INSERT INTO messages (topic, payload, received, retained, valid, error, kind, node,"
                " peer, t, phase, value, dedup) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self._rows,
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")  # the rows stay buffered for the next commit
            raise
        self._rows = []

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        """Run a read query; rows still buffered by :meth:`add` are committed first, so they count."""
        self.commit()
        return self.db.execute(sql, params)

    def set_meta(self, key: str, value: str) -> None:
        self.commit()
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def close(self) -> None:
        self.commit()
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

    # Reading ------------------------------------------------------------------------------
    def count(self, *, valid_only: bool = False) -> int:
        """Number of stored (distinct) messages."""
        sql = "SELECT COUNT(*) FROM messages" + (" WHERE valid = 1" if valid_only else "")
        return int(self._query(sql).fetchone()[0])

    def rejected(self) -> list[tuple[str, str]]:
        """``(topic, error)`` of every stored message that is not valid protocol v1."""
        return [(str(a), str(b)) for a, b in self._query("SELECT topic, error FROM messages WHERE valid = 0")]

    def _payloads(self, kind: str) -> list[tuple[str, bytes]]:
        sql = "SELECT topic, payload FROM messages WHERE valid = 1 AND kind = ? ORDER BY id"
        rows = self._query(sql, (kind,))
        return [(str(t), bytes(p)) for t, p in rows]

    def _decode(self, topic: str, payload: bytes) -> WireMessage:
        return decode(topic, payload, self.prefix, self.run_id)[1]

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
        for node, t, value in rows:
            if 0 <= node < n and 0 <= t < t_total:
                out[node, t] = value
        return out

    def adv_states(self) -> list[AdvStateMsg]:
        """Every state a corrupted node forwarded, in capture order."""
        return [m for m in (self._decode(*r) for r in self._payloads("adv")) if isinstance(m, AdvStateMsg)]

    def corrupted(self) -> list[int]:
        """Nodes that forwarded their state."""
        sql = "SELECT DISTINCT node FROM messages WHERE valid = 1 AND kind = 'adv' ORDER BY node"
        rows = self._query(sql)
        return [int(r[0]) for r in rows]

    def statuses(self) -> dict[int, StatusMsg]:
        """The last captured status of every node."""
        out: dict[int, StatusMsg] = {}
        for topic, payload in self._payloads("status"):
            msg = self._decode(topic, payload)
            if isinstance(msg, StatusMsg):
                out[msg.node] = msg
        return out
