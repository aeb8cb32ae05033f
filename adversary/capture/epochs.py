"""One eavesdropper for every epoch of a continuous deployment, into one epoch store.

``nlagg eavesdrop --continuous --run-id R --prefix P --transcript DIR`` subscribes to ``P/R/#`` once
and routes each message by its first level (for a status or key on the topics every epoch shares,
``P/R/node/{i}/status`` and ``P/R/node/{i}/key``, by the run its payload names): ``e{k}`` to epoch k's own
:class:`~adversary.capture.eavesdropper.Eavesdropper` (its transcript, live replay and stop rule,
unchanged: epoch k is run ``e{k}`` under prefix ``P/R``, and its retained config opens it),
``results`` to the nodes' published outputs, ``e{k}r`` (epoch k's cold rerun: its warm run fell
back, docs/continuous.md) to a second eavesdropper of epoch k, its transcript beside the epoch's.
Given the deployment's public config (:class:`~adversary.capture.epochconfig.EpochConfigs`), each
run's eavesdropper gets the configuration the nodes derive for it (no deployment publishes a
per-epoch config); without it, a run's retained config opens it. Everything goes to an
:class:`~adversary.transcript.store.EpochStore` (:mod:`adversary.transcript.store`).

An epoch closes when its eavesdropper is finished (every node done, the transcript complete) and
its rerun too, or no rerun began (a node published its output of the epoch, or :data:`RERUN_WAIT`
s went by); or, once a later epoch has begun, after ``complete_grace`` seconds without a message of
it (a node absent for that epoch never says ``done``). Closing stores its summary (the attack on its
transcript, :func:`adversary.epochs.epoch_summary`; an epoch that was rerun has the rerun's
summary, every exposure of both runs, and the warm run's summary under ``warm``: :func:`with_rerun`)
and, with ``keep_epochs`` N, deletes the raw transcripts of all but the newest N closed epochs. A
message of an epoch already closed (a
retained config or status sent again at every resubscription) is counted as ``late`` and not stored.
An empty payload (a retained message cleared; nodes of this version clear none) is counted as
``cleared`` and not stored; a message of a cold rerun is counted as ``reruns`` too. A restarted
capture gets each node's latest status and key again, retained: they go to the run they name (an
epoch already closed counts them ``late``).

As in the single-run capture, a message is acknowledged to the broker only after the transcript
holding it is committed, and the store keeps which epochs are open: a restarted eavesdropper
reopens them (their transcripts resume) and loses nothing.

A deployment with bridged sites is captured from every site broker at once (a
:class:`~adversary.capture.merged.MergedSubscriber`): each delivery is acknowledged to its own site,
a bridged copy is stored once (the transcript's dedup), and each run's eavesdropper holds back an x
that overtook those it was computed from (its causal order; an epoch that closes judges what waits).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nlagg_node.epochplan import WARM_GAP, HeardOutput
from nlagg_node.errors import ConfigError
from nlagg_node.lifetime import on_stop_signal
from nlagg_node.protocol.identity import Verifier
from nlagg_node.runtime.mqtt import accepts_anonymous
from nlagg_node.runtime.outputs import published_record
from nlagg_node.runtime.transport import Message, Subscriber
from nlagg_node.runtime.warmstart import latest_published
from nlagg_node.runtime.wire import (
    ConfigMsg,
    WireError,
    check_prefix,
    check_run_id,
    decode,
    encode,
    shared_run,
    topics,
)

from ..live import Exposure
from ..transcript.store import MAX_EPOCH, EpochStore, Result, epoch_of, epoch_run_id
from ..transcript.writer import Transcript
from .eavesdropper import Eavesdropper, live_table
from .epochconfig import EpochConfigs, judge_warm
from .merged import Acknowledging, MergedSubscriber
from .session import DEFAULT_SESSION, CaptureSession, capture_until, commit_due

__all__ = ["MAX_OPEN_EPOCHS", "RERUN_WAIT", "EpochCapture", "run_epoch_eavesdropper", "with_rerun"]

log = logging.getLogger("nlagg.eavesdropper")


MAX_OPEN_EPOCHS = 16
"""Epochs captured at once, at most: a client publishing under many ``e{k}`` cannot make the capture
open a transcript (a file, an eavesdropper) for each; a message that would open one more is
counted ``stray`` and not stored. A deployment has one epoch open, two while one ends."""


RERUN_WAIT = 2.0
"""Seconds a finished epoch waits for its cold rerun when no node published its output (the nodes
rerun at once, and publish their output only after the rerun); at most ``complete_grace``."""


@dataclass
class _Epoch:
    """An epoch being captured: its eavesdropper (and transcript), its cold rerun's once one began,
    when it last got a message, and since when its warm (first) run is finished."""

    eaves: Eavesdropper
    seen: float
    rerun: Eavesdropper | None = None
    done_at: float | None = None

    def runs(self) -> list[Eavesdropper]:
        return [self.eaves] if self.rerun is None else [self.eaves, self.rerun]


Events = Callable[..., None]
Summarize = Callable[[Path], dict[str, Any]]
"""What an epoch's summary is, given its transcript (:func:`adversary.epochs.epoch_summary`: the
attack's report; the capture itself never imports the attack)."""


