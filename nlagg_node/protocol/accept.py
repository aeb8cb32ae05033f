"""The acceptance rule of every message kind: what a receiver takes, one function per decision.

The node (its router and barriers, :mod:`nlagg_node.runtime`) and the eavesdropper's transcript
(:mod:`adversary.rules`) call these functions and only these; neither states a rule of its own.

An x ``x_j^(t)`` passes three checks, in order:

1. its *form* (:func:`x_form_error`): a node and an iteration of the run, the phase of that
   iteration, the early-stop fields exactly where the run stops early, departures only where its
   nodes may depart, a candidate (``cand``) only where it stops on the certificate; and its
   *value* (:func:`x_value_error`): with a declared value range, inside the envelope every honest
   x lies in (:mod:`.envelope`); its candidate where the run's values lie (the declared range, or
   without one the protected side of a one-sided start);
2. its *sender* and *window* (:func:`admit`): refused once the sender has departed (``gone``: from
   its departure iteration on), after the sender ended the phase (``stopped``: an x whose fields
   say it halts is the sender's last of the phase, :func:`halt_span`), and ahead of the receiver's
   window (``ahead``): a receiver at *position* p (the iteration whose x's it waits for) takes
   x^(p) and x^(p+1) only (:data:`X_WINDOW`), and the first iteration of a phase at any time in a
   run that stops early (the previous phase may end before its length: :attr:`RunShape.jumps`);
3. its *slot* (:func:`slot_verdict`): the first value for ``(j, t)`` wins; the same value again is
   a duplicate, another one a conflict.

A node passes its own position (its barrier's next key). The transcript stores one x per slot for
every receiver, so it passes the lowest position it has evidence of among the sender's neighbours
that wait for that x (:func:`lowest_position` over :meth:`Departures.receivers`: the latest x it
has seen of each; a node that
published x^(p) waits for x^(p), so the capture's view is a lower bound of every receiver's
position): it keeps an x only if every receiver's window holds it. An honest x_j^(t) is published
after every x_k^(t-1) of its neighbours and reaches every subscriber after them, so both sides take
every honest x; a forged one inside one receiver's window but not another's is refused by the
transcript and taken by that receiver, whose later copy of the real x is then a *conflict* it
reports: an equivocation the receivers see, not a disagreement of rules.

z^(0) (:func:`z0_error`) travels along an edge, for a dual group of the run, sealed exactly where
the run seals that group; a public key (:func:`key_error`) comes from a node of a run that seals;
a status (:func:`status_error`) is bounded by the run and its ``departed`` map names neighbours of
its sender. A departure counts only from what the departed node says of itself (``leaving`` with
its departure iteration) or from a neighbour's own observation of the shared edge
(:func:`departure_claims`), and only for that edge (:class:`Departures`): a claim about a
non-neighbour never counts, and one neighbour's claim does not silence the sender for the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, TypeVar

from ..termination import NO_STOP, earliest_stop, halts
from .shape import RunShape

__all__ = [
    "NO_HALT",
    "OUTSIDE_WINDOW",
    "X_WINDOW",
    "Departures",
    "Verdict",
    "admit",
    "adv_error",
    "departure_claims",
    "halt_span",
    "key_error",
    "lowest_position",
    "own_departure_error",
    "slot_verdict",
    "status_error",
    "x_form_error",
    "x_value_error",
    "z0_error",
]

T = TypeVar("T")

Verdict = Literal["new", "dup", "conflict", "stale", "ahead", "gone", "stopped"]
"""A receiver's decision on one value: ``new`` (taken), ``dup`` (the same value again),
``conflict`` (another value for a slot already filled: the first is kept), ``stale`` (an iteration
already taken whose record is gone), ``ahead`` (beyond the window), ``gone`` (the sender departed
before it), ``stopped`` (the sender had ended its phase before it)."""

X_WINDOW = 2
"""A receiver at position p takes x^(p) and x^(p+1): a neighbour may be one iteration ahead."""

NO_HALT = (NO_STOP, NO_STOP)
"""The halt span of a sender that has not ended its phase (:func:`halt_span`)."""

OUTSIDE_WINDOW = "outside every neighbour's window"  # a refusal a later identical copy may undo


def admit(
    key: int, position: int, gone_from: int, halt: tuple[int, int], window: int, jumps: frozenset[int]
) -> Verdict | None:
    """A receiver's decision on a value for ``key`` from one sender, before its slot is read.

    Parameters
    ----------
    key : the iteration (or exchange) the value is for.
    position : the receiver's position: the key it waits for.
    gone_from : the sender's departure key (it delivers no key from it on).
    halt : ``(stop, end)``: the sender ended its phase after ``stop``; no key strictly between.
    window : how many keys from ``position`` on are taken.
    jumps : keys taken ahead of the window.

    Returns
    -------
    ``gone``, ``stopped`` or ``ahead``; None when the slot decides (:func:`slot_verdict`).
    """
    if key >= gone_from:
        return "gone"
    if halt[0] < key < halt[1]:
        return "stopped"
    if key >= position + window and key not in jumps:
        return "ahead"
    return None


def slot_verdict(held: T | None, value: T) -> Literal["new", "dup", "conflict"]:
    """A value for a slot that holds ``held`` (None: empty): the first one wins.

    The nodes compare values; the transcript compares digests of the whole message (a copy with
    other early-stop fields is another message for the same slot)."""
    if held is None:
        return "new"
    return "dup" if held == value else "conflict"


def lowest_position(latest: Sequence[int], receivers: Iterable[int]) -> int:
    """The lowest position among ``receivers``, from the latest x seen of each (a node that
    published x^(p) waits for x^(p)); :data:`NO_STOP` when there is none."""
    return min((latest[k] for k in receivers), default=NO_STOP)


class Departures:
    """Who has departed for whom: the departures the statuses of a run establish.

    A departure is a fact about an edge: receiver k stops waiting for sender j from k's own
    observation (j's will stayed, :mod:`nlagg_node.departure`), or for every neighbour from j's
    own ``leaving``. An x_j^(t) is ``gone`` for a receiver from then on, and for the whole run once
    it is gone for every neighbour of j (:meth:`gone_from`); a neighbour's claim alone never
    silences j for the others. An x's receivers are the neighbours whose edge with its sender
    neither end has said is gone (:meth:`receivers`). A node keeps its own column of this table in its barrier
    (:meth:`nlagg_node.runtime.barrier.Barrier.depart`); the transcript keeps all of it.
    """

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        self.own: list[int] = [shape.t_total] * shape.n  # j's own word (leaving at T)
        self.seen: dict[tuple[int, int], int] = {}  # (receiver, sender) -> T, the receiver's word
        self.any = False

    def claim(self, claimant: int, subject: int, at: int) -> None:
        """Record a claim of :func:`departure_claims` made in ``claimant``'s status."""
        self.any = True
        if claimant == subject:
            self.own[subject] = min(at, self.own[subject])
        else:
            self.seen[claimant, subject] = min(at, self.seen.get((claimant, subject), at))

    def gone_for(self, receiver: int, sender: int) -> int:
        """The first iteration whose x of ``sender`` ``receiver`` no longer waits for."""
        return min(self.own[sender], self.seen.get((receiver, sender), self.shape.t_total))

    def gone_from(self, sender: int) -> int:
        """The first iteration no neighbour of ``sender`` waits for its x (``t_total``: none)."""
        if not self.any:
            return self.shape.t_total
        return min(self.own[sender], max(self.gone_for(k, sender) for k in self.shape.neighbours[sender]))

    def edge_gone(self, a: int, b: int) -> int:
        """The iteration from which the edge ``(a, b)`` carries no x: its ends' word, either end's."""
        t_total = self.shape.t_total
        return min(self.own[a], self.own[b], self.seen.get((a, b), t_total), self.seen.get((b, a), t_total))

    def receivers(self, sender: int, t: int) -> list[int]:
        """The neighbours of ``sender`` that wait for its x^(t): their edge still there at ``t - 1``
        (a neighbour departed at T published x^(T-1), so it is still counted at t = T)."""
        nbrs = self.shape.neighbours[sender]
        if not self.any:
            return nbrs
        return [k for k in nbrs if self.edge_gone(sender, k) > t - 1]


def halt_span(shape: RunShape, t: int, stop: int | None, departures: Sequence[int] | None) -> tuple[int, int]:
    """``(t, end of t's phase)`` when the x^(t) with these fields is its sender's last of the phase
    (:func:`~nlagg_node.termination.halts`), else :data:`NO_HALT`. A stop before the phase's
    :func:`~nlagg_node.termination.earliest_stop` is no honest node's: it ends nothing (the
    receiver's state machine refuses the claim, named)."""
    if stop != t or not halts(stop, t, departures or (), shape.reach):
        return NO_HALT
    if stop < earliest_stop(shape.starts[shape.phase_of(t)], shape.reach, shape.cfg.stop_window_value):
        return NO_HALT
    return t, shape.phase_end(t)


def x_form_error(
    shape: RunShape,
    node: int,
    t: int,
    phase: str,
    quiet: int | None,
    stop: int | None,
    departures: Sequence[int] | None,
    cand: float | None = None,
) -> str | None:
    """Why x_node^(t) with these fields is no x of the run (None: it is one)."""
    if node >= shape.n:
        return f"x of node {node}: the run has nodes 0..{shape.n - 1}"
    if t >= shape.t_total:
        return f"t={t}: the run has iterations 0..{shape.t_total - 1}"
    expected = shape.phase_at[t]
    if phase != expected:
        return f"t={t}: phase {phase!r}, expected {expected!r}"
    early = shape.early_stop
    if (quiet is None) == early or (stop is not None and not early):
        return f"x_{node}^({t}): quiet/stop {'missing in' if early else 'in'} a run " + (
            "that stops early" if early else "with a fixed schedule"
        )
    if departures is not None and not shape.may_depart:
        return f"x_{node}^({t}): departures in a run " + (
            "whose nodes may not depart" if early else "with a fixed schedule"
        )
    if cand is not None and not shape.certified:
        return f"x_{node}^({t}): cand in a run that does not stop on the certificate (stop_rule)"
    return None


def x_value_error(shape: RunShape, node: int, t: int, x: float, cand: float | None = None) -> str | None:
    """Why the value of x_node^(t) (passed by :func:`x_form_error`) is no honest x: outside the
    envelope the run's declared value range and initialization allow (:mod:`.envelope`), or with a
    certified stop's candidate ``cand`` where no value of the run lies (a candidate is a node's value:
    inside the declared range; without one, on the protected side of a one-sided start,
    :func:`~.envelope.value_bounds`)."""
    envelope = shape.envelope
    why = None if envelope is None else envelope.error(node, t, x)
    if why is None and cand is not None and (bounds := shape.value_bounds) is not None:
        why = bounds.cand_error(node, t, cand)
    return why


def z0_error(shape: RunShape, sender: int, to: int, group: str, sealed: bool) -> str | None:
    """Why a z^(0) from ``sender`` to ``to`` of ``group`` (``sealed``: protocol v2) is refused."""
    if (sender, to) not in shape.directed:
        return f"z0 from node {sender} to node {to}: not an edge of the run's graph"
    if group not in shape.exchange_of:
        return f"z0 from node {sender} for unknown dual group {group!r}"
    if sealed != (group in shape.sealed):
        how = "sealed (protocol v2)" if sealed else "plaintext (protocol v1)"
        want = "sealed" if group in shape.sealed else "in plaintext"
        return f"z0 {sender}->{to} of group {group!r} is {how}, but this run exchanges that group {want}"
    return None


def key_error(shape: RunShape, node: int) -> str | None:
    """Why a public key of ``node`` is refused."""
    if node >= shape.n:
        return f"key of node {node}: the run has nodes 0..{shape.n - 1}"
    if not shape.sealed:
        return "a public key in a run that seals no z^(0)"
    return None


def status_error(
    shape: RunShape, node: int, iterations: int | None, departed: Mapping[str, int] | None
) -> str | None:
    """Why a status of ``node`` is refused: a node and counts of the run, departures of its neighbours."""
    if node >= shape.n:
        return f"status of node {node}: the run has nodes 0..{shape.n - 1}"
    if iterations is not None and iterations > shape.t_total:
        return f"iterations={iterations}: the run has {shape.t_total}"
    for key, t in (departed or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) not in shape.neighbours[node]:
            return f"departed[{key!r}]: not a neighbour of node {node}"
        if t > shape.t_total:
            return f"departed[{key!r}]={t}: the run has {shape.t_total} iterations"
    return None


def departure_claims(
    node: int, state: str, iterations: int | None, departed: Mapping[str, int] | None
) -> list[tuple[int, int]]:
    """The departures ``(node, T)`` a status (passed by :func:`status_error`) establishes: its
    sender's own ``leaving`` at T, and the departures of its neighbours it observed itself."""
    out = [(node, iterations)] if state == "leaving" and iterations is not None else []
    return out + [(int(j), t) for j, t in (departed or {}).items()]


def own_departure_error(claimant: int, subject: int, at: int, away: bool, join_window: bool) -> str | None:
    """Why ``claimant``'s claim that the receiver ``subject`` departed at ``at`` is refused: the
    receiver contradicts it (None: the claim may be true, and the receiver, refused by its
    neighbour for the rest of the run, must stop). A neighbour counts a node departed from its
    last will (:mod:`nlagg_node.departure`), which the broker publishes when the node's connection
    is lost, or, in a run with a ``join_window`` (an epoch), at t = 0 when it was not online as the
    window closed: the subject cannot contradict that one. A node not ``away`` has published its
    x's from this process's first on, and neither lost a connection nor restarted meanwhile, so no
    will of it came, and any other claim is a lie: one insider must not stop an honest node by
    saying so."""
    if away or (join_window and at == 0):
        return None
    return (
        f"status of node {claimant}: claims node {subject} departed at t={at}, but node {subject} "
        "has been connected throughout the run (no last will of it was published)"
    )


def adv_error(shape: RunShape, node: int, t: int) -> str | None:
    """Why a corrupted node's state of iteration ``t`` is refused."""
    if node >= shape.n:
        return f"state of node {node}: the run has nodes 0..{shape.n - 1}"
    if t >= shape.t_total:
        return f"t={t}: the run has iterations 0..{shape.t_total - 1}"
    return None
