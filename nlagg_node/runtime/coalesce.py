"""A host's x's of an iteration in one message: the coalescing of the hosted nodes' publishes.

A process hosting several nodes (:func:`~nlagg_node.runtime.hosted.host_nodes`) publishes their x's
of an iteration as one :class:`~nlagg_node.runtime.wire.XBatchMsg` per run of consecutive node ids
(at most :data:`~nlagg_node.runtime.wire.MAX_BATCH` each) on ``P/R/host/{lo}-{hi}/x``, instead of one
message per node: the broker, the receivers and the capture handle one packet where they handled
h. Each item is the x its node would have published alone (signed alike), so what a receiver takes
is unchanged. A lone node publishes its x on its own topic (:meth:`~nlagg_node.runtime.peers.Outbox.send_x`).
"""

from __future__ import annotations

from .member import Member
from .wire import MAX_BATCH, encode_x_batch

__all__ = ["Coalescer", "id_runs"]


def id_runs(ids: list[int], most: int = MAX_BATCH) -> list[tuple[int, int]]:
    """``[start, end)`` spans of positions in ``ids`` whose ids are consecutive, at most ``most`` long."""
    spans: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[k - 1] + 1 or k - start == most:
            spans.append((start, k))
            start = k
    return spans


class Coalescer:
    """Publishes the x payloads of ``members`` (in their order) as one batch per run of ids."""

    def __init__(self, members: list[Member]) -> None:
        ids = [m.id for m in members]
        names = members[0].topics
        self.transport = members[0].transport  # the shared connection (each item is signed already)
        self.batches = [(names.x_batch(ids[a], ids[b - 1]), a, b) for a, b in id_runs(ids)]

    def publish(self, items: list[bytes]) -> None:
        """Publish an iteration's x payloads, one per member
        (:meth:`~nlagg_node.runtime.peers.Outbox.x_item`)."""
        publish = self.transport.publish_nowait
        for topic, a, b in self.batches:
            publish(topic, encode_x_batch(items[a:b]), qos=1)