class EpochCapture:
    """Capture every epoch of deployment ``store.prefix/store.run_id`` through ``transport``.

    Parameters
    ----------
    summarize : the summary of a closed epoch, from its transcript (see :data:`Summarize`).
    keep_epochs : keep the raw transcripts of the newest N closed epochs (None: all).
    stop_epochs : stop once the store holds this many closed epochs (None: until cancelled).
    complete_grace : seconds an epoch waits for what is missing, once it is done or a later one began.
    configs : the deployment's public config and drift: each run's configuration is derived from
        them (None: from the deployment's retained ``P/R/config`` with ``drift`` once it comes, and
        until then, or without it, each run's own retained config opens it).
    drift : the declared drift (None: every epoch cold) with which a retained ``P/R/config`` is used.
    on_event : ``on_event(kind, **fields)`` for ``epoch`` (opened), ``exposure``, ``epoch_closed`` and
        ``pruned``.
    """

    def __init__(
        self,
        transport: Subscriber,
        store: EpochStore,
        *,
        summarize: Summarize,
        keep_epochs: int | None = None,
        stop_epochs: int | None = None,
        complete_grace: float = 10.0,
        commit_every: float = 0.25,
        on_event: Events | None = None,
        configs: EpochConfigs | None = None,
        drift: float | None = 0.0,
    ) -> None:
        for name, value, least in (("keep_epochs", keep_epochs, 0), ("epochs", stop_epochs, 1)):
            if value is not None and value < least:
                raise ConfigError(name, value, f"must be {least} or more")
        self.transport = transport
        self.store = store
        self.summarize = summarize
        self.base = store.epoch_prefix
        self.keep_epochs = keep_epochs
        self.stop_epochs = stop_epochs
        self.complete_grace = complete_grace
        self.commit_every = commit_every
        self.on_event = on_event or (lambda kind, **fields: None)
        self.configs = configs
        self.drift = drift
        self.live: dict[int, _Epoch] = {}
        self.closing: set[int] = set()
        self.captured = self.late = self.stray = self.results = self.cleared = self.reruns = 0
        self.subscribed = asyncio.Event()
        self.finished = asyncio.Event()
        self._acking = transport if isinstance(transport, Acknowledging) else None
        self._unacked: list[Message] = []
        self._committed = time.monotonic()
        self._stop_at: float | None = None  # when a capture that closed its epochs stops waiting
        # The closed epochs' summaries run one at a time on one worker thread of the capture's
        # own: over months, each new thread of a shared pool would grow the process by a malloc
        # arena of its own (the soak measured about 9 MB when two summaries first overlapped).
        self._summaries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nlagg-summary")
        rows = store.epochs()
        self.newest = max((r.epoch for r in rows), default=-1)
        for row in rows:
            if row.state == "open":  # a restarted capture: its transcript resumes
                self._open(row.epoch)
        self._check_stop()

    @property
    def current(self) -> Eavesdropper | None:
        """The newest epoch being captured (the live one)."""
        return self.live[max(self.live)].eaves if self.live else None

    # Routing ---------------------------------------------------------------------------------
    def handle(self, topic: str, payload: bytes, retained: bool = False) -> None:
        """Route one message to its epoch's eavesdropper, or store a node's result."""
        self.route(Message(topic, payload, retained))

    def route(self, raw: Message) -> list[Message]:
        """Route one delivery as :meth:`handle` does; the deliveries now handled, to acknowledge
        once committed (over several site brokers an x may wait in its run's causal order for the
        x's it was computed from: then not it, and later also those it released)."""
        topic, payload = raw.topic, raw.payload
        self.captured += 1
        rest = topic[len(self.base) + 1 :] if topic.startswith(self.base + "/") else ""
        level, _, tail = rest.partition("/")
        if not payload and rest:  # a retained status or key cleared (by nodes before the shared topics)
            self.cleared += 1
            return [raw]
        if level == "results":
            self._result(topic, payload)
            return [raw]
        if level == "config" and not tail:
            self._deployment(topic, payload)
            return [raw]
        if level == "node":
            named = self._shared(topic, payload)
            if named is None:
                return [raw]
            level = named
        k, rerun = epoch_of(level), False
        if k is None and level.endswith("r") and (k := epoch_of(level[:-1])) is not None:
            rerun = True
            self.reruns += 1
        if k is None:
            self.stray += 1
            log.warning("captured a message outside every epoch of %s on %s: not stored", self.base, topic)
            return [raw]
        ep = self.live.get(k)
        if ep is None:
            if k in self.closing or self.store.state(k) not in (None, "open"):
                self.late += 1  # a retained message sent again, or a straggler of a closed epoch
                log.debug("epoch %d is closed: a late message on %s is not stored", k, topic)
                return [raw]
            if len(self.live) + len(self.closing) >= MAX_OPEN_EPOCHS:
                self.stray += 1
                log.warning("%d epochs open already: a message on %s is not stored", MAX_OPEN_EPOCHS, topic)
                return [raw]
            ep = self._open(k)
        ep.seen = time.monotonic()
        if rerun and ep.rerun is None:
            ep.rerun = self._eavesdropper(k, rerun=True)
            log.info("epoch %d fell back: capturing its cold rerun into %s", k, ep.rerun.transcript.path)
        return (ep.rerun if rerun and ep.rerun is not None else ep.eaves).take([raw])

    def _shared(self, topic: str, payload: bytes) -> str | None:
        """The run a status or key on a topic every epoch shares names (None: not one, counted ``stray``)."""
        try:
            named = shared_run(topic, payload, self.base)
        except WireError as exc:
            named, why = None, str(exc)[:200]
        else:
            why = "not a status or key topic"
        if named is None:
            self.stray += 1
            log.warning("captured a message on %s that names no run: %s; not stored", topic, why)
        return named

    def _open(self, k: int) -> _Epoch:
        self.store.open_epoch(k)
        ep = self.live[k] = _Epoch(self._eavesdropper(k), time.monotonic())
        if self.store.transcript_path(k, rerun=True).is_file():  # a resumed epoch that was rerun
            ep.rerun = self._eavesdropper(k, rerun=True)
        self.newest = max(self.newest, k)
        log.info("epoch %d: capturing into %s", k, ep.eaves.transcript.path)
        self.on_event("epoch", epoch=k)
        return ep

    def _eavesdropper(self, k: int, *, rerun: bool = False) -> Eavesdropper:
        """The eavesdropper of epoch ``k``'s run (``rerun``: its cold rerun ``e{k}r``)."""
        run_id = epoch_run_id(k) + ("r" if rerun else "")
        path = self.store.transcript_path(k, rerun=rerun)
        transcript = Transcript(path, run_id=run_id, prefix=self.base)
        config = transcript.config()  # a resumed epoch: its replay catches up at once

        def exposed(e: Exposure) -> None:
            self.on_event("exposure", epoch=k, node=e.node, t=e.t, value=e.value, how=e.how, rerun=rerun)

        eaves = Eavesdropper(
            self.transport, transcript, on_exposure=exposed, config=config, complete_grace=self.complete_grace
        )
        if config is None and self.configs is not None:
            self._derive(k, eaves, rerun)
        return eaves

    def _deployment(self, topic: str, payload: bytes) -> None:
        """The deployment's retained ``P/R/config`` (its launcher's): each run's configuration is
        derived from it from now on (an epoch already open without one gets its own now)."""
        if self.configs is not None:
            return
        try:
            _, msg = decode(topic, payload, self.store.prefix, self.store.run_id)
            if not isinstance(msg, ConfigMsg):
                raise WireError("config", topic, "not a run configuration")
            self.configs = EpochConfigs.from_message(msg, self.drift)
        except (WireError, ConfigError, ValidationError) as exc:
            self.stray += 1
            log.warning("the deployment's config on %s is not one: %s", topic, str(exc)[:200])
            return
        log.info("deployment config received: every epoch's configuration is derived from it")
        for k, ep in self.live.items():
            for rerun, eaves in ((False, ep.eaves), (True, ep.rerun)):
                if eaves is not None and eaves.config is None:
                    self._derive(k, eaves, rerun)

    def _derive(self, k: int, eaves: Eavesdropper, rerun: bool) -> None:
        """Give run ``e{k}`` (``rerun``: ``e{k}r``) the configuration its nodes derive, stored in its
        transcript as its own (a retained config published too must be the same: the first one
        wins, as at the nodes)."""
        assert self.configs is not None
        derived = self.configs.message(k, self._published_before(k), rerun=rerun)
        run_id = epoch_run_id(k) + ("r" if rerun else "")
        eaves.handle(topics(self.base, run_id).config, encode(derived), True)

    def _published_before(self, k: int) -> HeardOutput | None:
        """The latest output before epoch ``k`` as its nodes published it, as the nodes read it
        (:func:`~nlagg_node.runtime.warmstart.latest_published`; None: none published)."""
        recent = [(r.epoch, r.output) for r in self.store.results(since=k - WARM_GAP, until=k)]
        assert self.configs is not None
        return latest_published(recent, self.configs.cfg.n)

    def _verifier(self) -> Verifier | None:
        """The deployment's public keys once its config is known: a record its node did not sign is
        refused, as the nodes refuse it (None: a deployment without identities)."""
        keys = None if self.configs is None else self.configs.identities
        return None if keys is None else Verifier(keys)

    def _result(self, topic: str, payload: bytes) -> None:
        """A node's :class:`~nlagg_node.runtime.outputs.EpochOutput`; a top-K output is stored by its
        first (largest) value."""
        try:
            msg = published_record(topic, payload, self._verifier())
            if msg.epoch > MAX_EPOCH:
                raise ValueError(f"epoch {msg.epoch} beyond {MAX_EPOCH}")
        except ValueError as exc:
            self.stray += 1
            log.warning("a result on %s is not one: %s", topic[:200], str(exc)[:200])
            return
        out = msg.output[0] if isinstance(msg.output, list) else msg.output
        self.results += self.store.add_result(Result(msg.epoch, msg.node, out, msg.iterations, msg.time))

    # The capture loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe to every epoch and capture until ``stop_epochs`` are closed (or cancelled)."""
        await self.transport.subscribe(f"{self.base}/#", qos=1)
        self.subscribed.set()
        try:
            await capture_until(self.finished, self._read, self._commit_loop)
        finally:
            self._summaries.shutdown(wait=False, cancel_futures=True)
            self._commit()
            for ep in self.live.values():
                for eaves in ep.runs():
                    eaves.transcript.close()

    async def _read(self) -> None:
        acking = self._acking
        async for raw in self.transport.messages():
            self._handled(self.route(raw))
            if acking is not None and commit_due(len(self._unacked), acking.backlog(), self._committed):
                self._commit()
            if self.finished.is_set():
                return

    def _commit(self) -> None:
        """Commit every open transcript, then acknowledge what they now hold."""
        for ep in self.live.values():
            for eaves in ep.runs():
                eaves.transcript.commit()
        if self._unacked and self._acking is not None:
            self._acking.ack(self._unacked)
        self._unacked = []
        self._committed = time.monotonic()

    async def _commit_loop(self, tg: asyncio.TaskGroup) -> None:
        tick = min(self.commit_every, 0.02) if self._acking is not None else self.commit_every
        last_check = 0.0
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self._unacked or now - self._committed >= self.commit_every:
                self._commit()
            if now - last_check >= self.commit_every:
                last_check = now
                for k in self._due():
                    self._begin_close(k, tg)
                if self._stop_at is not None:
                    self._check_stop()

    def _due(self) -> list[int]:
        """The epochs to close now: finished, or idle for ``complete_grace`` s after a later one began."""
        now = time.monotonic()
        due = []
        for k, ep in sorted(self.live.items()):
            for eaves in ep.runs():
                self._handled(eaves.tick())
            if self._ended(k, ep, now) or (k < self.newest and now - ep.seen >= self.complete_grace):
                due.append(k)
        return due

    def _ended(self, k: int, ep: _Epoch, now: float) -> bool:
        """Whether epoch ``k``'s runs are finished: its rerun's, or its first one's with no rerun to
        come (a node published the epoch's output, or :data:`RERUN_WAIT` s went by)."""
        if ep.rerun is not None:
            return ep.rerun.finished.is_set()
        if not ep.eaves.finished.is_set():
            return False
        if ep.done_at is None:
            ep.done_at = now
        wait = min(RERUN_WAIT, self.complete_grace)
        return now - ep.done_at >= wait or self.store.result_count(k) > 0

    def _handled(self, deliveries: list[Message]) -> None:
        if self._acking is not None:
            self._unacked += deliveries

    def _begin_close(self, k: int, tg: asyncio.TaskGroup) -> None:
        ep = self.live[k]
        for eaves in ep.runs():  # an x still waiting for its predecessors is judged now
            self._handled(eaves.tick(flush=True))
        self._commit()  # everything of epoch k is committed and acknowledged before it closes
        del self.live[k]
        self.closing.add(k)
        for eaves in ep.runs():
            eaves.transcript.close()
        tg.create_task(self._close(k, ep))

    async def _summary(self, transcript: Path) -> dict[str, Any]:
        return await asyncio.get_running_loop().run_in_executor(self._summaries, self.summarize, transcript)

    async def _close(self, k: int, ep: _Epoch) -> None:
        """Store the summary of epoch ``k`` (the attack on its transcripts), then prune."""
        summary = await self._summary(self.store.transcript_path(k))
        eaves = ep.eaves
        summary.update(captured=eaves.captured, rejected=eaves.rejected, finished=eaves.finished.is_set())
        band = None if self.configs is None else self.configs.band(k, self._published_before(k))
        if band is not None and "nodes" in summary:  # a warm run: shell values expose no value
            summary = judge_warm(summary, band)
        if ep.rerun is not None:
            rerun = await self._summary(self.store.transcript_path(k, rerun=True))
            eaves = ep.rerun
            rerun.update(captured=eaves.captured, rejected=eaves.rejected, finished=eaves.finished.is_set())
            summary = with_rerun(summary, rerun)
        summary["epoch"] = k
        self.store.close_epoch(k, summary)
        self.closing.discard(k)
        log.info("epoch %d closed: exposed %s, output %s", k, summary.get("exposed"), summary.get("output"))
        self.on_event(
            "epoch_closed",
            epoch=k,
            output=summary.get("output"),
            exposed=summary.get("exposed", []),
            complete=summary.get("complete", False),
        )
        if self.keep_epochs is not None:
            for gone in self.store.prune(self.keep_epochs):
                self.on_event("pruned", epoch=gone)
        self._check_stop()

    def _check_stop(self) -> None:
        """Once ``stop_epochs`` are closed, the capture waits for the last one's published results (at
        most ``complete_grace`` s: the nodes publish them as the epoch ends), then finishes."""
        if self.stop_epochs is None or self.finished.is_set():
            return
        if self._stop_at is None:
            if self.store.closed_count() < self.stop_epochs:
                return
            self._stop_at = time.monotonic() + (self.complete_grace if self.captured else 0.0)
        last = [r for r in self.store.epochs() if r.state != "open"][-1]
        n = int((last.summary or {}).get("n", 0))
        if time.monotonic() >= self._stop_at or self.store.result_count(last.epoch) >= n:
            self.finished.set()


