"""A continuous deployment: a node runs epoch after epoch, each an ordinary run of its own.

Epoch k of the deployment with prefix ``P`` and run id ``R`` is the single run with prefix
``P/R`` and run id ``e{k}`` (:func:`~nlagg_node.runtime.outputs.epoch_run_id`): its own x and z^(0)
topics, but its retained status (and last will) and key on the topics every epoch shares,
``P/R/node/{i}/status`` and ``P/R/node/{i}/key``, their payloads naming the run ``e{k}``
(``topics(..., shared=True)``, :mod:`~nlagg_node.runtime.wire`): a status or key of another epoch is
stale and reaches nothing of this one, and the broker holds the same retained topics however many
epochs run (Mosquitto never frees a topic level it made). Each epoch a node

1. reads its value source again (a sensor), at the epoch's start;
2. connects, with fresh z^(0) and fresh sealed-channel keys from the OS's entropy (a new
   :class:`~nlagg_node.runtime.member.Member`; the seed helper's OS-entropy path);
3. waits for its neighbours until the join window closes: a neighbour not online by then is
   *absent* and departs at t = 0 of this epoch (:mod:`nlagg_node.departure`: its edges are dropped
   at the first z-update, the others aggregate among themselves); it rejoins the next epoch. So
   does a neighbour whose session flaps (its last will came
   :data:`~nlagg_node.departure.FLAP_LIMIT` times in the epoch, before it starts or during it): it
   departs at the first x it has not delivered. Where the run cannot survive a departure
   (:func:`~nlagg_node.departure.departure_refusal`) the epoch fails, named, with an error record;
4. runs the protocol (early stop as configured) and publishes its output on the results topic
   (its status and key stay retained until the next epoch's overwrite them: nothing to clear).

The clock (:class:`EpochClock`): epoch k starts at ``origin + k * period`` (unix seconds, wall
clock). A node reads its value and prepares its connection half a join window before the start,
and joins an epoch only at its start, up to ``late`` seconds after it (a quarter of the join
window): the clocks of the nodes must agree within that (NTP does to milliseconds). A node started,
or restarted, later waits for the next epoch. An epoch that overruns its period skips the starts it
missed: the node begins at the next start still ahead (within ``late``), and the skipped epochs are
counted (:attr:`EpochOutcome.skipped`); epochs are never queued, as a queue would only grow.

Warm starts (:mod:`~nlagg_node.runtime.warmstart`, the math of :mod:`nlagg_node.warm`): with a
declared drift, epoch k runs warm from epoch k-1's output as the nodes published it (from an
earlier epoch's, with the drift of the epochs between, when no node finished k-1)
(:func:`~nlagg_node.epochplan.epoch_start`, the epoch planner the simulator follows too); a node
whose value lies outside the warm start's band runs a shell value, and when the warm run's output
falls back, the epoch reruns cold at once as the run ``e{k}r`` (:func:`rerun_run_id`) under
``P/R``, with fresh z^(0). With a fixed seed a node draws the simulator's streams
(:func:`~nlagg_node.epochplan.epoch_seed`): a testbed's epochs are ``nlagg sim --epochs K
--trials 1``'s, bit for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeVar, Unpack

import numpy as np

from ..config import RunConfig
from ..departure import FLAP_LIMIT
from ..epochplan import (
    EpochStart,
    HeardOutput,
    epoch_config,
    epoch_seed,
    epoch_start,
    shell_uniforms,
    used_values,
    warms_at,
)
from ..errors import ConfigError, DepartedError, NeighbourTimeoutError, NlaggError, StopRequested
from ..protocol.identity import Verifier
from ..warm import WarmStart
from .loop import run_members
from .member import Member, MemberOptions, MemberSettings, Seat
from .outputs import EpochOutput, epoch_run_id, results_topic, sign_record
from .patience import check_not_finished
from .public import run_edges
from .result import NodeResult
from .routing import Router
from .transport import Transport
from .warmstart import read_published_output
from .wire import StatusMsg, WireError, check_run_id, encode

__all__ = [
    "EpochClock",
    "EpochMember",
    "EpochOutcome",
    "TransportFor",
    "ValueFor",
    "join_window",
    "rerun_run_id",
    "run_epoch",
    "run_epochs",
]

log = logging.getLogger("nlagg.node")
_T = TypeVar("_T")
progress = logging.getLogger("nlagg.progress")


@dataclass(frozen=True)
class EpochClock:
    """When the epochs of a deployment start.

    origin : unix time of epoch 0's start (public: in the plan).
    period : seconds between two starts.
    epochs : how many epochs the deployment runs (None: for ever).
    join : seconds a node waits at an epoch's start for its neighbours (the join window); a node
        joins an epoch up to ``join / 4`` after its start (:attr:`late`).
    """

    origin: float
    period: float
    epochs: int | None = None
    join: float = 10.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.period) and self.period > 0):
            raise ConfigError("every", self.period, "must be a positive number of seconds")
        if not math.isfinite(self.origin):
            raise ConfigError("origin", self.origin, "must be a unix time in seconds")
        if self.epochs is not None and self.epochs < 1:
            raise ConfigError("epochs", self.epochs, "must be 1 or more")
        if not 0 < self.join < self.period:
            raise ConfigError("join", self.join, f"must lie between 0 and the period ({self.period:g} s)")

    @property
    def late(self) -> float:
        """Seconds after an epoch's start a node may still join it (the clock skew tolerated): a
        quarter of the join window, leaving the rest to connect and hear the neighbours."""
        return self.join / 4

    def start(self, k: int) -> float:
        return self.origin + k * self.period

    def next_epoch(self, now: float, after: int = -1) -> int | None:
        """The epoch a node ready at ``now`` joins, after epoch ``after``: the first whose start
        is at most :attr:`late` ago; None once the deployment's epochs are over."""
        k = max(after + 1, math.ceil((now - self.late - self.origin) / self.period))
        return None if self.epochs is not None and k >= self.epochs else k


