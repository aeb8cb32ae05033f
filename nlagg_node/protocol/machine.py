"""One node's early stop as a state machine: events in, decisions out, no I/O (the h11 pattern).

A :class:`PhaseNode` is node i within one phase. It holds no socket, clock or task: its driver
feeds it events and acts on what it decides.

::

    events                                           decisions
    ------                                           ---------
    neighbour_departed(t)  (x_j^(t) never came)  ->  (remembered: i is not quiet at t + 1)
    stop_error(j, t, e)    (j's stop claim, sent     ->  None (taken), or the refusal naming j: a stop
        with x_j^(t-1))                                  i can contradict (before the earliest stop,
                                                         later than a proposal made by t - 1 allows,
                                                         or while i itself was not quiet)
    tick(t, x_i^(t), heard) (the neighbours'     ->  the fields to publish with x_i^(t):
        fields of their x^(t-1))                     (k, e, departures, cand)
                                                 ->  halts(t): the phase ends after t
                                                 ->  final(x, stopped): the phase's output
                                                     (the candidate at a certified stop)

Its drivers: the asyncio node (:class:`nlagg_node.runtime.loop.Stopping`, one machine per hosted
node, fed from the barrier), :func:`fields_along` (one machine per node of a recorded trajectory:
the simulator's transcripts, the eavesdropper's replay of a simulation and the tests) and, through
those, the attack. The simulator's numba kernel is the one vectorised copy of the rule; the tests
check it against this machine and both against an independent reference written from
docs/protocol.md (``tests/harness/stop_reference.py``).

The rule itself (the scalar functions: quiet counter, stop iteration, departures, candidate) is
:mod:`nlagg_node.termination`, which states it and proves it; this module only keeps its state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import FloatArray, IntArray
from ..graphs import neighbours
from ..termination import (
    NO_CANDIDATE,
    NO_STOP,
    Certificate,
    Fields,
    earliest_stop,
    halts,
    is_certified,
    is_quiet,
    live_stop,
    next_candidate,
    next_pin_run,
    next_quiet,
    next_stop,
    own_candidate,
    quiet_window,
    recent,
    stop_threshold,
)

__all__ = ["PhaseNode", "StopRule", "fields_along", "phase_final"]


@dataclass(frozen=True)
class StopRule:
    """The early stop of a phase as the run configures it.

    Attributes
    ----------
    window : W, ``stop_window``.
    reach : D, :func:`~nlagg_node.termination.stop_reach`.
    tolerance : the tolerance rule's bound on ``|x^(t) - x^(t-W)|``.
    sign : the certified stop's sign (+1 max, -1 min,
        :func:`~nlagg_node.termination.certificate_sign`); None: the tolerance rule.
    """

    window: int
    reach: int
    tolerance: float
    sign: float | None = None

    @property
    def threshold(self) -> int:
        return stop_threshold(self.reach, self.window)


def phase_final(x: float, candidate: float | None, stopped: bool) -> float:
    """A node's final of a phase: its candidate where the phase ended on its (certified) stop, else
    its last x (a phase run to ``t_max``, or a node without a candidate)."""
    return candidate if stopped and candidate is not None else x


class PhaseNode:
    """Node i's early-stop state within one phase (see the module docstring).

    Parameters
    ----------
    rule : the phase's stop rule.
    t0 : the phase's first iteration.
    value : the node's value as its x-update uses it (protocol scale), for the certified stop's pin
        test (ignored on the tolerance rule).
    """

    def __init__(self, rule: StopRule, t0: int, value: float = 0.0) -> None:
        self.rule, self.t0 = rule, t0
        self.value = float(value)
        self.signed = (rule.sign or 1.0) * self.value
        self.past = [0.0] * rule.window  # x^(t-W) .. x^(t-1), by phase-local iteration mod W
        self.k, self.e = 0, NO_STOP
        self.known: tuple[int, ...] = ()
        self.caught: tuple[int, ...] = ()
        self.run = 0  # the pin run r_i
        self.b = NO_CANDIDATE  # the candidate b_i (signed)
        self.loud: deque[int] = deque()  # the iterations of the last 2D + W at which it was not quiet
        self.known_from = t0  # its quiet record starts here (later on a resumed node)

    def stop_error(self, sender: int, t: int, stop: int) -> str | None:
        """Why node i refuses the stop ``stop`` neighbour ``sender`` published with its x^(t-1) (None:
        none it can contradict). An honest stop e was proposed at ``e - D`` by a node whose counter
        proves every node within D hops (i among them: no two nodes of a connected graph lie farther
        apart) quiet over :func:`~nlagg_node.termination.quiet_window`; so a stop before
        :func:`~nlagg_node.termination.earliest_stop`, beyond ``t - 1 + D``, or whose window holds an
        iteration at which i was not quiet is a false claim (docs/protocol.md, "Bounded influence").
        A stop ``t - 1`` is the sender's claim that it ended its phase with that x (:meth:`halts`);
        one further behind is no claim (the rule forgets it)."""
        if stop == NO_STOP or stop < t - 1:
            return None
        rule = self.rule
        first, last = quiet_window(stop, rule.reach, rule.window)
        why, earliest = None, earliest_stop(self.t0, rule.reach, rule.window)
        if stop < earliest:
            why = f"before the earliest stop of a phase started at t={self.t0}, t={earliest}"
        elif stop > t - 1 + rule.reach:
            why = f"later than any proposal made by t={t - 1} allows (t + D = {t - 1 + rule.reach})"
        elif first >= self.known_from and (loud := [u for u in self.loud if first <= u <= last]):
            why = f"it needs every node quiet over t={first}..{last}, and this node was not at t={loud[0]}"
        return None if why is None else f"stop={stop} from node {sender} with its x^({t - 1}): {why}"

    def neighbour_departed(self, t: int) -> None:
        """A neighbour's x^(t) never came (it departed at t): not quiet at t + 1."""
        self.caught = (t,)

    def tick(self, t: int, x: float, heard: Sequence[Fields]) -> Fields:
        """Iteration t: the node's own ``x^(t)`` and the fields ``heard`` with its neighbours' x^(t-1)
        (those still here; none at the phase's first iteration). Returns ``(k, e, departures,
        cand)`` to publish with x^(t): departures merged first, then the candidate, the quiet test,
        k and e (docs/protocol.md, "The certified stop", steps 1-5)."""
        rule, caught = self.rule, self.caught
        if caught or self.known or any(f[2] for f in heard):
            merged = set(self.known).union(caught, *(f[2] for f in heard))
            self.known = tuple(sorted(d for d in merged if recent(d, t, rule.reach)))
            self.caught = ()
        lt = t - self.t0
        if rule.sign is None:
            slot = lt % rule.window
            quiet = not caught and lt >= rule.window and is_quiet(x, self.past[slot], rule.tolerance)
            self.past[slot] = x
        else:
            quiet = self._certified(x, heard)
        self._record(t, quiet)
        self.k = next_quiet(quiet, min([self.k] + [f[0] for f in heard]))
        e_min = min([live_stop(self.e, t)] + [live_stop(f[1], t) for f in heard])
        self.e = next_stop(e_min, self.k, t, rule.threshold, rule.reach)
        return self.k, self.e, self.known, self.candidate

    def _record(self, t: int, quiet: bool) -> None:
        """Keep the iterations of the last ``2D + W`` at which the node was not quiet (what a stop's
        quiet window may hold, :meth:`stop_error`)."""
        loud, horizon = self.loud, t - 2 * self.rule.reach - self.rule.window
        if not quiet:
            loud.append(t)
        while loud and loud[0] < horizon:
            loud.popleft()

    def _certified(self, x: float, heard: Sequence[Fields]) -> bool:
        """The pin run and candidate after taking ``x``; whether the node is quiet (the certificate)."""
        sign = self.rule.sign or 1.0
        self.run = next_pin_run(x, self.value, self.run)
        own = own_candidate(self.signed, self.run, self.rule.window)
        b_max = max([self.b] + [sign * f[3] for f in heard if f[3] is not None])
        resetting = bool(self.known)
        self.b = next_candidate(b_max, own, resetting)
        return not resetting and is_certified(self.signed, self.b)

    @property
    def candidate(self) -> float | None:
        """The candidate on the protocol's scale (published as ``cand``); None without one or without
        the certificate."""
        sign = self.rule.sign
        return None if sign is None or self.b == NO_CANDIDATE else sign * self.b

    def halts(self, t: int) -> bool:
        """Whether the node ends its phase after iteration t (its stop, not voided by a departure)."""
        return halts(self.e, t, self.known, self.rule.reach)

    def final(self, x: float, stopped: bool) -> float:
        """The phase's final (output) of a node whose last x is ``x``: :func:`phase_final`."""
        return phase_final(x, self.candidate, stopped)

    def restore(self, xs: Sequence[float], sent: Fields) -> None:
        """Resume after the phase-local iterations whose x's were ``xs`` (``len(xs) > 0``), the last
        of them published with ``sent``: the window and the pin run from the x's, the rest from the
        fields (a checkpoint)."""
        lt = len(xs)
        window = self.rule.window
        for lt_past in range(max(0, lt - window), lt):
            self.past[lt_past % window] = xs[lt_past]
        self.k, self.e, self.known, cand = sent
        self.known_from = self.t0 + lt  # the quiet record before is lost
        if self.rule.sign is not None:
            self.run = _trailing(xs, self.value)
            self.b = NO_CANDIDATE if cand is None else self.rule.sign * cand


