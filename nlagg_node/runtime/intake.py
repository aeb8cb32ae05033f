"""A node's x intake: its barrier of neighbours' x's, the early-stop fields sent with them, its counters.

The router puts every x_j^(t) of the run's form into :attr:`XIntake.barrier` (the protocol's
acceptance rule decides, :func:`nlagg_node.protocol.admit`), hands back what was not taken as new
to :meth:`XIntake.count` and the early-stop fields of a new one to :meth:`XIntake.keep_quiet`;
the loop takes the x's and then the fields, iteration by iteration. :class:`Tally` counts what a
node refused and the duplicates it dropped, for every part of the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..protocol.equivocation import equivocation_error
from ..termination import NO_STOP, Fields
from .barrier import Barrier, Outcome
from .peers import HISTORY

__all__ = ["Inlet", "Tally", "XIntake"]

log = logging.getLogger("nlagg.node")

_NONE: Fields = (0, NO_STOP, (), None)  # the fields of a slot that received none

Inlet = tuple[Callable[[int, int, float], Outcome], int, Callable[[int, int, Fields], None]]
"""Where one neighbour's x's go: ``(put(t, slot, x), slot, keep_quiet(t, slot, fields))``."""


class Tally:
    """The messages a node refused (each logged with why) and the duplicates it dropped."""

    def __init__(self, node: int) -> None:
        self.node = node
        self.rejected = 0
        self.duplicates = 0

    def reject(self, why: str) -> None:
        self.rejected += 1
        log.warning("node %d: rejected message (%s)", self.node, why)


class XIntake:
    """The x's of node ``node``'s neighbours (ascending ``senders``), one iteration at a time.

    Parameters
    ----------
    node : the receiving node.
    senders : its neighbours, ascending (the barrier's slots).
    timeout : seconds a take may wait (:class:`~nlagg_node.errors.NeighbourTimeoutError`).
    t_total : the run's iterations.
    jumps : iterations taken ahead of the window (the starts of phases that may follow an early stop).
    tally : where refusals and duplicates are counted.
    """

    def __init__(
        self,
        node: int,
        senders: list[int],
        *,
        timeout: float,
        t_total: int,
        jumps: frozenset[int],
        tally: Tally,
    ) -> None:
        self.senders = senders
        self.tally = tally
        # A neighbour's x's sent again after a broker crash are duplicates, not stale: keep HISTORY.
        self.barrier = Barrier(node, senders, "x^({})", timeout=timeout, end=t_total, window=2, keep=HISTORY)
        self.barrier.jumps = jumps
        self.quiet_in: dict[int, list[Fields]] = {}

    def inlet(self, slot: int) -> Inlet:
        """Where one neighbour's x's go: the barrier's ``put``, its slot and :meth:`keep_quiet` (the
        router's hot path, one call each per hosted listener of an x)."""
        return self.barrier.put, slot, self.keep_quiet

    def keep_quiet(self, t: int, slot: int, fields: Fields) -> None:
        """The early-stop fields sent with a new x^(t), kept for :meth:`take_quiet`."""
        row = self.quiet_in.get(t)
        if row is None:
            row = self.quiet_in[t] = [_NONE] * len(self.senders)
        row[slot] = fields

    def keep_quiet_row(self, t: int, kept: list[tuple[int, Fields]]) -> None:
        """:meth:`keep_quiet` of several slots' ``(slot, fields)`` sent with their new x^(t) (a host's
        batch)."""
        if not kept:
            return
        row = self.quiet_in.get(t)
        if row is None:
            row = self.quiet_in[t] = [_NONE] * len(self.senders)
        for slot, fields in kept:
            row[slot] = fields

    def take_quiet(self, t: int) -> list[Fields]:
        """The neighbours' ``(quiet, stop, departures, cand)`` sent with x^(t), by slot (after taking
        x^(t); a departed neighbour's slot holds nothing that counts, and so do all when none is left)."""
        return self.quiet_in.pop(t, None) or [_NONE] * len(self.senders)

    def count(self, outcome: Outcome, j: int, t: int, x: float, departed: int | None) -> None:
        """An x_j^(t) the barrier did not take as new: a duplicate is counted, a conflict ends the
        run (:func:`~nlagg_node.protocol.equivocation.equivocation_error`), the rest is rejected
        (``departed``: j's departure iteration, if it has departed)."""
        nxt = self.barrier.next
        reject = self.tally.reject
        if outcome == "dup":
            self.tally.duplicates += 1
        elif outcome == "conflict":
            raise equivocation_error(
                j, f"x_{j}^({t})", signed=False
            )  # x's carry no signature (protocol.chain)
        elif outcome == "stale":
            reject(f"stale x from node {j} for t={t}; the node is at t={nxt}")
        elif outcome == "gone":
            reject(f"x from node {j} for t={t}: it departed at t={departed}")
        elif outcome == "stopped":
            reject(f"x from node {j} for t={t}: it had ended this phase")
        else:
            reject(f"x from node {j} for t={t}, outside the window {nxt}..{nxt + 1}")
