"""Messages captured before their receivers subscribed: they hold their slot only until the real one.

A node subscribes, then publishes ``online``; an honest z^(0) waits for its receiver's ``online``
and an honest x for the z^(0) it is computed from, so the capture (which sees one broker's
messages in the order the broker took them) sees every receiver's status before an honest x or
z^(0). One captured earlier (an injection after the config, before the nodes connected) never
reached the nodes that were not subscribed yet. It is kept while nothing contradicts it (a capture
that saw no status at all, for one), but the first message for the same slot captured after every
receiver subscribed replaces it as the truth, and it is marked invalid with the reason
(:meth:`adversary.transcript.Transcript.add`).
"""

from __future__ import annotations

import sqlite3

from .reader import MAX_INVALID_PAYLOAD

__all__ = ["EarlySlots"]

Slot = tuple[str, str, object]


class EarlySlots:
    """When each node subscribed, which slots were taken before, and the rows to mark invalid.

    ``tick`` counts the messages judged, in capture order: a status captured at a later tick than
    a message came after it at the broker (one broker keeps the order of a run's messages).
    """

    def __init__(self, n: int, jumps: frozenset[int]) -> None:
        self.n = n
        self.jumps = jumps  # iterations a receiver takes whatever its position (RunShape.jumps)
        self.tick = 0
        self.subscribed: dict[int, int] = {}  # node -> the tick of its first status
        self.taken: dict[Slot, int] = {}  # slot -> the tick it was taken, while a node had not subscribed
        self._pending: list[tuple[str, int, str]] = []  # (error, payload cap, digest) to write

    def status(self, node: int) -> None:
        """A valid status of ``node``, captured now: it has subscribed."""
        self.subscribed.setdefault(node, self.tick)

    def take(self, slot: Slot, kind: str, t: int | None) -> None:
        """A message took ``slot`` now. Remembered only while some node has not subscribed, and only
        where a receiver that has published no x yet takes one: a z^(0), an x^(0), or an x at an
        iteration taken whatever the receiver's position (the first of a phase with early stopping);
        any other x is outside the window of a receiver not yet running, and refused."""
        if len(self.subscribed) < self.n and (kind == "z0" or (kind == "x" and (t == 0 or t in self.jumps))):
            self.taken[slot] = self.tick

    def missed(self, slot: Slot, receivers: list[int]) -> list[int]:
        """The ``receivers`` that had not subscribed when ``slot`` was taken, provided all have now
        (a message for the slot captured now reaches them all); else []."""
        at = self.taken.get(slot)
        if at is None or any(k not in self.subscribed for k in receivers):
            return []
        return [k for k in receivers if self.subscribed[k] > at]

    def displace(self, slot: Slot, digest: str, missed: list[int], what: str) -> None:
        """A message captured after every receiver subscribed takes ``slot`` from ``digest``."""
        del self.taken[slot]
        why = (
            f"captured before node(s) {missed[:8]} subscribed (they never received it);"
            f" the {what} captured after them is kept"
        )
        self._pending.append((why, MAX_INVALID_PAYLOAD, digest))

    def flush(self, db: sqlite3.Connection) -> None:
        """Mark the displaced rows invalid (stored rows, after the buffered ones are written)."""
        if not self._pending:
            return
        db.execute("BEGIN")
        db.executemany(
            "UPDATE messages SET valid = 0, error = ?, payload = substr(payload, 1, ?), kind = NULL,"
            " node = NULL, peer = NULL, t = NULL, phase = NULL, value = NULL WHERE dedup = ? AND valid = 1",
            self._pending,
        )
        db.execute("COMMIT")
        self._pending = []
