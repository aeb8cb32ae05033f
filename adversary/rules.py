"""The nodes' acceptance rules applied to the transcript: a thin driver of :mod:`nlagg_node.protocol`.

Every decision is the protocol's (:mod:`nlagg_node.protocol.accept`, the functions the nodes call);
this module keeps only the state the transcript needs to call them as the capture sees the run:

* the receivers' positions: the latest x seen of every node. A node that published x^(p) waits
  for x^(p), so this is a lower bound of its position; an x counts only when it lies in the window
  of every neighbour of its sender still there (:func:`~nlagg_node.protocol.lowest_position`).
  Mosquitto forwards the messages of one run to every subscriber in the order it received them, so
  an honest x_j^(t), published after every x_k^(t-1) of its neighbours, is seen after them too; a
  forged x_j^(t_now + 1500), which every node refuses, is refused here, while the real one that
  comes later is kept. Like a node, the transcript judges an identical copy sent again later anew;
* the senders' ends: where each node ended each phase (the x whose fields say it halts,
  :func:`~nlagg_node.protocol.halt_span`) and where it departed, from the departures its statuses
  establish (:func:`~nlagg_node.protocol.departure_claims`: a node's own ``leaving``, or a
  neighbour's observation of their shared edge; never a claim about a non-neighbour, nor one its
  subject contradicts, :func:`~nlagg_node.protocol.own_departure_error`: the transcript had its x's
  and no last will of it).

In a run with identities a message counts only with its sender's signature, an x with its sender's
key-chain element (the nodes' checks, :meth:`RunRules.forged`): what a broker password alone forges
is stored as rejected, with the reason.

When the broker lost the capture's session (a broker crash), the messages queued for it are gone
and the window has nothing to stand on: :meth:`RunRules.resync` suspends it until every node has
been seen again. The rules need the run's public configuration; every size they allocate comes
from it once validated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Self

from nlagg_node.protocol import (
    NO_HALT,
    OUTSIDE_WINDOW,
    X_WINDOW,
    Departures,
    RunShape,
    Verifier,
    admit,
    adv_error,
    departure_claims,
    halt_span,
    key_error,
    lowest_position,
    own_departure_error,
    signature_error,
    status_error,
    x_form_error,
    x_value_error,
    z0_error,
)
from nlagg_node.protocol.chain import ChainCheck, chain_check, x_key_error
from nlagg_node.runtime.public import config_from_msg, config_mismatch
from nlagg_node.runtime.wire import (
    AdvStateMsg,
    ConfigMsg,
    KeyMsg,
    SealedZ0Msg,
    StatusMsg,
    WireMessage,
    XMsg,
    Z0Msg,
    stale_run,
)
from nlagg_node.termination import NO_STOP

__all__ = ["OUTSIDE_WINDOW", "PhaseEnds", "RunRules", "rules_for"]

_WHY = {
    "gone": "node {i} departed at t={gone}",
    "stopped": "node {i} ended this phase after t={halt}",
}


class PhaseEnds:
    """Where each node ended each phase of a run that stops early: the iteration of its first x whose
    fields say it halts there (:func:`~nlagg_node.protocol.halt_span`). One record per run, kept by
    whoever judges the x's (the transcript's :class:`RunRules`) and read by the live replay.

    ``by_phase[p]``: node -> the last iteration it ran in phase p; ``count``: how many ends are known
    (a reader that caches what depends on them compares it).
    """

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        _ = shape.reach  # a graph the stop cannot follow (disconnected) fails now, not at an x
        self.by_phase: list[dict[int, int]] = [{} for _ in shape.phases]
        self.count = 0

    def note(self, node: int, t: int, stop: int | None, departures: Sequence[int] | None) -> None:
        """``x_node^(t)`` with these fields was accepted: its sender's end if it halts there (the
        first end of a phase counts)."""
        if not (0 <= node < self.shape.n and 0 <= t < self.shape.t_total):
            return
        end, _ = halt_span(self.shape, t, stop, departures)
        if end != NO_STOP:
            ended = self.by_phase[self.shape.phase_of(end)]
            if node not in ended:
                ended[node] = end
                self.count += 1

    def last(self, node: int, t: int) -> int | None:
        """The last iteration ``node`` ran in t's phase, None while it runs."""
        return self.by_phase[self.shape.phase_of(t)].get(node)

    def note_stops(self, stops: Mapping[tuple[int, int], tuple[int, Sequence[int] | None]]) -> Self:
        """:meth:`note` every ``(node, t) -> (stop, departures)`` of a transcript's x's
        (:meth:`~adversary.transcript.reader.TranscriptReader.x_stops`); returns itself."""
        for (node, t), (stop, departures) in stops.items():
            self.note(node, t, stop, departures)
        return self


