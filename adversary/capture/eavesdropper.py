"""The passive eavesdropper: subscribe to ``P/R/#``, store everything, replay the attack live.

``nlagg eavesdrop --broker URL --run-id R --transcript transcript.sqlite`` runs it through
:func:`run_eavesdropper` (on one broker or on the bridged site brokers of one run), with a live
rich table, or JSON-line events for a supervising process (the testbed), and a summary at the
end. Every message goes to the
:class:`~adversary.transcript.writer.Transcript` first, then to the :class:`~adversary.live.LiveReplay`,
which reports an exposure as soon as the iteration that reveals it is complete. Over the MQTT
adapter with ``manual_ack`` (:class:`~nlagg_node.runtime.mqtt.MqttTransport`, what ``nlagg
eavesdrop`` uses) a message is acknowledged to the broker only after the transaction holding it is
committed (whenever the inbox runs dry, every 256 messages, and every ``commit_every`` seconds):
killed at any moment, the eavesdropper loses nothing, since the broker redelivers the rest to its
persistent session.
It stops when every node of the run has published ``done`` and every x and z^(0) of the run is in
the transcript (after ``complete_grace`` seconds it stops anyway and reports what is missing), or
on cancellation/timeout. After a reconnection that found its session gone (a broker crash lost
what it had queued for the capture), it waits at least until the nodes' last republish
(:data:`~nlagg_node.runtime.peers.RESEND_AFTER`) could have reached it before it gives up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from nlagg_node.departure import announced
from nlagg_node.errors import ConfigError
from nlagg_node.lifetime import on_stop_signal
from nlagg_node.runtime.mqtt import accepts_anonymous
from nlagg_node.runtime.peers import RESEND_AFTER
from nlagg_node.runtime.public import config_from_msg
from nlagg_node.runtime.tls import TlsSettings
from nlagg_node.runtime.transport import Message, Subscriber
from nlagg_node.runtime.wire import (
    AdvStateMsg,
    ConfigMsg,
    StatusMsg,
    WireMessage,
    XMsg,
    Z0Msg,
    check_prefix,
    check_run_id,
    topics,
)
from nlagg_node.schedule import phase_c, plan_phases, sealed_groups_of
from nlagg_node.valuemap import ValueScale, scale_for

from ..live import BRANCH_NAMES, Exposure, LiveReplay
from ..transcript.arrays import public_z0
from ..transcript.writer import Captured, Transcript
from .merged import Acknowledging, CausalOrder, MergedSubscriber
from .session import DEFAULT_SESSION, CaptureSession, capture_until, commit_due

__all__ = ["ANONYMOUS_WARNING", "Eavesdropper", "NodeView", "live_table", "run_eavesdropper"]

log = logging.getLogger("nlagg.eavesdropper")

RESEND_MARGIN = 3.0
"""Seconds past a node's last republish (after a lost session) that the capture still waits for it:
a node reconnects at about the time the capture does, and a loaded machine delays its timers."""

ANONYMOUS_WARNING = (
    "broker %s admits anonymous clients (allow_anonymous true): anyone can publish as any node, so"
    " nothing protects the run's integrity; use the per-node ACL of nlagg deploy plan"
)


@dataclass
class NodeView:
    """What the eavesdropper knows about one node so far."""

    iterations: int = 0
    state: str = "-"
    branch: str = "-"
    corrupted: bool = False
    private_value: float | None = None  # forwarded by the node itself when corrupted
    exposed: Exposure | None = None
    output: list[float] = field(default_factory=list)
    departed: int | None = None  # left the run at this iteration (its neighbours' statuses say so)


def excuse_departed(
    missing: tuple[int, int],
    gone: dict[int, int],
    t_total: int,
    config: ConfigMsg,
    *,
    early_stop: bool = False,
) -> tuple[int, int]:
    """``(x, z0)`` still missing, less what departed nodes never sent: their x's from their
    departure on (with ``early_stop`` the count of missing x's already expects none of them:
    :meth:`~adversary.transcript.reader.TranscriptReader.complete`), and the z^(0) of every edge they
    had left before that dual group's exchange."""
    if not gone:
        return missing
    mx = missing[0] if early_stop else missing[0] - sum(t_total - t for t in gone.values())
    excused, start, group = 0, 0, ""
    for p in config.phases:
        if p["group"] != group:
            group = str(p["group"])
            excused += 2 * sum(
                1 for a, b in config.edges if min(gone.get(a, t_total), gone.get(b, t_total)) <= start
            )
        start += int(p["t_len"])
    return max(mx, 0), max(missing[1] - excused, 0)