def join_window(period: float) -> float:
    """The join window of epochs ``period`` seconds apart: a third of the period, at most 30 s."""
    return min(period / 3, 30.0)


def rerun_run_id(epoch: int) -> str:
    """The run id of epoch ``epoch``'s cold rerun (its warm run fell back): ``e{k}r``."""
    return check_run_id(f"{epoch_run_id(epoch)}r")


class EpochMember(Member):
    """A :class:`Member` of one epoch (its :data:`Seat` and options are a member's): a neighbour
    not online when the join window closes (``join_by``, ``time.time()`` seconds) departs at
    t = 0 instead of failing the run, and one whose session flaps (its will came
    :data:`~nlagg_node.departure.FLAP_LIMIT` times, :class:`~nlagg_node.runtime.watch.DepartureWatch`)
    departs for the epoch at once; with every neighbour absent the node misses the epoch
    (:class:`NeighbourTimeoutError`) rather than publish its own value as the output."""

    join_window = True

    def __init__(self, *seat: *Seat, join_by: float, **options: Unpack[MemberOptions]) -> None:
        options.setdefault("flap_limit", FLAP_LIMIT)
        super().__init__(*seat, **options)
        self.join_by = join_by
        self.absent: list[int] = []

    async def announce(self) -> None:
        """Publish our key and ``online``; wait for the neighbours until the join window closes."""
        self.z0.announce_key()
        await self.status("online")
        try:
            async with asyncio.timeout(max(0.0, self.join_by - time.time())):
                await self.peers.all_live.wait()
        except TimeoutError:
            self.absent = self.peers.not_live()
            if len(self.absent) == len(self.neighbours):
                raise NeighbourTimeoutError(
                    f"node {self.id}: every neighbour absent at the start of {self.run_id}: run alone,"
                    " the epoch's output would be this node's own value"
                ) from None
            log.warning(
                "node %d: neighbour(s) %s absent at the start of %s", self.id, self.absent, self.run_id
            )
            for j in self.absent:
                self.watch.depart(j, 0)
        self._keys_of_those_here()
        check_not_finished(self.id, self.run_id, self.peers.state, self.neighbours)

    def _keys_of_those_here(self) -> None:
        """A sealed exchange waits for the keys of the neighbours not departed only."""
        if self.keys is not None and self.departed:
            self.keys.neighbours = [j for j in self.neighbours if j not in self.departed]
            if not self.keys.missing():
                self.keys.complete.set()

    async def status(self, state: Literal["online", "running", "done", "leaving"], **extra: object) -> None:
        if state == "running" and self.departed:  # the absent: said with the first 'running'
            extra.setdefault("departed", self.departed_wire())
        await super().status(state, **extra)

    async def exchange_z0(self, group: str, z_out: list[float]) -> list[float]:
        """The exchange without the departed neighbours (absent, or flapping: a sealed one needs
        no key of theirs)."""
        if not self.departed:
            return await super().exchange_z0(group, z_out)
        self._keys_of_those_here()
        here = [(j, z) for j, z in zip(self.active, z_out, strict=True) if j not in self.departed]
        if group in self.sealed and self.keys is not None:
            try:
                async with asyncio.timeout(self.startup_timeout):
                    await self.keys.complete.wait()
            except TimeoutError:
                raise NeighbourTimeoutError(
                    f"node {self.id}: no public key from neighbour(s) {self.keys.missing()}"
                ) from None
            payloads = {j: self.z0.sealed_payload(group, j, z) for j, z in here}
        else:
            plain = self.z0.payloads(group, z_out)
            payloads = {j: plain[j] for j, _ in here}
        await self.outbox.send_z0(group, payloads)
        return await self.z0_in.take(self.shape.exchange_of[group])