class RunRules:
    """The nodes' acceptance rules for one run, with the state the window needs.

    Raises :class:`~nlagg_node.errors.ConfigError` when ``config`` does not describe a valid run
    (out-of-bounds sizes included): such a config is stored as invalid and sets no rules.
    """

    def __init__(self, config: ConfigMsg) -> None:
        cfg, edges = config_from_msg(config)
        self.shape = shape = RunShape(cfg, edges)
        _ = shape.reach  # a graph the stop cannot follow (disconnected) is refused now
        self.config = config
        self.n = cfg.n
        self.t_total = shape.t_total
        self.early_stop = shape.early_stop
        self.may_depart = shape.may_depart
        self.neighbours = shape.neighbours
        self.latest: list[int] = [-1] * self.n  # latest valid t per node
        self._resync: set[int] = set()  # nodes not seen since the capture lost its session
        self.departures = Departures(shape)  # from statuses
        self.willed: set[int] = set()  # nodes whose last will came (a connection lost)
        self.ends = PhaseEnds(shape)
        self.verifier = _verifier(config)  # None: a run without identities
        self.chains: dict[int, ChainCheck] = {}  # each node's x key chain, from its signed anchor
        self._far = {t: t + 1 for t in shape.jumps}

    def inside(self, node: int, t: int) -> bool:
        """Whether ``(node, t)`` is a node and an iteration of the run."""
        return 0 <= node < self.n and 0 <= t < self.t_total

    def phase_at(self, t: int) -> str:
        """The name of the phase iteration ``t`` (``0 <= t < t_total``) belongs to."""
        return self.shape.phase_at[t]

    def reject(self, msg: WireMessage) -> str | None:
        """Why a node would not use ``msg`` (None: it would, when first for its slot)."""
        shape = self.shape
        if isinstance(msg, XMsg):
            return self._x(msg)
        if isinstance(msg, Z0Msg | SealedZ0Msg):
            return z0_error(shape, msg.from_, msg.to, msg.group, isinstance(msg, SealedZ0Msg))
        if isinstance(msg, KeyMsg | StatusMsg) and (other := stale_run(msg, self.config.run_id)) is not None:
            return f"of run {other}, not of this run {self.config.run_id} (stale at the nodes)"
        if isinstance(msg, KeyMsg):
            return key_error(shape, msg.node)
        if isinstance(msg, StatusMsg):
            return status_error(shape, msg.node, msg.iterations, msg.departed)
        if isinstance(msg, AdvStateMsg):
            return adv_error(shape, msg.node, msg.t)
        if isinstance(msg, ConfigMsg):
            mismatch = config_mismatch(self.config, msg)
            if mismatch is not None:
                return f"a second run configuration ({mismatch}); the first one is kept"
        return None

    def forged(self, topic: str, node: int | None, payload: bytes, msg: WireMessage) -> str | None:
        """Why a message's authentication refuses it, as the nodes decide: in a run with identities
        an x carries its sender's key-chain element (:func:`~nlagg_node.protocol.chain.x_key_error`),
        every other message of a node its signature (:func:`~nlagg_node.protocol.signature_error`)."""
        if isinstance(msg, XMsg):
            auth = self.verifier is not None
            return x_key_error(auth, self.chains.get(msg.node), msg.node, msg.t, msg.k, msg.sig)
        return signature_error(self.verifier, topic, node, payload, getattr(msg, "sig", None) is not None)

    def resume(self, msg: WireMessage) -> None:
        """A message the transcript already holds as valid (a restarted eavesdropper): a status's
        key-chain anchor, an x's place on its sender's chain."""
        if isinstance(msg, StatusMsg):
            self._anchor(msg)
        elif isinstance(msg, XMsg) and msg.k is not None and msg.node in self.chains:
            self.chains[msg.node].follow(msg.t, msg.k)

    def _anchor(self, msg: StatusMsg) -> None:
        if msg.chain is not None and msg.node not in self.chains:
            self.chains[msg.node] = chain_check(msg.chain, self._far)

    def _halt(self, node: int, t: int) -> tuple[int, int]:
        if not self.ends.count:
            return NO_HALT
        last = self.ends.last(node, t)
        return NO_HALT if last is None else (last, self.shape.phase_end(t))

    def _x(self, msg: XMsg) -> str | None:
        i, t = msg.node, msg.t
        why = x_form_error(self.shape, i, t, msg.phase, msg.quiet, msg.stop, msg.departures, msg.cand)
        why = why or x_value_error(self.shape, i, t, msg.x, msg.cand)
        if why is not None:
            return why
        halt = self._halt(i, t)
        position = NO_STOP if self._resync else self.position(i, t)
        gone = self.departures.gone_from(i)
        verdict = admit(t, position, gone, halt, X_WINDOW, self.shape.jumps)
        if verdict == "ahead":
            behind = [k for k in self.departures.receivers(i, t) if self.latest[k] < t - 1]
            return f"x_{i}^({t}) {OUTSIDE_WINDOW}: node(s) {behind[:8]} not yet at t={t - 1}"
        if verdict is not None:
            return f"x_{i}^({t}): " + _WHY[verdict].format(i=i, gone=gone, halt=halt[0])
        return None

    def position(self, node: int, t: int) -> int:
        """The lowest position the capture has seen among the neighbours of ``node`` that wait for its
        x^(t) (:func:`~nlagg_node.protocol.lowest_position`)."""
        return lowest_position(self.latest, self.departures.receivers(node, t))

    def waits(self, msg: WireMessage) -> bool:
        """Whether ``msg`` is an x of the run whose window is not open yet (a neighbour not yet seen
        at t-1). Captured from one broker that x is out of its window for good; captured from
        several bridged brokers, the x's before it may still be on their way over another one."""
        if not isinstance(msg, XMsg) or not self.inside(msg.node, msg.t) or self._resync:
            return False
        position = self.position(msg.node, msg.t)
        return admit(msg.t, position, self.t_total, NO_HALT, X_WINDOW, self.shape.jumps) == "ahead"

    def accepted(self, msg: WireMessage) -> None:
        """Record a message stored as valid (the window moves on)."""
        if isinstance(msg, XMsg):
            self.saw_x(msg.node, msg.t)
            self.ends.note(msg.node, msg.t, msg.stop, msg.departures)
        elif isinstance(msg, StatusMsg):
            self._anchor(msg)
            if msg.state == "offline":
                self.willed.add(msg.node)
            for j, t in departure_claims(msg.node, msg.state, msg.iterations, msg.departed):
                if j == msg.node or own_departure_error(msg.node, j, t, self.away(j), False) is None:
                    self.departures.claim(msg.node, j, t)

    def away(self, node: int) -> bool:
        """Whether ``node`` may have been counted departed, as far as the transcript shows: no x of
        it yet, or its last will came (the claims its node itself refuses are not counted)."""
        return self.latest[node] < 0 or node in self.willed

    def saw_x(self, node: int, t: int) -> None:
        if t > self.latest[node]:
            self.latest[node] = t
        if self._resync:
            self._resync.discard(node)

    def resync(self) -> None:
        """The capture may have missed messages: no window until every node has been seen again."""
        self._resync = set(range(self.n))


def _verifier(config: ConfigMsg) -> Verifier | None:
    if config.identities is None:
        return None
    if len(config.identities) != config.n:
        raise ValueError(f"identities: {len(config.identities)} keys for {config.n} nodes")
    return Verifier(config.identities, config.instance)  # the start of the run its signatures bind


def rules_for(config: ConfigMsg) -> tuple[RunRules | None, str | None]:
    """``(rules, None)`` for a valid run configuration, ``(None, why)`` for one that is not."""
    try:
        return RunRules(config), None
    except ValueError as exc:  # ConfigError is one; so is anything numpy says about the edges
        return None, f"not a valid run configuration ({exc})"