class Eavesdropper:
    """Capture one run through ``transport`` into ``transcript``.

    Parameters
    ----------
    config : the run's public configuration when known in advance; otherwise the retained
        ``P/R/config`` message provides it (the replay and the stop condition need n and the graph).
    on_exposure : called with each :class:`Exposure` the moment the replay finds it.
    commit_every : seconds between SQLite commits.
    complete_grace : seconds to wait, once every node is done, for x's and z^(0)'s still missing.
    reorder : hold back an x captured before the x's it was computed from, even from one broker:
        for a broker cluster (RabbitMQ, EMQX, VerneMQ), whose members forward messages from
        different publishers on different paths, so one subscriber may see them out of causal
        order. Always on over several brokers (a :class:`~adversary.capture.merged.MergedSubscriber`).
    reorder_grace : with ``reorder``, the longest such an x waits
        (:class:`~adversary.capture.merged.CausalOrder`).
    """

    def __init__(
        self,
        transport: Subscriber,
        transcript: Transcript,
        *,
        on_exposure: Callable[[Exposure], None] | None = None,
        commit_every: float = 0.25,
        config: ConfigMsg | None = None,
        complete_grace: float = 10.0,
        reorder: bool = False,
        reorder_grace: float = 5.0,
    ) -> None:
        self.transport = transport
        self.transcript = transcript
        self.topics = topics(transcript.prefix, transcript.run_id)
        self.on_exposure = on_exposure
        self.commit_every = commit_every
        self.config: ConfigMsg | None = None
        self.replay: LiveReplay | None = None
        self.scale = ValueScale()  # the run's public value range, once its config is known
        self.nodes: dict[int, NodeView] = {}
        self.exposures: list[Exposure] = []
        self.captured = 0
        self.stored = 0
        self.rejected = 0
        self.subscribed = asyncio.Event()
        self.finished = asyncio.Event()
        self.started = time.time()
        self.complete_grace = complete_grace
        self.missing: tuple[int, int] = (0, 0)  # x's and z^(0)'s missing when the capture stopped
        self.missing_adv = 0  # corrupted nodes' forwarded states missing when it stopped
        self._all_done_since: float | None = None
        self._sessions_lost = 0
        self._session_lost_at: float | None = None  # when the capture last came back without its session
        self._unacked: list[Message] = []
        # Checked once: a Protocol's isinstance is slow, and this one is per message.
        self._acking: Acknowledging | None = transport if isinstance(transport, Acknowledging) else None
        # Over several bridged brokers, or cluster members, an x may overtake those it was computed
        # from: hold it back. One Mosquitto keeps causal order; then the hot path skips this.
        reorder = reorder or isinstance(transport, MergedSubscriber)
        self.order = CausalOrder(transcript, reorder_grace) if reorder else None
        self._committed = time.monotonic()
        if config is not None:  # known in advance (a run.toml): no need to wait for the retained one
            transcript.set_config(config)
            self._on_config(config)

    def view(self, i: int) -> NodeView:
        v = self.nodes.get(i)
        if v is None:  # not setdefault: that builds a NodeView for every message
            v = self.nodes[i] = NodeView()
        return v

    async def run(self) -> None:
        """Subscribe, capture until every node is done, commit. Cancel it to stop earlier.

        A background loop commits every ``commit_every`` seconds even when traffic stops, so a
        reader of the file (or a crash) never misses more than that.
        """
        await self.transport.subscribe(self.topics.all, qos=1)
        self.subscribed.set()
        try:
            await capture_until(self.finished, self._read, lambda _: self._commit_loop())
        finally:
            self._commit()
            self.stored = self.transcript.count()

    async def _read(self) -> None:
        acking, order, handle = self._acking, self.order, self.handle
        async for raw in self.transport.messages():
            if acking is not None and acking.lost_sessions() != self._sessions_lost:
                self._session_lost()
            if order is None:  # one broker: the hot path
                handle(raw.topic, raw.payload, raw.retain)
                if acking is not None:
                    self._unacked.append(raw)
            else:
                self._unacked += self.take([raw])
            if acking is not None and commit_due(len(self._unacked), acking.backlog(), self._committed):
                self._commit()
            if self.finished.is_set():
                return

    def take(self, raws: list[Message], *, expired: bool = False) -> list[Message]:
        """Handle captured messages, over several brokers in causal order; those handled (to be
        acknowledged once committed: an x still waiting for its predecessors is not among them).

        ``expired``: x's that waited their grace for their predecessors, judged now as they are.
        """
        order = self.order
        queue = [(raw, expired) for raw in raws]
        handled: list[Message] = []
        while queue:
            raw, now = queue.pop()
            if order is not None and not now and order.offer(raw):
                continue
            stored = self.handle(raw.topic, raw.payload, raw.retain)
            handled.append(raw)
            if order is not None:
                queue += [(r, False) for r in order.released(stored)]
        return handled

    def _commit(self) -> None:
        """Commit the transcript, then acknowledge what it now holds (never the other way round)."""
        self.transcript.commit()
        if self._unacked and self._acking is not None:
            self._acking.ack(self._unacked)
        self._unacked = []
        self._committed = time.monotonic()

    async def _commit_loop(self) -> None:
        # Over an acking subscriber, what waits for its commit also waits for its ack (a broker's
        # in-flight window may be small): tick often, commit only when something is pending.
        tick = (
            min(self.commit_every, 0.02) if isinstance(self.transport, Acknowledging) else self.commit_every
        )
        last_check = 0.0
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if self._acking is not None and self._acking.lost_sessions() != self._sessions_lost:
                self._session_lost()  # seen here too when no message has come since the reconnection
            if self.order is not None:
                self._unacked += self.take(self.order.expired(), expired=True)
            if self._unacked or now - self._committed >= self.commit_every:
                self._commit()
            if now - last_check >= self.commit_every:
                last_check = now
                self._check_finished()

    def tick(self, *, flush: bool = False) -> list[Message]:
        """What the commit loop does besides committing, for a driver that feeds :meth:`take`
        itself (:mod:`adversary.capture.epochs`): notice a lost session, judge the x's that waited
        their grace for their predecessors (``flush``: every one still waiting, as the run closes),
        check whether the run is over. The messages now handled, to be acknowledged once committed."""
        if self._acking is not None and self._acking.lost_sessions() != self._sessions_lost:
            self._session_lost()
        handled = []
        if self.order is not None:
            handled = self.take(self.order.expired(0.0 if flush else None), expired=True)
        self._check_finished()
        return handled

    def handle(self, topic: str, payload: bytes, retained: bool = False) -> WireMessage | None:
        """Store one message, then update the views and the live replay; the message if valid.

        The transcript stores whatever arrives (as invalid, with the reason, when the nodes would
        not have used it); what follows only sees valid messages of the run, bounded by its
        validated configuration. Should it fail anyway, the message stays stored and the capture
        goes on: one message can never stop it.
        """
        batch = self.transcript.add_batch(topic, payload, retained=retained)
        if batch is None:
            return self._took(topic, self.transcript.add(topic, payload, retained=retained))
        # A host's x's of an iteration (one t): what waited for one of them waits for all.
        taken = [self._took(topic, parsed) for parsed in batch]
        return next((msg for msg in taken if msg is not None), None)

    def _took(self, topic: str, parsed: Captured) -> WireMessage | None:
        """Count one stored message (one x of a host's batch: one message, as its node alone
        publishes it) and update the views with it; the message if valid."""
        self.captured += 1
        if parsed is None:
            self.rejected += 1
            log.warning("captured a message the nodes would not use on %s", topic)
            return None
        try:
            self._update(parsed[1])
        except Exception:  # the live view is best effort; the stored transcript is what counts
            log.exception("message on %s stored, but updating the live view failed", topic)
        return parsed[1]

    def _update(self, msg: WireMessage) -> None:
        if isinstance(msg, ConfigMsg):
            self._on_config(msg)
        elif isinstance(msg, Z0Msg):
            if self.replay is not None:
                self.replay.set_z0(msg.group, msg.from_, msg.to, msg.z)
                self._advance()  # the iteration it completes may already hold every x
        elif isinstance(msg, XMsg):
            v = self.view(msg.node)
            v.iterations = max(v.iterations, msg.t + 1)
            # Its stop fields are in the rules' record (PhaseEnds) already: the transcript accepted it.
            if self.replay is not None and self.replay.add_x(msg.node, msg.t, msg.x):
                self._advance()
        elif isinstance(msg, AdvStateMsg):
            v = self.view(msg.node)
            v.corrupted = True
            if self.replay is not None:
                self.replay.add_state(msg)  # its edges' z^(0) of a group starting at msg.t
            v.private_value = self.scale.user_float(msg.s)
        elif isinstance(msg, StatusMsg):
            v = self.view(msg.node)
            if v.state != "done" or msg.state == "done":
                v.state = msg.state
            else:
                log.info(
                    "node %d: status %r after 'done' (a redelivery or a restart) ignored", msg.node, msg.state
                )
            if msg.output is not None:
                v.output = list(msg.output)
            if (msg.departed or msg.state == "leaving") and self.replay is not None:
                self._depart([*announced([msg.departed]), *([msg.node] if msg.state == "leaving" else [])])
                self._advance()
            self._check_finished()

    def _depart(self, claimed: Iterable[int]) -> None:
        """Replay the departures of ``claimed`` nodes that the run's statuses establish: a node gone
        for every neighbour (its own ``leaving``, or each neighbour's word), from the iteration the
        protocol's :class:`~nlagg_node.protocol.Departures` gives. One neighbour's claim alone
        removes nobody, as it silences the node for no other receiver."""
        rules = self.transcript.rules
        if rules is None or self.replay is None:
            return
        for j in claimed:
            at = rules.departures.gone_from(j)
            if at < rules.t_total:
                self.view(j).departed = at
                self.replay.depart(j, at)

    def _on_config(self, msg: ConfigMsg) -> None:
        if self.config is not None:
            return
        self.config = msg
        log.info("run configuration received (%d nodes)", msg.n)
        cfg, edges = config_from_msg(msg)
        self.scale = scale_for(cfg)
        phases = plan_phases(cfg)
        cs = [phase_c(cfg, p) for p in phases]
        rules = self.transcript.rules
        assert rules is not None  # a config the transcript stored as valid set them
        ends = rules.ends if cfg.early_stop else None  # where the nodes stopped: the rules' record
        sealed = sealed_groups_of(cfg, phases)
        self.replay = LiveReplay(cfg.n, edges, phases, cs, cfg.theta, sealed, ends=ends)
        # Catch up on what arrived before the config.
        for group, arr in public_z0(cfg, edges, phases, self.transcript.z0(cfg.n, edges)).items():
            self.replay.z0[group] = arr
        for state in self.transcript.adv_states():
            self.replay.add_state(state)
        self._depart(announced([st.departed for st in self.transcript.statuses().values()]))
        x = self.transcript.x(cfg.n, self.replay.t_total)  # sized by the validated config only
        stops = self.transcript.x_stops(cfg.n, self.replay.t_total) if cfg.early_stop else {}
        if ends is not None:  # what a transcript continued after a restart held (noted once)
            ends.note_stops(stops)
        for i, t in zip(*np.nonzero(~np.isnan(x)), strict=True):
            self.replay.add_x(int(i), int(t), float(x[i, t]))
        self._advance()
        self._check_finished()

    def _advance(self) -> None:
        assert self.replay is not None
        t_before = self.replay.t_next
        for found in self.replay.advance():
            exp = self._in_user_units(found)
            v = self.view(exp.node)
            if v.exposed is None:
                v.exposed = exp
            if self.view(exp.node).corrupted:
                continue
            self.exposures.append(exp)
            if self.on_exposure is not None:
                self.on_exposure(exp)
        if self.replay.t_next > t_before:
            codes: list[int] = self.replay.branch[:, self.replay.t_next - 1].tolist()
            for i, code in enumerate(codes):
                self.view(i).branch = BRANCH_NAMES[code]

    def _in_user_units(self, exp: Exposure) -> Exposure:
        """The replay works on the wire's (protocol) scale; exposures are reported in the user's units."""
        return replace(exp, value=self.scale.user_float(exp.value))

    def _session_lost(self) -> None:
        """The capture came back without its session: what the broker had queued for it is gone."""
        assert self._acking is not None
        self._sessions_lost = self._acking.lost_sessions()
        self._session_lost_at = time.monotonic()
        log.warning("the broker lost this capture's session: the window waits until every node is seen")
        self.transcript.resync()

    def _give_up_at(self) -> float:
        """When a capture still missing messages stops waiting (``time.monotonic()``): ``complete_grace``
        after every node is done, and never before the last republish of a node that lost its
        session when this capture lost its own (the broker crashed) could have arrived."""
        assert self._all_done_since is not None
        deadline = self._all_done_since + self.complete_grace
        if self._session_lost_at is not None:
            deadline = max(deadline, self._session_lost_at + RESEND_AFTER[-1] + RESEND_MARGIN)
        return deadline

    def _check_finished(self) -> None:
        if self.config is None or self.finished.is_set() or self.replay is None:
            return
        # Done once a node has said so: the transcript, not the latest view, which a QoS 1 redelivery
        # or a retained status re-sent after a reconnection may have set back to an earlier state.
        gone = self.replay.departed
        done = len((self.transcript.done_nodes() | set(gone)) & set(range(self.config.n)))
        if done == self.config.n:
            groups = {str(p["group"]) for p in self.config.phases}
            early = bool(self.config.run.get("early_stop", False))
            rules = self.transcript.rules
            missing = self.transcript.complete(
                self.config.n,
                self.replay.t_total,
                self.config.edges,
                groups,
                early_stop=early,
                phases=self.replay.phases if early else None,
                departed=gone,
                known=rules.ends.by_phase if early and rules is not None else None,  # halting x's read
            )
            self.missing = excuse_departed(missing, gone, self.replay.t_total, self.config, early_stop=early)
            # A corrupted node's forwarded states count too: after a lost session the nodes
            # publish them again a few seconds later, and a capture that stopped first lost them.
            adv = self.missing_adv = self.transcript.missing_adv(self.config.n, self.replay.t_total)
            if self.missing != (0, 0) or adv:
                now = time.monotonic()
                if self._all_done_since is None:
                    self._all_done_since = now
                    log.info(
                        "every node is done; waiting for %d x, %d z0 and %d adversary states still missing",
                        *self.missing,
                        adv,
                    )
                if now < self._give_up_at():
                    return  # redeliveries, or the nodes' republishes after a lost session, may still come
                log.warning(
                    "every node is done but %d x, %d z0 and %d adversary states are missing; stopping",
                    *self.missing,
                    adv,
                )
            if self.replay is not None:
                for found in self.replay.advance(force=True):
                    exp = self._in_user_units(found)
                    if not self.view(exp.node).corrupted:
                        self.exposures.append(exp)
                        if self.on_exposure is not None:
                            self.on_exposure(exp)
            log.info(
                "every node is done and the transcript is complete (missing: %s, adversary states %d)",
                self.missing,
                adv,
            )
            self.finished.set()

    def departed(self) -> dict[int, int]:
        """The nodes that left the run: node -> the iteration it departed at."""
        return dict(self.replay.departed) if self.replay is not None else {}

    def honest_exposed(self) -> list[int]:
        """Honest nodes whose value the transcript exposed, ascending."""
        return sorted({e.node for e in self.exposures if not self.view(e.node).corrupted})


