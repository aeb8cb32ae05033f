"""The eavesdropper's transcript: every captured message of one run in SQLite (WAL).

One row per distinct message: topic, raw payload, receive time, whether the broker flagged it
retained, and the parsed fields (kind, node, peer, t, phase, value; ``valid = 0`` with the error
for anything that does not follow wire protocol v1). ``dedup`` is a digest of topic + payload, so a
QoS 1 redelivery or a second capture of the same message is stored once. An x, z^(0) or adversary
state is valid once per topic and iteration (group for z^(0)): a later message with the same topic
and iteration but another payload is stored with ``valid = 0`` ("conflicts with ..."), the first
one is kept, as the nodes do. Once the run's configuration is known (the retained ``P/R/config``,
or one given in advance) every message must also pass the nodes' own rules
(:class:`adversary.rules.RunRules`: node ids and iterations of the run, the phase of each iteration,
the barrier window, edges and dual groups); what a node would have dropped is stored with
``valid = 0`` and the reason, so the attack uses only what the nodes used. Messages that came
before the configuration are judged again, in arrival order, when it arrives.

Nothing a client sends can stop the capture: every integer on the wire is bounded (see
:mod:`nlagg_node.limits`), a payload the nodes would not use (undecodable, refused by the rules,
a conflict) is stored as a bounded prefix (``MAX_INVALID_PAYLOAD`` bytes), and a row SQLite
refuses is stored as invalid with the error.
Without per-node ACLs on the broker (``allow_anonymous true``) anyone can publish as any node: the
rules then keep what the nodes kept, but nothing protects the run's integrity.

The writer keeps both checks in memory (loaded from the file on the first :meth:`Transcript.add`,
so a restarted eavesdropper continues where it stopped) and buffers rows until :meth:`commit`:
a UNIQUE index on random digests and a lookup per message would make every commit rewrite
dozens of scattered pages, which at thousands of messages per second is most of the capture's CPU.
For the same reason the index is on ``(kind, t)``: the rows of one commit share the last pages
of the index instead of one page per node.

An x is read as the nodes read it (:class:`~nlagg_node.runtime.wire.HotDecoder`: msgspec, the same
checks as the pydantic model, which reads every other kind). A host's batch of x's
(``P/R/host/{lo}-{hi}/x``, :meth:`Transcript.add_batch`) is stored as the x's it carries, each on its
node's topic, exactly as if its node had published it alone: the attack and the report read the same
rows either way.

The schema and the read side (the queries the analysis uses) are in :mod:`adversary.transcript.reader`.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

from nlagg_node.errors import ConfigError
from nlagg_node.private import open_private
from nlagg_node.protocol import equivocation_error, slot_verdict, x_conflict_error
from nlagg_node.runtime.wire import (
    ConfigMsg,
    HotDecoder,
    TopicInfo,
    WireError,
    WireMessage,
    check_prefix,
    check_run_id,
    decode,
    split_x_batch,
)

from ..rules import OUTSIDE_WINDOW, RunRules, rules_for
from .early import EarlySlots
from .quota import QUOTA_FACTOR, Quota, compact, node_budget
from .reader import (
    MAX_INVALID_PAYLOAD,
    NO_FIELDS,
    SCHEMA,
    TranscriptReader,
    captured_count,
    check_tables,
    connect_read_only,
    create_tables,
    row_fields,
)

__all__ = ["MAX_INVALID_PAYLOAD", "Captured", "Transcript", "captured_count"]

Captured = tuple[TopicInfo, WireMessage] | None


class Transcript(TranscriptReader):
    """A transcript file, opened for writing (the eavesdropper) or reading (the analysis).

    Parameters
    ----------
    path : the SQLite file; created when missing.
    run_id, prefix : the run it captures. When the file exists they must match what it holds;
        when None they are read from the file.
    config : the run's public configuration when known in advance (its rules apply from the
        first message); otherwise the first valid config message captured sets them.
    """

    def __init__(
        self,
        path: str | Path,
        run_id: str | None = None,
        prefix: str | None = None,
        *,
        config: ConfigMsg | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError("transcript", str(self.path), "is a directory; give a file name")
        try:  # created 0600 (a corrupted node's state holds its private value); SQLite's -wal and -shm follow
            os.close(open_private(self.path, os.O_RDWR))
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError("transcript", str(self.path), f"cannot open it ({exc})") from None
        try:
            check_tables(self.db, self.path, allow_empty=True)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            create_tables(self.db, SCHEMA)
        except sqlite3.Error as exc:
            self.db.close()
            raise ConfigError("transcript", str(self.path), f"cannot write it ({exc})") from None
        except BaseException:
            self.db.close()
            raise
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
        self._decode_hot = HotDecoder(self.prefix, self.run_id).decode  # x's in msgspec
        self._rows: list[tuple[object, ...]] = []
        # Writer state, loaded lazily: digests stored, and (kind, topic, t or group) -> digest of
        # the valid x/z0/adv message that holds that slot.
        self._seen: dict[str, bool] | None = None  # digest -> stored as valid
        self._slots: dict[tuple[str, str, object], str] = {}
        self._x_payloads: dict[int, dict[int, bytes]] = {}  # recent x's holding their slots (signed runs)
        self._early: EarlySlots | None = None  # with the rules: when each node subscribed
        self._quota: Quota | None = None  # with the rules: bytes stored per node
        self._values: dict[tuple[str, str, object], float | None] = {}  # the number each slot holds
        self.rules: RunRules | None = None
        self._candidate: RunRules | None = None  # rules of the config being stored
        if config is not None:
            self.set_config(config)

    @classmethod
    def open_read_only(cls, path: str | Path) -> Transcript:
        """Open an existing transcript for reading only: never creates, migrates or writes the file.

        The file is opened through SQLite's ``mode=ro`` URI (no table created, no switch to WAL);
        when SQLite cannot even create its shared-memory file beside it (a folder the user may
        not write), it is read as immutable. A file that is not an nlagg transcript is refused
        with a :class:`ConfigError` naming what is missing.
        """
        p = Path(path)
        if p.is_dir():
            raise ConfigError("transcript", str(p), "is a directory, not a transcript file")
        if not p.is_file():
            raise ConfigError("transcript", str(p), "no such file")
        self = cls.__new__(cls)
        self.path = p
        self.db = connect_read_only(p)
        try:
            check_tables(self.db, p, allow_empty=False)
            meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
            missing = [key for key in ("run_id", "prefix") if key not in meta]
            if missing:
                raise ConfigError("transcript", str(p), f"not an nlagg transcript: meta has no {missing[0]}")
            self.run_id = check_run_id(str(meta["run_id"]))
            self.prefix = check_prefix(str(meta["prefix"]))
        except BaseException:
            self.db.close()
            raise
        self._decode_hot = HotDecoder(self.prefix, self.run_id).decode
        self._rows = []
        self._seen = None
        self._slots = {}
        self._x_payloads = {}
        self._early = None
        self._quota = None
        self._values = {}
        return self

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
            info, msg = self._decode_hot(topic, payload)
        except WireError as exc:
            self._store_invalid(key, topic, payload, when, retained, str(exc))
            return None
        if key in self._seen:  # a redelivery: stored once, judged as the first copy was
            return (info, msg) if self._seen[key] else None
        fields = row_fields(info, msg)
        why = self._judge(key, topic, info, msg, fields, payload)
        if why is not None and not self._fits(topic, info.node, payload):
            return None  # beyond the sender's quota: counted, neither stored nor remembered
        if why is None or OUTSIDE_WINDOW not in why:  # a copy outside the window is judged anew later
            self._seen[key] = why is None
        if why is not None:  # kept as evidence, bounded whatever decodes: the nodes never use it
            kept = payload[:MAX_INVALID_PAYLOAD]
            self._rows.append((topic, kept, when, int(retained), 0, why, *NO_FIELDS, key))
            return None
        kind, node, peer = info.kind, info.node, info.peer
        if len(payload) > MAX_INVALID_PAYLOAD:
            payload = compact(payload, msg)  # a padded message the nodes use: stored without its padding
        self._rows.append((topic, payload, when, int(retained), 1, None, kind, node, peer, *fields, key))
        if isinstance(msg, ConfigMsg) and self.rules is None:
            self._set_rules(msg, self._candidate)
        return (info, msg)

    def add_batch(
        self, topic: str, payload: bytes, *, received: float | None = None, retained: bool = False
    ) -> list[Captured] | None:
        """Store a host's batch of x's (:func:`~nlagg_node.runtime.wire.split_x_batch`) as the x's it
        carries, each as :meth:`add` stores it on its node's topic; what each gave. None: ``topic`` is no
        batch topic. A batch that does not decode is stored as invalid, whole; an item of a node the
        host does not host as invalid, with the batch's topic and the reason."""
        when = time.time() if received is None else received
        try:
            batch = split_x_batch(topic, payload, self.prefix, self.run_id)
        except WireError as exc:
            if self._seen is None:
                self._load_writer_state()
            key = hashlib.blake2b(topic.encode() + b"\0" + payload, digest_size=16).hexdigest()
            self._store_invalid(key, topic, payload, when, retained, str(exc))
            return [None]
        if batch is None:
            return None
        items, refused = batch
        if refused and self._seen is None:
            self._load_writer_state()
        for item, error in refused:
            key = hashlib.blake2b(topic.encode() + b"\0" + item, digest_size=16).hexdigest()
            self._store_invalid(key, topic, item, when, retained, str(error))
        return [self.add(it.topic, it.payload, received=when, retained=retained) for it in items] + [
            None for _ in refused
        ]

    def _store_invalid(
        self, key: str, topic: str, payload: bytes, when: float, retained: bool, why: str
    ) -> None:
        """A message that does not decode: stored once, as evidence, within its sender's quota."""
        assert self._seen is not None
        if key not in self._seen and self._fits(topic, None, payload):
            self._seen[key] = False
            kept = payload[:MAX_INVALID_PAYLOAD]
            self._rows.append((topic, kept, when, int(retained), 0, why, *NO_FIELDS, key))

    def _fits(self, topic: str, node: int | None, payload: bytes) -> bool:
        """Whether a message the nodes would not use fits its sender's storage quota (charged if so)."""
        quota = self._quota
        if quota is None:
            return True
        who = quota.topic_node(topic) if node is None else node
        return quota.admit(who, len(topic) + min(len(payload), MAX_INVALID_PAYLOAD), len(payload))

    def _forged(self, topic: str, info: TopicInfo, msg: WireMessage, payload: bytes) -> str | None:
        """Why ``msg``'s signature refuses it (:meth:`adversary.rules.RunRules.forged`)."""
        if self.rules is None:
            return None
        claims = getattr(msg, "sig", None) is not None or getattr(msg, "k", None) is not None
        if self.rules.verifier is None and not claims:
            return None  # a run without identities, and nothing on the message claims one
        return self.rules.forged(topic, info.node, payload, msg)

    def _judge(
        self,
        key: str,
        topic: str,
        info: TopicInfo,
        msg: WireMessage,
        fields: tuple[int | None, str | None, float | None],
        payload: bytes,
    ) -> str | None:
        """Why ``msg`` must not count (None: it is valid and now holds its slot); ``fields`` are its
        :func:`~adversary.transcript.reader.row_fields`. The run's rules first, then the sender's
        signature (a run with identities), then the slot."""
        early = self._early
        if early is not None:
            early.tick += 1
        if isinstance(msg, ConfigMsg) and self.rules is None:
            self._candidate, why = rules_for(msg)
            if self._candidate is None:
                return why
        elif self.rules is not None:
            why = self.rules.reject(msg) or self._forged(topic, info, msg, payload)
            if why is not None:
                return why
        clash = self._claim(key, topic, info, fields, payload)
        if clash is None and self.rules is not None:
            self.rules.accepted(msg)
            if early is not None and info.kind == "status" and info.node is not None:
                early.status(info.node)
        return clash

    def set_config(self, config: ConfigMsg) -> None:
        """Apply the rules of ``config`` (a run configuration known in advance) from now on.

        Does nothing once a configuration is in force (the first one wins, as at the nodes);
        raises :class:`ConfigError` when ``config`` does not describe a valid run.
        """
        if self._seen is None:
            self._load_writer_state()
        if self.rules is None:
            self._set_rules(config)

    def resync(self) -> None:
        """The capture lost its session (the broker crashed): messages may be missing, so the
        barrier window is suspended until every node has been seen again (see :mod:`adversary.rules`)."""
        if self.rules is not None:
            self.rules.resync()

    def _set_rules(self, config: ConfigMsg, rules: RunRules | None = None) -> None:
        """Adopt the run's rules and judge again, in arrival order, what came before them."""
        self._candidate = None
        if rules is None:
            rules, why = rules_for(config)
            if rules is None:
                raise ConfigError("config", config.run_id, str(why))
        self.commit()
        sql = "SELECT id, topic, payload, valid, error, dedup FROM messages ORDER BY id"
        before = self.db.execute(sql).fetchall()
        self.rules = rules
        self._seen, self._slots, self._early = {}, {}, EarlySlots(rules.n, rules.shape.jumps)
        self._quota = self._quota_for(rules)
        self._values = {}
        changed: list[tuple[object, ...]] = []
        for row_id, topic, payload, valid, error, dedup in before:
            key = str(dedup)
            if not valid:
                self._quota.charge(self._quota.topic_node(str(topic)), len(str(topic)) + len(payload))
            try:
                info, msg = decode(str(topic), bytes(payload), self.prefix, self.run_id)
            except WireError:
                self._seen[key] = False
                continue
            if key in self._seen:
                continue
            tpv = row_fields(info, msg)
            why = self._judge(key, str(topic), info, msg, tpv, bytes(payload))
            if why is None or OUTSIDE_WINDOW not in why:
                self._seen[key] = why is None
            if (why is None) != bool(valid) or (why is not None and why != error):
                fields = (info.kind, info.node, info.peer, *tpv) if why is None else NO_FIELDS
                changed.append((int(why is None), why, *fields, row_id))
        if changed:
            self.db.execute("BEGIN")
            self.db.executemany(
                "UPDATE messages SET valid = ?, error = ?, kind = ?, node = ?, peer = ?, t = ?, phase = ?,"
                " value = ? WHERE id = ?",
                changed,
            )
            self.db.execute("COMMIT")
        if self._early is not None:
            self._early.flush(self.db)

    def _claim(
        self,
        key: str,
        topic: str,
        info: TopicInfo,
        fields: tuple[int | None, str | None, float | None],
        payload: bytes,
    ) -> str | None:
        """Why a valid x/z0/adv message must not count (another payload for its topic and iteration).

        Another number for the slot is the equivocation the nodes stop for
        (:func:`~nlagg_node.protocol.equivocation_error`, named in the reason); the same number in
        another message (a resend with other early-stop fields, a z^(0) sealed anew) is refused
        without that charge, as the nodes take it as a duplicate."""
        t, phase, value = fields
        if info.kind not in ("x", "z0", "adv"):
            return None
        slot = (info.kind, topic, phase if info.kind == "z0" else t)
        held = self._slots.get(slot)
        verdict = slot_verdict(held, key)  # the first message of a slot wins ...
        early = self._early
        verifier = self.rules.verifier if self.rules is not None else None
        if verdict == "new":
            self._slots[slot] = key
            self._values[slot] = value
            if info.kind == "x" and verifier is not None and t is not None:
                self._keep_x(int(info.node or 0), t, payload)
            if early is not None and len(early.subscribed) < early.n:
                early.take(slot, info.kind, t)
            return None
        if verdict == "dup":
            return None
        missed = self._missed(slot, info, t) if early is not None and early.taken else []
        if missed:  # ... unless it came before its receivers subscribed and this one after
            assert held is not None
            assert early is not None
            assert self._seen is not None
            early.displace(slot, held, missed, f"{info.kind} for {topic}")
            self._seen[held] = False
            self._slots[slot], self._values[slot] = key, value
            early.take(slot, info.kind, t)
            return None
        what = f"group {phase}" if info.kind == "z0" else f"t={t}"
        why = f"conflicts with the {info.kind} already stored for {topic} at {what}; the first one is kept"
        kept = self._values.get(slot)
        if kept is None or value is None or kept == value:  # unknown (sealed, restarted) or one number
            return why
        named = (
            f"z0 {info.node}->{info.peer} ({phase})"
            if info.kind == "z0"
            else f"{info.kind}_{info.node}^({t})"
        )
        if info.kind == "x" and verifier is not None and t is not None:  # as the nodes decide
            j = int(info.node or 0)
            first = self._x_payloads.get(j, {}).get(t)
            return f"{why}: {x_conflict_error(verifier, topic, j, t, first, payload)}"
        return f"{why}: {equivocation_error(int(info.node or 0), named, verifier is not None)}"

    def _keep_x(self, j: int, t: int, payload: bytes) -> None:
        """Keep the payload of the x that holds slot x_j^(t), a few iterations back, for a conflict's
        proof (:func:`~nlagg_node.protocol.x_conflict_error`)."""
        held = self._x_payloads.setdefault(j, {})
        held[t] = payload
        if len(held) > 8:
            del held[min(held)]

    def _quota_for(self, rules: RunRules) -> Quota:
        """The run's per-node storage quota (:mod:`adversary.transcript.quota`), with what the file
        says was dropped already."""
        shape = rules.shape
        budgets = [
            QUOTA_FACTOR * node_budget(shape.t_total, len(nbrs), len(shape.exchanges))
            for nbrs in shape.neighbours
        ]
        quota = Quota(budgets, f"{self.prefix}/{self.run_id}/")
        row = self.db.execute("SELECT value FROM meta WHERE key = 'dropped'").fetchone()
        quota.load(None if row is None else str(row[0]))
        return quota

    def _missed(self, slot: tuple[str, str, object], info: TopicInfo, t: int | None) -> list[int]:
        """The receivers that had not subscribed when ``slot`` was taken, if all have now
        (:class:`~adversary.transcript.early.EarlySlots`): x's and z^(0)'s only."""
        assert self._early is not None
        assert self.rules is not None
        if info.kind == "z0" and info.peer is not None:
            return self._early.missed(slot, [info.peer])
        if info.kind == "x" and info.node is not None and t is not None:
            return self._early.missed(slot, self.rules.departures.receivers(info.node, t))
        return []

    def _load_writer_state(self) -> None:
        """Dedup digests, slots and the window of what the file holds (a restarted eavesdropper)."""
        sql = "SELECT dedup, valid, kind, topic, node, t, phase, payload, error FROM messages ORDER BY id"
        self._seen = {}
        latest: dict[int, tuple[int, str, bytes]] = {}  # each node's last valid x (its key chain's place)
        rows = self.db.execute(sql).fetchall()
        for key, valid, kind, topic, node, t, phase, payload, error in rows:
            if not valid and self._quota is not None:
                self._quota.charge(self._quota.topic_node(str(topic)), len(str(topic)) + len(payload))
            if not valid:
                if OUTSIDE_WINDOW not in str(error):
                    self._seen.setdefault(str(key), False)
                continue
            self._seen[str(key)] = True
            early = self._early
            if early is not None:
                early.tick += 1
            if kind in ("x", "z0", "adv"):
                slot = (str(kind), str(topic), phase if kind == "z0" else t)
                if slot not in self._slots:
                    self._slots[slot] = str(key)
                    if early is not None:
                        early.take(slot, str(kind), t)
            elif kind == "status" and early is not None:
                early.status(int(node))
            if kind == "config" and self.rules is None:
                msg = self._decode(str(topic), bytes(payload))
                if isinstance(msg, ConfigMsg):
                    self.rules, _ = rules_for(msg)
                    if self.rules is not None:
                        self._early = EarlySlots(self.rules.n, self.rules.shape.jumps)
                        self._quota = self._quota_for(self.rules)
            elif kind == "x" and self.rules is not None and self.rules.inside(int(node), int(t)):
                self.rules.saw_x(int(node), int(t))
                if int(t) > latest.get(int(node), (-1, "", b""))[0]:
                    latest[int(node)] = (int(t), str(topic), bytes(payload))
            elif kind == "status" and self.rules is not None and self.rules.verifier is not None:
                self.rules.resume(self._decode(str(topic), bytes(payload)))
        if self.rules is not None:
            for _, topic, payload in latest.values():
                self.rules.resume(self._decode(topic, payload))

    def commit(self) -> None:
        """Write and make durable everything added so far (one transaction).

        A row SQLite refuses is stored instead as invalid, with the error and a bounded prefix of
        its payload, so one message can never block the commits (and the acknowledgements) after it.
        """
        if self._rows:
            try:
                self._insert(self._rows)
            except (sqlite3.Error, OverflowError, ValueError):
                self._insert([self._storable(row) for row in self._rows])
            self._rows = []
        if self._early is not None:
            self._early.flush(self.db)
        if self._quota is not None and self._quota.changed:
            self.db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('dropped', ?)", (self._quota.dump(),)
            )

    def _insert(self, rows: list[tuple[object, ...]]) -> None:
        self.db.execute("BEGIN")
        try:
            self.db.executemany(
                "INSERT INTO messages (topic, payload, received, retained, valid, error, kind, node,"
                " peer, t, phase, value, dedup) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")  # the rows stay buffered for the next commit
            raise

    def _storable(self, row: tuple[object, ...]) -> tuple[object, ...]:
        """``row``, or an invalid row SQLite can hold when it refuses this one."""
        try:
            self.db.execute("SAVEPOINT probe")
            self.db.execute(
                "INSERT INTO messages (topic, payload, received, retained, valid, error, kind, node,"
                " peer, t, phase, value, dedup) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return row
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            topic, payload, when, retained, *_, key = row
            self._seen_as_invalid(str(key))
            kept = bytes(payload)[:MAX_INVALID_PAYLOAD] if isinstance(payload, bytes) else b""
            why = f"cannot be stored ({type(exc).__name__}: {exc})"
            return (str(topic), kept, when, retained, 0, why, *NO_FIELDS, key)
        finally:
            self.db.execute("ROLLBACK TO probe")
            self.db.execute("RELEASE probe")

    def _seen_as_invalid(self, key: str) -> None:
        if self._seen is not None:
            self._seen[key] = False

    def set_meta(self, key: str, value: str) -> None:
        self.commit()
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