@dataclass(frozen=True)
class EpochOutcome:
    """What one epoch gave a node: its result (None when it missed the epoch, ``missed`` says why)."""

    epoch: int
    result: NodeResult | None
    output: EpochOutput | None
    skipped: int = 0  # epochs skipped before this one (the previous overran its period)
    missed: str | None = None
    absent: tuple[int, ...] = ()  # neighbours absent at its start
    start: str = "cold"  # "warm", "fell back" (warm, then the cold rerun), "cold", "missed"
    read: HeardOutput | None = None  # the published output it warm-started from, holding none of its own


TransportFor = Callable[[int, str], Awaitable[Transport]]
"""The connection of epoch k's run ``run_id`` (``e{k}``, or its cold rerun ``e{k}r``), its last
will on the status topic every epoch shares, naming that run (``node_will(..., shared=True)``; MQTT:
:func:`~nlagg_node.runtime.epochmqtt.epoch_mqtt`)."""


async def run_epoch(
    cfg: RunConfig,
    node_id: int,
    value: float,
    transport: Transport,
    *,
    deployment: tuple[str, str],
    epoch: int,
    join_by: float,
    record: Callable[[NodeResult], EpochOutput | None],
    stop: asyncio.Event | None = None,
    run: str | None = None,
    **options: Unpack[MemberSettings],
) -> tuple[NodeResult, EpochOutput | None, list[int]]:
    """One epoch of node ``node_id`` on its own connection: its result, the output ``record`` made
    of it (published retained on the results topic before the connection closes; None when the
    node left, or ``record`` returned None: a warm run that falls back publishes nothing) and the
    neighbours absent at its start. ``deployment``: its prefix and run id ``(P, R)``. ``stop`` set
    (a SIGTERM): the node leaves the epoch cleanly before its next x. ``run``: the run id under
    ``P/R`` (default ``e{k}``; the cold rerun's ``e{k}r``); its status and key are on the topics
    every epoch shares."""
    prefix, run_id = deployment
    run = epoch_run_id(epoch) if run is None else run
    opts: MemberOptions = {**options, "prefix": f"{prefix}/{run_id}", "run_id": run, "shared": True}
    member = EpochMember(cfg, node_id, value, transport, join_by=join_by, **opts)

    def undecodable(topic: str, exc: WireError) -> None:
        member.reject(f"{topic}: {exc}")

    router = Router([member], undecodable, member.reject)
    async with transport:
        await transport.subscribe(*router.subscriptions())
        try:
            (result,) = await run_members([member], router, transport, stop)
        except DepartedError:
            # Counted as departed by a neighbour (it came too late): the others must not wait for us.
            # Signed like everything the node publishes (the outbox's transport): the neighbours
            # refuse an unsigned status, and would wait for us until their timeout.
            gone = StatusMsg(node=node_id, state="offline", run=member.topics.named)
            topic = member.topics.status(node_id)
            await member.outbox.transport.publish(topic, encode(gone), qos=1, retain=True)
            raise
        if result.left_at is not None:
            return result, None, member.absent
        out = record(result)
        if out is None:
            return result, None, member.absent
        topic = results_topic(prefix, run_id, node_id)
        payload = sign_record(out, topic, options.get("identity") if member.verifier is not None else None)
        await transport.publish(topic, payload, qos=1, retain=True)
    return result, out, member.absent