def with_rerun(warm: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """The summary of an epoch whose warm run fell back: its cold rerun's (the output the nodes
    published, and the intervals: the rerun runs every node's own value, where the warm run may
    run a shell value instead), with ``exposed`` every node exposed in either run (the adversary
    saw both), ``iterations`` both runs' (as the nodes count them) and the warm run's own summary
    under ``warm``."""
    out = dict(rerun)
    out["exposed"] = sorted(set(warm.get("exposed", [])) | set(rerun.get("exposed", [])))
    its = (warm.get("iterations"), rerun.get("iterations"))
    if all(isinstance(i, int) for i in its):
        out["iterations"] = sum(i for i in its if isinstance(i, int))
    for key in ("captured", "rejected"):
        out[key] = int(warm.get(key, 0)) + int(rerun.get(key, 0))
    out["warm"] = warm
    return out


def _event(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, **fields}), flush=True)


def _say(console: Any, events: bool, live: bool) -> Events:
    """What the capture reports as it goes: JSON lines, or (without the live table) plain lines."""

    def say(kind: str, **fields: Any) -> None:
        if events:
            _event(kind, **fields)
        elif not live and kind == "exposure":
            where = f"epoch {fields['epoch']}: node {fields['node']} exposed at t={fields['t']}"
            console.print(f"{where}: s = {fields['value']!r}")
        elif not live and kind == "epoch_closed":
            exposed = ", ".join(map(str, fields["exposed"])) or "none"
            whole = "" if fields["complete"] else " (incomplete)"
            console.print(
                f"epoch {fields['epoch']} closed{whole}: output {fields['output']}, exposed {exposed}"
            )
        elif not live and kind == "pruned":
            console.print(f"epoch {fields['epoch']}: raw transcript deleted, its summary kept")

    return say


