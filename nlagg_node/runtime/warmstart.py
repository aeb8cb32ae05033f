"""Warm starts in the node runtime: which start an epoch gets, agreed from the published outputs.

The math is :mod:`nlagg_node.warm` (the simulator calls the same functions): this module only
decides, per epoch, whether a node runs it warm or cold (docs/continuous.md, "Warm starts"). The
nodes of a run must agree on the start (a warm median runs with another ``c``, a warm max from
another z^(0); a node with another warm start would run another band), so the decision rests on one
public fact every node can read, the outputs of epoch k-1 published retained on the results topics
``P/R/results/{i}`` (:mod:`~nlagg_node.runtime.outputs`):

* epoch 0, ``--cold-start``, an operator without a warm start: cold;
* otherwise every node reads the results topics from half a join window before epoch k's start
  (:func:`read_published_output`; each record signed by its node in a deployment with identities):
  if :func:`warm_quorum` nodes (three) published epoch k-1's output by the start, it runs warm from
  their median (:func:`published_output`; with fewer one false record could be the median), its own
  output among them or not (restarted,
  absent, its run failed: it runs warm beside the others; a graph split by an absent node into
  parts that each reached their own output starts alike again). If none did by the latest time a
  node may join (the start plus :attr:`~nlagg_node.runtime.epochs.EpochClock.late`), no node
  finished epoch k-1 in time to run epoch k: it runs warm from the latest epoch j < k whose output
  is published, at most :data:`WARM_GAP` epochs back, with the drift bound ``(k - j) D`` (every
  value moved at most D per epoch in between), like every other node; cold if there is none.

The eavesdropper's capture derives each epoch's configuration from the same published outputs
(:mod:`adversary.capture.epochconfig`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..config import RunConfig
from ..protocol.identity import Verifier
from ..warm import WarmStart, warm_start
from .outputs import EpochOutput, published_record, results_filter
from .transport import Transport

__all__ = [
    "WARM_GAP",
    "EpochStart",
    "HeardOutput",
    "epoch_config",
    "epoch_start",
    "latest_published",
    "published_output",
    "read_published_output",
    "warm_quorum",
]

log = logging.getLogger("nlagg.node")

WARM_GAP = 10
"""The oldest published output an epoch warm-starts from, in epochs back (``k - j``); the drift bound
grows with the gap, so an older output is hardly a better start than a cold one."""

SETTLE = 0.2
"""Seconds a node reading the results after the start waits, once one of epoch k-1 came, for the
others (published together at that epoch's end) before it takes their median."""


@dataclass(frozen=True)
class HeardOutput:
    """The output of epoch ``epoch`` a node holds (user units): its own, or the one the nodes published
    (None: a top-K output, which no epoch warm-starts from)."""

    epoch: int
    output: float | None


@dataclass(frozen=True)
class EpochStart:
    """How a node runs an epoch: ``cfg`` (a warm start's ``c``) and ``warm`` (None: cold)."""

    cfg: RunConfig
    warm: WarmStart | None = None


def epoch_start(cfg: RunConfig, epoch: int, held: HeardOutput | None, drift: float | None) -> EpochStart:
    """The start of epoch ``epoch`` given ``held``, the latest output before it the node holds or
    read (None, one of epoch ``epoch`` or later, or more than :data:`WARM_GAP` epochs back: cold).

    ``drift`` is the declared drift per epoch (None: every epoch cold, ``--cold-start``); from the
    output of epoch ``j`` the warm start declares ``(epoch - j) * drift``. The warm start itself is
    :func:`nlagg_node.warm.warm_start` of the run's ``c`` and ``sigma_z``.
    """
    cfg = cfg.resolved()
    gap = epoch - held.epoch if held is not None else 0
    if not warms_at(cfg, epoch, drift) or held is None or held.output is None or not 1 <= gap <= WARM_GAP:
        return EpochStart(cfg)
    assert drift is not None  # warms_at
    ws = warm_start(
        cfg.op,
        held.output,
        drift=gap * drift,
        c=cfg.c_value,
        sigma_z=cfg.sigma_z_value,
        value_range=cfg.value_range,
    )
    return EpochStart(_describing(cfg, ws, held.output), ws)


def warms_at(cfg: RunConfig, epoch: int, drift: float | None) -> bool:
    """Whether epoch ``epoch`` of a deployment of ``cfg`` with declared ``drift`` may start warm
    (it does when an output of the :data:`WARM_GAP` epochs before it is held)."""
    from ..sim.epochs import warms

    return drift is not None and epoch > 0 and warms(cfg)


def epoch_config(
    cfg: RunConfig, epoch: int, held: HeardOutput | None, drift: float | None, *, rerun: bool = False
) -> RunConfig:
    """The configuration epoch ``epoch`` runs with (``rerun``: its cold rerun ``e{k}r``), from public
    facts only: the deployment's ``cfg``, the epoch, the latest output published before it
    (``held``, as in :func:`epoch_start`) and the declared ``drift``.

    The nodes run with it (:mod:`nlagg_node.runtime.epochs`), and a continuous capture gives it to
    each epoch's eavesdropper (:mod:`adversary.capture.epochs`): a warm epoch's ``c`` is
    :func:`~nlagg_node.warm.warm_c` of the run's; a cold epoch and a rerun run ``cfg`` itself.
    """
    if rerun:
        return cfg.resolved()
    return epoch_start(cfg, epoch, held, drift).cfg


WARM_QUORUM = 3
"""Records of one epoch a warm start needs: with three, one node's false record lies between two
honest ones or beyond them, and the median (the lower middle) is never it unless it lies between
(issue 43, break 6: with one or two records the median was the forger's)."""


def warm_quorum(n: int) -> int:
    """The records of one epoch a deployment of ``n`` nodes warm-starts from: :data:`WARM_QUORUM`
    (a deployment of fewer nodes never warm-starts from records)."""
    return WARM_QUORUM if n >= WARM_QUORUM else n + 1


def published_output(outputs: Sequence[float], n: int) -> float | None:
    """An epoch's output as its ``n`` nodes published it: the median (the lower middle) of their
    (signed) records, one per node, when at least :func:`warm_quorum` came (None: fewer). Every
    node's is the same up to the run's tolerance; with the quorum one node's false record cannot
    move it outside the honest records' range."""
    ordered = sorted(outputs)
    return ordered[len(ordered) // 2] if len(ordered) >= warm_quorum(n) else None


def _describing(cfg: RunConfig, ws: WarmStart, last_output: float) -> RunConfig:
    """A warm epoch's configuration (``cfg`` with the warm ``c``), made to describe its real z^(0).

    The bounded-influence envelope (:mod:`nlagg_node.protocol.envelope`) is derived from the
    configuration's init, at the nodes and in the transcript: a median's or quantile's
    ``prior_median`` is the last output (the init is then the warm start's exactly); a max's or
    min's ``mu_z`` is raised, where needed, to ``|E[a z^(0)] + c/2|`` of the warm init (the
    envelope of a one-sided init centred at 1/2 bounds ``|E[a z^(0)] + c s|`` over s in [0, 1] by
    ``mu_z + c/2``, and the warm init's is ``|E[a z^(0)] + c/2| + c/2``). With the defaults it never is.
    """
    cfg = cfg.model_copy(update={"c": ws.c})
    if ws.kind == "prior":
        return cfg.model_copy(update={"prior_median": last_output})
    if cfg.value_range is None:  # no envelope without a declared range
        return cfg
    need = abs(ws.init.mean_per_sign() + ws.c / 2.0)
    return cfg.model_copy(update={"mu_z": max(cfg.mu_z_value, need)})


async def read_published_output(
    transport: Transport,
    deployment: tuple[str, str],
    epoch: int,
    join_at: float,
    last: float,
    verifier: Verifier | None,
    n: int,
) -> HeardOutput | None:
    """Read the output published before epoch ``epoch`` from the results topics of ``deployment``
    (``(P, R)``) on ``transport``: the median of the records of epoch k-1 come by ``join_at`` (unix
    seconds, epoch k's start); if none came by then, of those that come (within :data:`SETTLE` of
    the first) before ``last`` (the latest time a node may join); if none came at all, of the latest
    earlier epoch's records held (at most :data:`WARM_GAP` back); None if there are none. Each record
    must be signed by its node when ``verifier`` holds the deployment's keys; an epoch counts with
    :func:`warm_quorum` of ``n`` records (:func:`latest_published`)."""
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
    """The latest epoch's output among ``records`` (``(epoch, output)`` per node that published one)
    as its ``n`` nodes published it (:func:`published_output`), of the latest epoch with a quorum of
    records; None: no epoch has one."""
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