async def _sleep_until(when: float, stop: asyncio.Event | None) -> bool:
    """Sleep until unix time ``when``; True if ``stop`` was set first."""
    if stop is None:
        await asyncio.sleep(max(0.0, when - time.time()))
        return False
    try:
        async with asyncio.timeout(max(0.0, when - time.time())):
            await stop.wait()
    except TimeoutError:
        return False
    return True


async def _unless_stopped(work: Awaitable[_T], stop: asyncio.Event | None) -> _T:
    """Await ``work``, or cancel it and raise :class:`StopRequested` once ``stop`` is set (a SIGTERM)."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return await task
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise StopRequested
    return task.result()


ValueFor = Callable[[int], Awaitable[float]]
"""The node's value of epoch k, in protocol units (read at the epoch's start)."""


@dataclass(frozen=True)
class _Epoch:
    """What every run of one epoch of one node shares (its warm run, cold rerun, or listening)."""

    cfg: RunConfig
    node_id: int
    k: int
    clock: EpochClock
    deployment: tuple[str, str]
    transport_for: TransportFor
    to_user: Callable[[float], float]
    stop: asyncio.Event | None
    seed: int | None
    options: MemberSettings

    def record(
        self, extra: int = 0, check: WarmStart | None = None
    ) -> Callable[[NodeResult], EpochOutput | None]:
        """The output record of a run (``extra``: iterations of the warm run before it; ``check``:
        a warm start whose fallback discards the output)."""

        def record(r: NodeResult) -> EpochOutput | None:
            if check is not None and check.falls_back(r.output[0]):
                return None
            out = [self.to_user(v) for v in r.output]
            return EpochOutput(
                node=self.node_id,
                epoch=self.k,
                output=out[0] if len(out) == 1 else out,
                iterations=r.iterations + extra,
                time=time.time(),
            )

        return record

    async def run(
        self, start: EpochStart, value: float, join_by: float, *, rerun: bool = False, after: int = 0
    ) -> tuple[NodeResult, EpochOutput | None, list[int]]:
        """One run of the epoch: warm (``start.warm``) or cold, the epoch's own or its rerun."""
        k, run = self.k, rerun_run_id(self.k) if rerun else epoch_run_id(self.k)
        opts: MemberSettings = {
            **self.options,
            "seed": epoch_seed(self.seed, k, rerun=rerun),
        }
        ws = start.warm
        if ws is not None:
            u = shell_uniforms(self.seed, k, 1, self.cfg.n)[:, [self.node_id]]
            value = float(used_values(start, np.array([[value]]), u)[0, 0])
            opts["first_init"] = ws.init
        transport = await self.transport_for(k, run)
        if not rerun:
            progress.info(
                "node %d: epoch %d starts in %.2f s", self.node_id, k, self.clock.start(k) - time.time()
            )
            if await _sleep_until(self.clock.start(k), self.stop):
                raise StopRequested
        return await run_epoch(
            start.cfg,
            self.node_id,
            value,
            transport,
            deployment=self.deployment,
            epoch=k,
            join_by=join_by,
            record=self.record(after, ws),
            stop=self.stop,
            run=run,
            **opts,
        )

    async def published(self) -> HeardOutput | None:
        """The latest output before epoch k as the nodes published it (k-1's, or an earlier one when
        no node finished k-1), read from half a join window before the start until this node joins
        (:func:`~nlagg_node.runtime.warmstart.read_published_output`)."""
        transport = await self.transport_for(self.k, epoch_run_id(self.k))
        start = self.clock.start(self.k)
        keys = self.options.get("identities")
        verifier = None if keys is None else Verifier(keys)
        reading = read_published_output(
            transport, self.deployment, self.k, start, start + self.clock.late, verifier, self.cfg.n
        )
        return await _unless_stopped(reading, self.stop)