async def run_epoch_eavesdropper(
    broker: str | Sequence[str],
    run_id: str,
    folder: Path,
    session: CaptureSession = DEFAULT_SESSION,
    *,
    summarize: Summarize,
    keep_epochs: int | None = None,
    epochs: int | None = None,
    configs: EpochConfigs | None = None,
    drift: float | None = 0.0,
) -> EpochCapture:
    """``nlagg eavesdrop --continuous``: capture every epoch of deployment ``prefix/run_id`` into the
    epoch store ``folder`` until ``epochs`` are closed, ``stop_after`` s, or a signal.

    With ``events``: JSON lines ``subscribed``, ``epoch``, ``exposure`` (with its epoch),
    ``epoch_closed``, ``pruned``, ``finished``. ``configs``: the deployment's public config, from
    which each run's configuration is derived (:class:`EpochConfigs`; None: from its retained
    ``P/R/config`` and ``drift``). ``broker``: one broker (a deployment's broker, or one of its
    cluster's members that keeps each publisher's order), or every site broker of a deployment with
    bridged sites, captured at once (:class:`~adversary.capture.merged.MergedSubscriber`: each
    epoch's x's in causal order, each delivery acknowledged to its own site, a bridged copy stored
    once).
    """
    from rich.console import Console
    from rich.live import Live

    brokers = [broker] if isinstance(broker, str) else list(broker)
    if not brokers:
        raise ConfigError("broker", brokers, "give at least one broker")
    console = Console()
    live, events, stop_after = session.shows_live, session.events, session.stop_after
    # As a single run's transcript: an existing store is checked before connecting, a new one created
    # only once the broker answered (nothing left behind by a capture that never connects).
    check_run_id(run_id)  # a bad name is refused before connecting
    check_prefix(session.prefix)
    existing = await asyncio.to_thread(Path(folder).exists)
    store = EpochStore(folder, session.prefix, run_id) if existing else None
    try:
        for url in brokers:
            if await accepts_anonymous(url, tls=session.tls):
                from .eavesdropper import ANONYMOUS_WARNING

                log.warning(ANONYMOUS_WARNING, url)
        subscribers = [session.subscriber(url, f"nlagg-{run_id}-epochs-eavesdropper") for url in brokers]
        async with subscribers[0] if len(subscribers) == 1 else MergedSubscriber(subscribers) as source:
            store = store or EpochStore(folder, session.prefix, run_id)
            capture = EpochCapture(
                source,
                store,
                summarize=summarize,
                keep_epochs=keep_epochs,
                stop_epochs=epochs,
                on_event=_say(console, events, live),
                configs=configs,
                drift=drift,
            )
            task = asyncio.create_task(capture.run())
            on_stop_signal(task.cancel)
            await capture.subscribed.wait()
            if events:
                _event("subscribed")
            if live:
                with Live(console=console, refresh_per_second=4) as view:
                    await _until_done(capture, task, stop_after, view)
            else:
                await _until_done(capture, task, stop_after, None)
    finally:
        if store is not None:
            store.close()
    with EpochStore(folder, read_only=True) as done:
        closed = [r.epoch for r in done.epochs() if r.state != "open"]
    if events:
        counts = {
            "late": capture.late,
            "stray": capture.stray,
            "cleared": capture.cleared,
            "reruns": capture.reruns,
        }
        _event("finished", epochs=closed, captured=capture.captured, **counts)
    else:
        console.print(
            f"{capture.captured} messages captured into {folder}: {len(closed)} epochs closed,"
            f" {capture.late} late, {capture.stray} outside every epoch, {capture.cleared} cleared retained,"
            f" {capture.reruns} of cold reruns"
        )
    return capture


async def _until_done(
    capture: EpochCapture, task: asyncio.Task[None], stop_after: float | None, view: Any
) -> None:
    """Wait for the capture ``task`` (refreshing the live ``view``: the current epoch's table), at most
    ``stop_after`` seconds. A capture failure is raised."""
    try:
        async with asyncio.timeout(stop_after):
            while view is not None and not task.done():
                await asyncio.wait({task}, timeout=0.25)
                if (eaves := capture.current) is not None:
                    view.update(live_table(eaves))
            await asyncio.wait({task})
            if not task.cancelled():
                task.result()
    except TimeoutError:
        pass
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
