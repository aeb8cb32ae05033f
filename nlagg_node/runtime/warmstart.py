"""Warm starts in the node runtime: reading the published output an epoch starts from.

Which start an epoch gets is the epoch planner's (:func:`nlagg_node.epochplan.epoch_start`, the one
the simulator follows; the math is :mod:`nlagg_node.warm`): this module reads the public fact it
rests on (docs/continuous.md, "Warm starts"). The nodes of a run must agree on the start (a warm
median runs with another ``c``, a warm max from another z^(0); a node with another warm start would
run another band), so the decision rests on one public fact every node can read, the outputs of
epoch k-1 published retained on the results topics ``P/R/results/{i}``
(:mod:`~nlagg_node.runtime.outputs`):

* epoch 0, ``--cold-start``, an operator without a warm start: cold;
* otherwise every node reads the results topics from half a join window before epoch k's start
  (:func:`read_published_output`; each record signed by its node in a deployment with identities): if
  :func:`~nlagg_node.epochplan.warm_quorum` nodes (three) published epoch k-1's output by the start, it
  runs warm from their median (:func:`~nlagg_node.epochplan.published_output`; with fewer one false
  record could be the median), its own output among them or not (restarted, absent, its run failed: it
  runs warm beside the others; a graph split by an absent node into parts that each reached their own
  output starts alike again). If none did by the latest time a node may join (the start plus
  :attr:`~nlagg_node.runtime.epochdriver.EpochClock.late`), no node finished epoch k-1 in time to run
  epoch k: it runs warm from the latest epoch j < k whose output is published, at most
  :data:`~nlagg_node.epochplan.WARM_GAP` epochs back, with the drift bound ``(k - j) D`` (every value
  moved at most D per epoch in between), like every other node; cold if there is none.

The eavesdropper's capture derives each epoch's configuration from the same published outputs
(:mod:`adversary.capture.epochconfig`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from ..epochplan import WARM_GAP, HeardOutput, published_output, warm_quorum
from ..protocol.identity import Verifier
from .outputs import EpochOutput, published_record, results_filter
from .transport import Transport

__all__ = ["SETTLE", "latest_published", "read_published_output"]

log = logging.getLogger("nlagg.node")

SETTLE = 0.2
"""Seconds a node reading the results after the start waits, once one of epoch k-1 came, for the
others (published together at that epoch's end) before it takes their median."""


async def read_published_output(
    transport: Transport,
    deployment: tuple[str, str],
    epoch: int,
    join_at: float,
    last: float,
    verifier: Verifier | None,
    n: int,
) -> HeardOutput | None:
    """Read the output published before epoch ``epoch`` from the results topics of ``deployment`` (``(P, R)``)
    on ``transport``: the median of the records of epoch k-1 come by ``join_at`` (unix seconds, epoch
    k's start); if none came by then, of those that come (within :data:`SETTLE` of the first) before
    ``last`` (the latest time a node may join); if none came at all, of the latest earlier epoch's
    records held (at most :data:`~nlagg_node.epochplan.WARM_GAP` back); None if there are none. Each
    record must be signed by its node when ``verifier`` holds the deployment's keys; an epoch counts
    with :func:`~nlagg_node.epochplan.warm_quorum` of ``n`` records (:func:`latest_published`)."""
    outputs: dict[int, tuple[int, float]] = {}
    loop = asyncio.get_running_loop()

    def at(when: float) -> float:
        return loop.time() + max(0.0, when - time.time())

    async with transport:
        await transport.subscribe(results_filter(*deployment))
        try:
            async with asyncio.timeout_at(at(last)) as deadline:
                async for msg in transport.messages():
                    record = _record(msg.topic, msg.payload, verifier)
                    if record is None or not epoch - WARM_GAP <= record.epoch < epoch:
                        continue
                    if isinstance(record.output, float):
                        outputs[record.node] = (record.epoch, record.output)
                    if record.epoch == epoch - 1 and _of_epoch(outputs, epoch - 1) >= warm_quorum(n):
                        deadline.reschedule(at(max(join_at, min(last, time.time() + SETTLE))))
        except TimeoutError:
            pass
    return latest_published(outputs.values(), n)


def _of_epoch(outputs: dict[int, tuple[int, float]], epoch: int) -> int:
    return sum(1 for k, _ in outputs.values() if k == epoch)


def latest_published(records: Iterable[tuple[int, float]], n: int) -> HeardOutput | None:
    """The latest epoch's output among ``records`` (``(epoch, output)`` per node that published one) as its
    ``n`` nodes published it (:func:`~nlagg_node.epochplan.published_output`), of the latest epoch with
    a quorum of records; None: no epoch has one."""
    by_epoch: dict[int, list[float]] = {}
    for k, o in records:
        by_epoch.setdefault(k, []).append(o)
    for latest in sorted(by_epoch, reverse=True):
        output = published_output(by_epoch[latest], n)
        if output is not None:
            return HeardOutput(latest, output)
    return None


def _record(topic: str, payload: bytes, verifier: Verifier | None) -> EpochOutput | None:
    """A node's published output (None: a cleared retained one, or not a record or not signed by its
    node: logged)."""
    if not payload:
        return None
    try:
        return published_record(topic, payload, verifier)
    except ValueError as exc:
        log.warning("%s holds no output record of its node: %s", topic, str(exc)[:200])
        return None
