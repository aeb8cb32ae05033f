"""One eavesdropper for every epoch of a continuous deployment, into one epoch store.

``nlagg eavesdrop --continuous --run-id R --prefix P --transcript DIR`` subscribes to ``P/R/#`` once
and routes each message by its first level: ``e{k}`` to epoch k's own
:class:`~adversary.capture.eavesdropper.Eavesdropper` (its transcript, live replay and stop rule,
unchanged: epoch k is run ``e{k}`` under prefix ``P/R``, and its retained config opens it),
``results`` to the nodes' published outputs. Everything goes to an
:class:`~adversary.transcript.store.EpochStore` (:mod:`adversary.transcript.store`).

An epoch closes when its eavesdropper is finished (every node done, the transcript complete), or,
once a later epoch has begun, after ``complete_grace`` seconds without a message of it (a node
absent for that epoch never says ``done``). Closing stores its summary (the attack on its
transcript, :func:`adversary.epochs.epoch_summary`) and, with ``keep_epochs`` N, deletes the raw
transcripts of all but the newest N closed epochs. A message of an epoch already closed (a
retained config or status sent again at every resubscription) is counted as ``late`` and not stored.
An empty payload (a node clearing its retained status or key of the epoch before, as every node
does once its output is out) is counted as ``cleared``, and a message of an epoch's cold rerun
``e{k}r`` (a warm start that fell back: docs/continuous.md) as ``reruns``; neither is stored.

As in the single-run capture, a message is acknowledged to the broker only after the transcript
holding it is committed, and the store keeps which epochs are open: a restarted eavesdropper
reopens them (their transcripts resume) and loses nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nlagg_node.errors import ConfigError
from nlagg_node.lifetime import on_stop_signal
from nlagg_node.runtime.outputs import EpochOutput
from nlagg_node.runtime.tls import TlsSettings
from nlagg_node.runtime.transport import Message, Subscriber

from ..live import Exposure
from ..transcript.store import MAX_EPOCH, EpochStore, Result, epoch_of, epoch_run_id
from ..transcript.writer import Transcript
from .eavesdropper import Eavesdropper, live_table
from .merged import Acknowledging
from .subscriber import AckingSubscriber, accepts_anonymous

__all__ = ["MAX_OPEN_EPOCHS", "EpochCapture", "run_epoch_eavesdropper"]

log = logging.getLogger("nlagg.eavesdropper")


MAX_OPEN_EPOCHS = 16
"""Epochs captured at once, at most: a client publishing under many ``e{k}`` cannot make the capture
open a transcript (a file, an eavesdropper) for each; a message that would open one more is
counted ``stray`` and not stored. A deployment has one epoch open, two while one ends."""


@dataclass
class _Epoch:
    """An epoch being captured: its eavesdropper (and transcript), and when it last got a message."""

    eaves: Eavesdropper
    seen: float


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
        self.live: dict[int, _Epoch] = {}
        self.closing: set[int] = set()
        self.captured = self.late = self.stray = self.results = self.cleared = self.reruns = 0
        self._reruns_seen: set[str] = set()
        self.subscribed = asyncio.Event()
        self.finished = asyncio.Event()
        self._acking = transport if isinstance(transport, Acknowledging) else None
        self._unacked: list[Message] = []
        self._committed = time.monotonic()
        self._stop_at: float | None = None  # when a capture that closed its epochs stops waiting
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
        self.captured += 1
        rest = topic[len(self.base) + 1 :] if topic.startswith(self.base + "/") else ""
        level, _, tail = rest.partition("/")
        if not payload and rest:  # a node clearing its retained status or key of an older epoch
            self.cleared += 1
            return
        if level == "results":
            self._result(tail, payload)
            return
        k = epoch_of(level)
        if k is None and level.endswith("r") and epoch_of(level[:-1]) is not None:
            self._rerun(level)
            return
        if k is None:
            self.stray += 1
            log.warning("captured a message outside every epoch of %s on %s: not stored", self.base, topic)
            return
        ep = self.live.get(k)
        if ep is None:
            if k in self.closing or self.store.state(k) not in (None, "open"):
                self.late += 1  # a retained message sent again, or a straggler of a closed epoch
                log.debug("epoch %d is closed: a late message on %s is not stored", k, topic)
                return
            if len(self.live) + len(self.closing) >= MAX_OPEN_EPOCHS:
                self.stray += 1
                log.warning("%d epochs open already: a message on %s is not stored", MAX_OPEN_EPOCHS, topic)
                return
            ep = self._open(k)
        ep.seen = time.monotonic()
        ep.eaves.handle(topic, payload, retained)

    def _rerun(self, level: str) -> None:
        """A message of an epoch's cold rerun ``e{k}r`` (its warm run fell back,
        :func:`nlagg_node.runtime.epochs.rerun_run_id`): counted, not stored (the store holds one
        transcript per epoch, its warm run's)."""
        self.reruns += 1
        if level not in self._reruns_seen:
            self._reruns_seen.add(level)
            log.info("epoch %s fell back: its cold rerun %s is counted, not stored", level[1:-1], level)

    def _open(self, k: int) -> _Epoch:
        self.store.open_epoch(k)
        transcript = Transcript(self.store.transcript_path(k), run_id=epoch_run_id(k), prefix=self.base)
        config = transcript.config()  # a resumed epoch: its replay catches up at once

        def exposed(e: Exposure) -> None:
            self.on_event("exposure", epoch=k, node=e.node, t=e.t, value=e.value, how=e.how)

        eaves = Eavesdropper(
            self.transport, transcript, on_exposure=exposed, config=config, complete_grace=self.complete_grace
        )
        ep = self.live[k] = _Epoch(eaves, time.monotonic())
        self.newest = max(self.newest, k)
        log.info("epoch %d: capturing into %s", k, transcript.path)
        self.on_event("epoch", epoch=k)
        return ep

    def _result(self, tail: str, payload: bytes) -> None:
        """A node's :class:`~nlagg_node.runtime.outputs.EpochOutput`; a top-K output is stored by its
        first (largest) value."""
        try:
            msg = EpochOutput.model_validate_json(payload)
            if tail != str(msg.node):
                raise ValueError(f"node {msg.node} on the topic of node {tail!r}")
            if msg.epoch > MAX_EPOCH:
                raise ValueError(f"epoch {msg.epoch} beyond {MAX_EPOCH}")
        except (ValidationError, ValueError) as exc:
            self.stray += 1
            log.warning("a result on %s/results/%s is not one: %s", self.base, tail[:40], str(exc)[:200])
            return
        out = msg.output[0] if isinstance(msg.output, list) else msg.output
        self.results += self.store.add_result(Result(msg.epoch, msg.node, out, msg.iterations, msg.time))

    # The capture loop ------------------------------------------------------------------------
    async def run(self) -> None:
        """Subscribe to every epoch and capture until ``stop_epochs`` are closed (or cancelled)."""
        await self.transport.subscribe(f"{self.base}/#", qos=1)
        self.subscribed.set()
        try:
            async with asyncio.TaskGroup() as tg:
                committer = tg.create_task(self._commit_loop(tg))
                reader = tg.create_task(self._read())
                finished = tg.create_task(self.finished.wait())
                try:
                    await asyncio.wait({reader, finished}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (committer, reader, finished):
                        task.cancel()
        finally:
            self._commit()
            for ep in self.live.values():
                ep.eaves.transcript.close()

    async def _read(self) -> None:
        acking = self._acking
        async for raw in self.transport.messages():
            self.handle(raw.topic, raw.payload, raw.retain)
            if acking is not None:
                self._unacked.append(raw)
                pending = len(self._unacked)
                idle = acking.backlog() == 0
                if pending >= 256 or (idle and (pending >= 16 or time.monotonic() - self._committed >= 0.02)):
                    self._commit()
            if self.finished.is_set():
                return

    def _commit(self) -> None:
        """Commit every open transcript, then acknowledge what they now hold."""
        for ep in self.live.values():
            ep.eaves.transcript.commit()
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
            ep.eaves.tick()
            if ep.eaves.finished.is_set() or (k < self.newest and now - ep.seen >= self.complete_grace):
                due.append(k)
        return due

    def _begin_close(self, k: int, tg: asyncio.TaskGroup) -> None:
        self._commit()  # everything of epoch k is committed and acknowledged before it closes
        ep = self.live.pop(k)
        self.closing.add(k)
        ep.eaves.transcript.close()
        tg.create_task(self._close(k, ep.eaves))

    async def _close(self, k: int, eaves: Eavesdropper) -> None:
        """Store the summary of epoch ``k`` (the attack on its transcript), then prune."""
        summary = await asyncio.to_thread(self.summarize, self.store.transcript_path(k))
        summary.update(
            epoch=k, captured=eaves.captured, rejected=eaves.rejected, finished=eaves.finished.is_set()
        )
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
    *,
    summarize: Summarize,
    prefix: str = "nlagg",
    username: str | None = None,
    password: str | None = None,
    live: bool = True,
    stop_after: float | None = None,
    events: bool = False,
    tls: TlsSettings | None = None,
    keep_epochs: int | None = None,
    epochs: int | None = None,
) -> EpochCapture:
    """``nlagg eavesdrop --continuous``: capture every epoch of deployment ``prefix/run_id`` into the
    epoch store ``folder`` until ``epochs`` are closed, ``stop_after`` s, or a signal.

    With ``events``: JSON lines ``subscribed``, ``epoch``, ``exposure`` (with its epoch),
    ``epoch_closed``, ``pruned``, ``finished``. One broker (a deployment's broker, or one of its
    cluster's members that keeps each publisher's order).
    """
    from rich.console import Console
    from rich.live import Live

    brokers = [broker] if isinstance(broker, str) else list(broker)
    if len(brokers) != 1:
        raise ConfigError("broker", brokers, "a continuous capture reads one broker")
    console = Console()
    live = live and not events
    store = EpochStore(folder, prefix, run_id)
    try:
        if await accepts_anonymous(brokers[0], tls=tls):
            from .eavesdropper import ANONYMOUS_WARNING

            log.warning(ANONYMOUS_WARNING, brokers[0])
        connect_within = 30.0 if stop_after is None else max(0.1, min(30.0, stop_after))
        source = AckingSubscriber(
            brokers[0],
            client_id=f"nlagg-{run_id}-epochs-eavesdropper",
            username=username,
            password=password,
            tls=tls,
            connect_timeout=connect_within,
        )
        async with source:
            capture = EpochCapture(
                source,
                store,
                summarize=summarize,
                keep_epochs=keep_epochs,
                stop_epochs=epochs,
                on_event=_say(console, events, live),
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