def live_table(eaves: Eavesdropper) -> Any:
    """A rich table: per node, iterations seen, its latest branch, and what is already exposed."""
    from rich.table import Table

    n = eaves.config.n if eaves.config is not None else (max(eaves.nodes, default=-1) + 1)
    title = f"run {eaves.transcript.run_id}: {eaves.captured} messages"
    if eaves.config is None:
        title += " (waiting for the retained config)"
    table = Table(title=title)
    for col in ("node", "state", "iterations", "last x", "revealed"):
        table.add_column(col)
    for i in range(n):
        v = eaves.nodes.get(i, NodeView())
        if v.corrupted:
            revealed = f"[yellow]corrupted: s = {v.private_value!r}[/yellow]"
        elif v.exposed is not None:
            revealed = f"[red]s = {v.exposed.value!r} (t={v.exposed.t}, {v.exposed.how})[/red]"
        else:
            revealed = "nothing yet"
        table.add_row(str(i), v.state, str(v.iterations), v.branch, revealed)
    return table


def _event(kind: str, **fields: object) -> None:
    print(json.dumps({"event": kind, **fields}), flush=True)


async def _warn_if_anonymous(brokers: list[str], tls: TlsSettings | None, events: bool) -> None:
    """Without per-node ACLs nothing protects the run's integrity: anyone can publish as any node."""
    for url in brokers:
        if await accepts_anonymous(url, tls=tls):
            log.warning(ANONYMOUS_WARNING, url)
            if events:
                _event("warning", message=ANONYMOUS_WARNING % url)


