"""Warm starts in the node runtime: which start an epoch gets, and how a node that missed one learns.

The math is :mod:`nlagg_node.warm` (the simulator calls the same functions): this module only
decides, per epoch, whether a node runs it warm, cold or sits it out (docs/continuous.md, "Warm
starts"). The nodes of a run must agree on the start (a warm median runs with another ``c``, a
warm max from another z^(0); a node with another warm start would run another band), and the
decision rests on the public output alone:

* epoch 0, ``--cold-start``, and an operator without a warm start run cold;
* a node that holds epoch k-1's output (its own, or one it heard from a neighbour's public ``done``
  status of epoch k-1 while it sat that epoch out) runs epoch k warm from it;
* a node that does not hold it cannot agree with neighbours that do: it sits epoch k out (its
  neighbours depart it at t = 0, as any absent node) and listens to its neighbours' ``done``
  statuses of epoch k, so that it holds epoch k's output and runs epoch k+1 warm;
* a node that sat an epoch out listening and heard no neighbour finish it knows that none of its
  neighbours holds that output either: it runs the next epoch cold (after a restart of every
  node, or an epoch every node skipped, the deployment runs one epoch cold, then warm again).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ..config import RunConfig
from ..warm import WarmStart, warm_start
from .transport import Transport
from .wire import StatusMsg, WireError, decode, topics

__all__ = ["EpochStart", "HeardOutput", "epoch_config", "epoch_start", "listen_for_output"]

log = logging.getLogger("nlagg.node")


@dataclass(frozen=True)
class HeardOutput:
    """An epoch's output a node holds: its own, or one a neighbour's ``done`` status published
    (``output`` in user units; None: the node listened to the whole epoch and no neighbour finished).
    ``ran``: with no output, whether neighbours were seen running the epoch (their output was late)."""

    epoch: int
    output: float | None
    ran: bool = False


@dataclass(frozen=True)
class EpochStart:
    """How a node runs an epoch: ``cfg`` (a warm start's ``c``), ``warm`` (None: cold) and
    ``sit_out`` (why it sits the epoch out to listen, else None)."""

    cfg: RunConfig
    warm: WarmStart | None = None
    sit_out: str | None = None


def epoch_start(cfg: RunConfig, epoch: int, held: HeardOutput | None, drift: float | None) -> EpochStart:
    """The start of epoch ``epoch`` of a node holding ``held`` (the last output it knows of).

    ``drift`` is the declared drift (None: every epoch cold, ``--cold-start``). The rule is the
    module's; the warm start itself is :func:`nlagg_node.warm.warm_start` of the run's ``c`` and
    ``sigma_z``.
    """
    from ..sim.epochs import warms

    cfg = cfg.resolved()
    if drift is None or epoch == 0 or not warms(cfg):
        return EpochStart(cfg)
    if held is None or held.epoch != epoch - 1:
        return EpochStart(cfg, sit_out=f"holds no output of epoch {epoch - 1} to warm-start from")
    if held.output is None and held.ran:
        # Its neighbours ran epoch k-1 and hold its output, which did not reach this node in time:
        # running cold beside their warm start would split the epoch (they rerun, it would not).
        return EpochStart(cfg, sit_out=f"heard epoch {epoch - 1} run but not its output in time")
    if held.output is None:  # listened to epoch k-1: no neighbour ran it, none holds its output
        return EpochStart(cfg)
    ws = warm_start(
        cfg.op,
        held.output,
        drift=drift,
        c=cfg.c_value,
        sigma_z=cfg.sigma_z_value,
        value_range=cfg.value_range,
    )
    return EpochStart(_describing(cfg, ws, held.output), ws)


def epoch_config(
    cfg: RunConfig, epoch: int, held: HeardOutput | None, drift: float | None, *, rerun: bool = False
) -> RunConfig:
    """The configuration epoch ``epoch`` runs with (``rerun``: its cold rerun ``e{k}r``), from public
    facts only: the deployment's ``cfg``, the epoch, the output of epoch k-1 held (``held``, as in
    :func:`epoch_start`) and the declared ``drift``.

    The nodes run with it (:mod:`nlagg_node.runtime.epochs`), and a continuous capture gives it to
    each epoch's eavesdropper (:mod:`adversary.capture.epochs`): a warm epoch's ``c`` is
    :func:`~nlagg_node.warm.warm_c` of the run's; a cold epoch, a rerun, and an epoch whose nodes
    sit out (their neighbours run it cold) run ``cfg`` itself.

    """
    if rerun:
        return cfg.resolved()
    return epoch_start(cfg, epoch, held, drift).cfg


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


async def listen_for_output(
    transport: Transport,
    prefix: str,
    runs: tuple[str, str],
    neighbours: list[int],
    until: float,
    grace: float,
) -> tuple[list[float] | None, bool]:
    """Sit an epoch out on ``transport`` and return its output (protocol units), heard from a
    neighbour's ``done`` status (None if none came before ``time.time()`` reaches ``until``), and
    whether any neighbour was seen running the epoch (a status of it).

    ``runs``: the epoch's run and its cold rerun (``e{k}``, ``e{k}r``) under ``prefix``. The warm
    run's ``done`` is the epoch's output unless the run fell back: so after it the node waits
    ``grace`` seconds for a status of the rerun, and if one comes, for the rerun's ``done``.
    Nothing is published: the neighbours count the node absent.
    """
    import time

    first, rerun = runs
    warm_out: list[float] | None = None
    rerunning = ran = False
    loop = asyncio.get_running_loop()
    end = loop.time() + max(0.0, until - time.time())
    async with transport:
        await transport.subscribe(*(topics(prefix, r).status(j) for r in runs for j in neighbours))
        try:
            async with asyncio.timeout_at(end) as deadline:
                async for msg in transport.messages():
                    run = rerun if f"/{rerun}/" in msg.topic else first
                    status = _status(msg.topic, msg.payload, prefix, run)
                    if status is None:
                        continue
                    ran = True
                    done = status.output if status.state == "done" and status.output else None
                    if run == rerun:
                        if done is not None:
                            return list(done), True
                        if not rerunning:  # the warm run fell back: wait for the rerun's output
                            rerunning = True
                            deadline.reschedule(end)
                    elif done is not None and warm_out is None:
                        warm_out = list(done)
                        if not rerunning:
                            deadline.reschedule(min(end, loop.time() + grace))
        except TimeoutError:
            pass
    return (None if rerunning else warm_out), ran


def _status(topic: str, payload: bytes, prefix: str, run: str) -> StatusMsg | None:
    """A status heard while sitting out (None: a cleared retained one, or not a status: logged)."""
    if not payload:
        return None
    try:
        _, msg = decode(topic, payload, prefix, run)
    except WireError as exc:
        log.warning("sitting %s out: %s: %s", run, topic, exc)
        return None
    return msg if isinstance(msg, StatusMsg) else None