async def _one_epoch(ep: _Epoch, value: float, held: HeardOutput | None, drift: float | None) -> EpochOutcome:
    """Epoch ``ep.k`` of a node holding the output ``held``: warm from the latest output before it as
    the nodes published it, or cold; a warm run whose output falls back is rerun cold at once
    (``e{k}r``)."""
    k = ep.k
    read = None
    if warms_at(ep.cfg, k, drift):
        # From the outputs published, its own among them: nodes whose own outputs differ (a graph
        # split by an absent node into parts that each reached their own) still start alike.
        published = await ep.published()
        own = held is not None and published is not None and held.epoch == published.epoch
        read = None if own else published
        held = published
    start = epoch_start(ep.cfg, k, held, drift)
    join_by = ep.clock.start(k) + ep.clock.join
    result, output, absent = await ep.run(start, value, join_by)
    kind = "cold" if start.warm is None else "warm"
    if output is None and result.left_at is None:  # the warm output fell back: rerun cold at once
        log.info(
            "node %d: epoch %d's warm output %.6g fell back: rerunning it cold",
            ep.node_id,
            k,
            result.output[0],
        )
        cold = EpochStart(epoch_config(ep.cfg, k, held, drift, rerun=True))
        result, output, absent = await ep.run(
            cold, value, time.time() + ep.clock.join, rerun=True, after=result.iterations
        )
        kind = "fell back"
    return EpochOutcome(k, result, output, absent=tuple(absent), start=kind, read=read)


async def run_epochs(
    cfg: RunConfig,
    node_id: int,
    value_for: ValueFor,
    transport_for: TransportFor,
    clock: EpochClock,
    *,
    deployment: tuple[str, str],
    to_user: Callable[[float], float] = float,
    stop: asyncio.Event | None = None,
    drift: float | None = None,
    **options: Unpack[MemberSettings],
) -> AsyncIterator[EpochOutcome]:
    """Run epoch after epoch (:class:`EpochClock`); yield each epoch's outcome as it ends.

    ``value_for`` reads the value of an epoch; a failure to read it (a :class:`ConfigError`, e.g.
    out of the declared range) sits that epoch out. ``to_user`` maps an output to the user's units
    (:class:`~nlagg_node.valuemap.ValueScale`). A run error of one epoch (a neighbour that timed
    out, one that counted this node as departed) is logged and the next epoch starts; cancellation
    stops the loop; ``stop`` set (a SIGTERM) ends it after a clean leave of the epoch running (status
    ``leaving``: the neighbours go on without this node). ``options["seed"]`` (None: OS entropy)
    seeds each epoch apart (:func:`~nlagg_node.epochplan.epoch_seed`). ``drift``: the declared
    drift of warm starts (:mod:`~nlagg_node.runtime.warmstart`; None: every epoch cold).
    """
    seed = options.pop("seed", None)
    if seed == "config":
        seed = cfg.seed
    if options.get("edges") is None:  # once, before any epoch: drawing a graph may compile first
        options["edges"] = run_edges(cfg)
    if options.get("departure_timeout") is None:
        # A node killed mid-epoch never returns to it (restarted, it joins the next start): a will
        # that stays a whole period departs it, or every node would wait out 3/4 of the neighbour
        # timeout (45 s for a plan's node) and skip that many seconds of epochs.
        options["departure_timeout"] = min(clock.period, 0.75 * options.get("neighbour_timeout", 30.0))
    held: HeardOutput | None = None
    last = -1
    while (k := clock.next_epoch(time.time(), last)) is not None:
        skipped = 0 if last < 0 else k - last - 1
        if skipped:
            log.warning("node %d: epoch %d overran its period; %d start(s) skipped", node_id, last, skipped)
        if await _sleep_until(clock.start(k) - clock.join / 2, stop):
            return
        last = k
        ep = _Epoch(cfg, node_id, k, clock, deployment, transport_for, to_user, stop, seed, options)
        try:
            # Read the sensor and prepare the connection just before the start, then connect at it.
            outcome = await _one_epoch(ep, await value_for(k), held, drift)
        except StopRequested:
            return
        except (NlaggError, OSError) as exc:
            log.warning("node %d: epoch %d: %s", node_id, k, exc)
            yield EpochOutcome(k, None, None, skipped, missed=str(exc), start="missed")
            continue
        outcome = replace(outcome, skipped=skipped)
        if outcome.result is not None and outcome.output is None:  # it left (stop)
            yield replace(outcome, result=None, missed=f"left at t={outcome.result.left_at}")
            return
        elif outcome.output is not None:
            held = HeardOutput(k, outcome.output.output if isinstance(outcome.output.output, float) else None)
        yield outcome