async def _until_done(
    eaves: Eavesdropper, task: asyncio.Task[None], stop_after: float | None, live: Any | None
) -> bool:
    """Wait for the capture ``task`` (refreshing the ``live`` view), at most ``stop_after`` seconds;
    whether it ended by itself. A capture failure is raised."""
    try:
        async with asyncio.timeout(stop_after):
            while live is not None and not task.done():
                await asyncio.wait({task}, timeout=0.25)
                live.update(live_table(eaves))
            await asyncio.wait({task})
            if not task.cancelled():
                task.result()
    except TimeoutError:
        return False
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return True


def _summarize(eaves: Eavesdropper, db: Path, events: bool, console: Any) -> None:
    if events:
        _event(
            "finished",
            complete=eaves.finished.is_set(),
            captured=eaves.captured,
            stored=eaves.stored,
            rejected=eaves.rejected,
            missing_x=eaves.missing[0],
            missing_z0=eaves.missing[1],
            missing_adv=eaves.missing_adv,
            exposed=eaves.honest_exposed(),
            departed={str(j): t for j, t in sorted(eaves.departed().items())},
        )
        return
    console.print(
        f"{eaves.captured} messages captured into {db} ({eaves.rejected} not protocol v1); "
        f"exposed honest nodes: {eaves.honest_exposed() or 'none'}"
    )
    for j, t in sorted(eaves.departed().items()):
        console.print(f"node {j} left the run at t={t} (its last x was x^({t - 1}))")


