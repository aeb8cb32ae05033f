"""Per-node storage quota of a transcript: a few times what the run's honest traffic needs.

What the nodes use (valid messages) is always stored: one per slot of the run, and without padding
(:func:`compact`). What they would not use (undecodable, refused, conflicting: stored capped at
:data:`MAX_INVALID_PAYLOAD`) is charged to the node its topic names (``node/{i}/...``,
``edge/{i}/{j}/z0``, ``adv/{i}/state``; anything else, the config included, to one shared
bucket), up to :data:`QUOTA_FACTOR` times the bytes that node's part of the run takes when every
node is honest: an x per iteration, a forwarded state per iteration (any node may be a corrupted
one), a z^(0) per neighbour and exchange, its key and a few statuses. Beyond it such messages are
counted, not stored, and the transcript keeps the count per node (messages and bytes as they
arrived; meta ``dropped``, :meth:`adversary.transcript.Transcript.dropped`). Before the run's
configuration is known there is no quota.
"""

from __future__ import annotations

import json
import logging

from nlagg_node.limits import MAX_NODES
from nlagg_node.runtime.wire import WireError, WireMessage, encode

__all__ = ["QUOTA_FACTOR", "Quota", "compact", "node_budget"]

log = logging.getLogger("nlagg.eavesdropper")

QUOTA_FACTOR = 4
"""A node's quota, in multiples of the bytes its honest part of the run takes."""

_X = 256  # an x with its topic and early-stop fields
_ADV = 128  # a forwarded state without its duals ...
_ADV_EDGE = 96  # ... and per neighbour, both directions
_Z0 = 256  # a z^(0), plaintext or sealed, with its topic
_STATUS = 512  # a status with its finals and output
_STATUSES = 16  # statuses a node may publish (online, running, departures, done, again after a restart)


def node_budget(t_total: int, degree: int, exchanges: int) -> int:
    """Bytes of one node's honest messages in a run: ``t_total`` x's and forwarded states, a z^(0)
    per neighbour and exchange, its key and statuses."""
    per_iteration = _X + _ADV + _ADV_EDGE * degree
    return t_total * per_iteration + exchanges * degree * _Z0 + _STATUSES * _STATUS + _Z0


class Quota:
    """Bytes stored per node against its quota, and what was dropped beyond it.

    Parameters
    ----------
    quotas : bytes each node ``0..n-1`` may fill; the shared bucket (topics naming no node of the
        run) gets the largest of them.
    base : the run's topic prefix ``P/R/``.
    """

    def __init__(self, quotas: list[int], base: str) -> None:
        self.n = len(quotas)
        self.quotas = [*quotas, max(quotas)]  # the last one (index n): the shared bucket
        self.used = [0] * len(self.quotas)
        self.dropped: dict[int, list[int]] = {}  # node (-1: shared) -> [messages, bytes]
        self.base = base
        self.changed = False

    def bucket(self, node: int | None) -> int:
        return node if node is not None and 0 <= node < self.n else self.n

    def charge(self, node: int | None, size: int) -> None:
        """A message of ``size`` bytes stored for ``node``."""
        self.used[self.bucket(node)] += size

    def admit(self, node: int | None, size: int, arrived: int) -> bool:
        """Whether a message the nodes would not use, ``size`` bytes to store (``arrived`` on the
        wire), still fits ``node``'s quota; charged if so, counted as dropped if not."""
        b = self.bucket(node)
        if self.used[b] + size <= self.quotas[b]:
            self.used[b] += size
            return True
        key = -1 if b == self.n else b
        tally = self.dropped.setdefault(key, [0, 0])
        if not tally[0]:
            who = "topics naming no node of the run" if key < 0 else f"node {key}"
            log.warning(
                "%s filled its storage quota (%d bytes): messages the nodes would not use are counted,"
                " not stored",
                who,
                self.quotas[b],
            )
        tally[0] += 1
        tally[1] += arrived
        self.changed = True
        return False

    def topic_node(self, topic: str) -> int | None:
        """The node a topic of the run names (``node/{i}/..``, ``edge/{i}/..``, ``adv/{i}/..``)."""
        if not topic.startswith(self.base):
            return None
        parts = topic[len(self.base) :].split("/", 2)
        if len(parts) < 2 or parts[0] not in ("node", "edge", "adv"):
            return None
        i = parts[1]
        return int(i) if i.isascii() and i.isdigit() and len(i) <= len(str(MAX_NODES)) else None

    def dump(self) -> str:
        """The ``dropped`` meta value, ``{"node": {"messages": m, "bytes": b}}`` ("-1": the shared bucket)."""
        self.changed = False
        return json.dumps({str(k): {"messages": m, "bytes": b} for k, (m, b) in sorted(self.dropped.items())})

    def load(self, value: str | None) -> None:
        """Counts saved by :meth:`dump` (a restarted capture goes on counting)."""
        if not value:
            return
        for k, d in json.loads(value).items():
            self.dropped[int(k)] = [int(d["messages"]), int(d["bytes"])]


def compact(payload: bytes, msg: WireMessage) -> bytes:
    """A valid message's payload as the nodes write it (canonical JSON) when that is shorter: the
    same fields, without padding (whitespace the JSON allows)."""
    try:
        canon = encode(msg)
    except WireError:
        return payload
    return canon if len(canon) < len(payload) else payload