def _trailing(xs: Sequence[float], value: float) -> int:
    """How many of the last ``xs`` equal ``value`` in a row: a pin run rebuilt from the x's run."""
    run = 0
    for x in reversed(xs):
        if x != value:
            break
        run += 1
    return run


def fields_along(
    xs: FloatArray,
    edges: IntArray,
    t0: int,
    window: int,
    reach: int,
    tolerance: float,
    departed: Mapping[int, int] | None = None,
    certificate: Certificate | None = None,
    refusals: list[str] | None = None,
) -> list[list[Fields | None]]:
    """Every node's fields ``(k_i^(t), e_i^(t), departures, cand)`` along one phase's trajectory ``xs``:
    one :class:`PhaseNode` per node, fed the x's and its neighbours' fields.

    ``xs``: iterations x nodes, the x's of a phase that started at iteration ``t0``; ``reach``:
    :func:`~nlagg_node.termination.stop_reach`; ``departed``: ``{node: T}`` (its last x was
    ``x^(T-1)``); ``certificate``: the phase stops on the certificate, else on ``tolerance``. What
    the nodes publish with their x's (``e`` is :data:`~nlagg_node.termination.NO_STOP` until known),
    recomputed from the x's: the simulator's transcripts carry them. An entry is None where the node
    publishes nothing (it departed, or its component stopped). The rows end once every node has
    stopped or departed (or at the end of ``xs``). ``refusals`` gets every stop claim a node would
    refuse (:meth:`PhaseNode.stop_error`; none on an honest trajectory).
    """
    n = xs.shape[1]
    gone = dict(departed or {})
    nbrs = neighbours(n, np.asarray(edges))
    rule = StopRule(window, reach, tolerance, None if certificate is None else certificate.sign)
    values = [0.0] * n if certificate is None else [float(v) for v in certificate.values]
    nodes = [PhaseNode(rule, t0, values[i]) for i in range(n)]
    running = [gone.get(i, NO_STOP) > t0 for i in range(n)]
    rows: list[list[Fields | None]] = []
    last: list[Fields | None] = [None] * n
    for lt, row in enumerate(np.asarray(xs, dtype=np.float64).tolist()):
        t = t0 + lt
        was = list(running)  # who published x^(t-1) and goes on
        out: list[Fields | None] = [None] * n
        for i in range(n):
            running[i] = running[i] and gone.get(i, NO_STOP) > t
            if not running[i]:
                continue
            if lt and any(gone.get(j) == t - 1 for j in nbrs[i]):  # detected at the last barrier
                nodes[i].neighbour_departed(t - 1)
            senders = [j for j in nbrs[i] if was[j] and last[j] is not None] if lt else []
            heard = [f for j in senders if (f := last[j]) is not None]
            if refusals is not None:
                refusals += [
                    why
                    for j, f in zip(senders, heard, strict=True)
                    if (why := nodes[i].stop_error(j, t, f[1]))
                ]
            out[i] = nodes[i].tick(t, row[i], heard)
        rows.append(out)
        last = out
        for i in range(n):
            running[i] = running[i] and not nodes[i].halts(t)
        if not any(running):
            break
    return rows