def writable_later(path: Path) -> bool:
    """Whether ``path`` exists (to be checked and continued now); if not, that it can be created once
    the capture has connected (its folder exists), else a :class:`ConfigError` before connecting."""
    if path.exists():
        return True
    if not path.parent.is_dir():
        raise ConfigError("transcript", str(path), f"its folder {path.parent} does not exist")
    return False


async def run_eavesdropper(
    broker: str | Sequence[str],
    run_id: str,
    db: Path,
    session: CaptureSession = DEFAULT_SESSION,
    *,
    config: ConfigMsg | None = None,
    broker_cluster: bool = False,
) -> Eavesdropper:
    """``nlagg eavesdrop``: capture until every node is done (or ``stop_after`` s), then print a summary.

    With ``events`` the output is JSON lines for a supervising process (the testbed):
    ``subscribed``, one ``exposure`` per exposed node the moment it is found, ``finished``.
    ``session``: the broker login, the topic prefix and what it shows (:class:`CaptureSession`).
    ``broker`` may list several brokers (the bridged site brokers of one run): the capture then
    subscribes at every one of them, into one transcript that holds each message once.
    ``broker_cluster``: the broker is a cluster whose members may forward the messages of different
    nodes out of causal order; an x that overtook those it was computed from waits for them.
    At start it asks the broker whether it admits anonymous clients and warns when it does:
    without per-node ACLs nothing protects the run's integrity (anyone can publish as any node;
    the transcript keeps what the nodes kept, which may be forged).
    """
    from rich.console import Console
    from rich.live import Live

    console = Console()
    live, events, stop_after = session.shows_live, session.events, session.stop_after
    brokers = [broker] if isinstance(broker, str) else list(broker)

    def report(e: Exposure) -> None:
        if events:
            _event("exposure", node=e.node, t=e.t, value=e.value, how=e.how)
        elif not live:
            console.print(f"exposed: node {e.node} at t={e.t} ({e.how}): s = {e.value!r}")

    def open_transcript() -> Transcript:
        return Transcript(db, run_id=run_id, prefix=session.prefix)

    # An existing transcript is checked (and continued) before connecting; a new one is created only
    # once the broker answered, so a capture that never connects leaves nothing behind.
    check_run_id(run_id)  # a bad name is refused before connecting
    check_prefix(session.prefix)
    transcript = open_transcript() if await asyncio.to_thread(writable_later, Path(db)) else None
    try:
        await _warn_if_anonymous(brokers, session.tls, events)
        subscribers = [session.subscriber(url, f"nlagg-{run_id}-eavesdropper") for url in brokers]
        async with subscribers[0] if len(subscribers) == 1 else MergedSubscriber(subscribers) as source:
            transcript = transcript or open_transcript()
            eaves = Eavesdropper(
                source, transcript, on_exposure=report, config=config, reorder=broker_cluster
            )
            task = asyncio.create_task(eaves.run())
            # SIGTERM/SIGINT stop the capture through the normal path: everything is committed.
            on_stop_signal(task.cancel)
            await eaves.subscribed.wait()
            if events:
                _event("subscribed")
            if live:
                with Live(live_table(eaves), console=console, refresh_per_second=4) as view:
                    done = await _until_done(eaves, task, stop_after, view)
            else:
                done = await _until_done(eaves, task, stop_after, None)
            if not done and not events:
                console.print(f"stopped after {stop_after:g} s")
    finally:
        if transcript is not None:
            transcript.close()
    _summarize(eaves, db, events, console)
    return eaves
