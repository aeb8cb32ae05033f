"""The inbox/barrier state machine: what a node waits for from its neighbours, one key at a time.

A :class:`Barrier` collects one value per *slot* (a neighbour, in ascending order) for each
*key*, and hands the complete set to the loop once every slot has delivered. Keys are taken in
order (0, 1, 2, ...); the node uses one barrier per kind of exchange:

* ``x``: key t, the iteration; the window is the key being waited for and the next one (a
  neighbour may be one iteration ahead, never more), and the last keys taken are kept (the
  node keeps :data:`~nlagg_node.runtime.peers.HISTORY`, what a neighbour sends again after a
  broker crash) so that a resent x is told apart from a forged or corrupted one.
* ``z0``: key k, the k-th z^(0) exchange of the run (one per dual group, in schedule order);
  every later exchange is in the window.

Every arriving value gets one verdict (:data:`Outcome`), decided by the protocol's acceptance
rule (:func:`nlagg_node.protocol.admit` with this receiver's position, the key it waits for, then
:func:`nlagg_node.protocol.slot_verdict`; the transcript calls the same functions): ``new``
(stored), ``dup`` (the same value again), ``conflict`` (a different value for a slot already
filled: the first one is kept), ``stale`` (a key already taken whose record is gone), ``ahead``
(beyond the window), ``gone`` (from a sender that has departed, see :meth:`Barrier.depart`) or
``stopped`` (after the sender ended its phase, see :meth:`Barrier.halted`).
The caller decides what each verdict costs (count a duplicate, reject and log). New kinds of
exchange (departures, keys) are new barriers, not new code paths.

The wait has a deadline, ``timeout`` seconds without completing, reported as
:class:`NeighbourTimeoutError` naming the missing neighbours. One timer per barrier is re-armed
lazily instead of an ``asyncio.timeout`` per key: that would cost a timer-heap push and cancel
every iteration, on the hot path.
"""

from __future__ import annotations

import asyncio
import math

from ..errors import NeighbourTimeoutError, NlaggError
from ..protocol import NO_HALT, Verdict, admit, slot_verdict

__all__ = ["Barrier", "Outcome"]

Outcome = Verdict


class _Round:
    """The values of one key received so far."""

    __slots__ = ("count", "values")

    def __init__(self, size: int) -> None:
        self.values: list[float | None] = [None] * size
        self.count = 0


class Barrier:
    """Values that ``senders`` deliver per key, taken in key order by one waiter.

    Parameters
    ----------
    owner : the receiving node's id (named in the timeout error).
    senders : the sending node of each slot (neighbours ascending).
    what : the exchange's name in messages, formatted with the key's label (``x^({})``).
    timeout : seconds a :meth:`take` may wait before :class:`NeighbourTimeoutError`.
    end : keys are ``0 .. end-1``.
    window : how many keys from the next one to take accept values (2: that key and the next).
    keep : how many taken keys keep their values for telling duplicates from conflicts;
        None keeps all.
    """

    def __init__(
        self,
        owner: int,
        senders: list[int],
        what: str,
        *,
        timeout: float,
        end: int,
        window: int,
        keep: int | None,
    ) -> None:
        self.owner = owner
        self.senders = senders
        self.size = len(senders)
        self.what = what
        self.timeout = timeout
        self.end = end
        self.window = window
        self.keep = keep
        self.next = 0  # the next key to take
        self.labels: list[str] | None = None  # key -> label in messages (default: the key)
        self.jumps: frozenset[int] = frozenset()  # keys accepted beyond the window (see skip_to)
        # Per slot, as admit() reads them on the hot path: the first key it no longer delivers
        # (``end``: none, it has not departed) and its sender's last halt span (halt_span).
        self._gone_at = [end] * self.size
        self._any_gone = False  # some slot departed (the common case without: no scan)
        self._halt_at = [NO_HALT] * self.size
        self._any_halt = False  # some slot's sender ended a phase (put_row then asks slot by slot)
        self._pending: dict[int, _Round] = {}
        self._taken: dict[int, list[float]] = {}
        self._waiter: asyncio.Future[None] | None = None
        self._wait_since = 0.0
        self._watchdog: asyncio.TimerHandle | None = None

    def label(self, key: int) -> str:
        return self.what.format(key if self.labels is None else self.labels[key])

    def resume(self, next_key: int, previous: list[float] | None = None) -> None:
        """Start at ``next_key`` (a restarted node), with the values taken for the key before."""
        self.next = next_key
        if previous:
            self._taken[next_key - 1] = previous

    def skip_to(self, key: int) -> None:
        """The keys before ``key`` will never come (a phase that stopped early): take ``key`` next.

        ``key`` is one of :attr:`jumps`, which :meth:`put` accepts ahead of the window: a faster
        neighbour may already have sent it.
        """
        if key not in self.jumps or key < self.next:
            raise NlaggError(f"node {self.owner}: cannot skip to {self.label(key)} (next {self.next})")
        self.next = key

    def need(self, key: int) -> int:
        """How many slots deliver ``key``: all of them but those departed at or before it."""
        if not self._any_gone:
            return self.size
        return self.size - sum(1 for k in self._gone_at if k <= key)

    def depart(self, slot: int, key: int | None = None) -> int:
        """``slot``'s sender has departed: it delivers no key from ``key`` on; returns that key.

        By default the key is the first one, from the next to take, that ``slot`` has not
        delivered (:mod:`nlagg_node.departure`: every receiver waits for the same one). A wait
        that only lacked this slot completes.
        """
        if key is None:
            key = self.next
            while (rnd := self._pending.get(key)) is not None and rnd.values[slot] is not None:
                key += 1
        elif key < self.next:
            raise NlaggError(
                f"node {self.owner}: {self.label(key)} of node {self.senders[slot]} was already taken"
            )
        self._gone_at[slot] = min(key, self._gone_at[slot])
        self._any_gone = True
        for k, rnd in self._pending.items():
            if k >= key and rnd.values[slot] is not None:
                rnd.values[slot] = None
                rnd.count -= 1
        self._wake()
        return key

    def halted(self, slot: int, span: tuple[int, int]) -> None:
        """``slot``'s sender ended its phase: ``span`` is ``(its last key, the phase's end)``
        (:func:`nlagg_node.protocol.halt_span`); a key between them is refused as ``stopped``."""
        self._halt_at[slot] = span
        self._any_halt = True

    def _wake(self) -> None:
        waiter = self._waiter
        rnd = self._pending.get(self.next)
        if waiter is not None and not waiter.done() and (rnd.count if rnd else 0) >= self.need(self.next):
            waiter.set_result(None)

    def put(self, key: int, slot: int, value: float) -> Outcome:
        """The value of ``slot`` for ``key``: the barrier's hot path."""
        verdict = admit(key, self.next, self._gone_at[slot], self._halt_at[slot], self.window, self.jumps)
        if verdict is not None:
            return verdict
        if key < self.next:
            seen = self._taken.get(key)
            return "stale" if seen is None else slot_verdict(seen[slot], value)
        if key >= self.end:
            return "ahead"
        rnd = self._pending.get(key)
        if rnd is None:
            rnd = self._pending[key] = _Round(self.size)
        old = rnd.values[slot]
        if old is not None:
            return slot_verdict(old, value)
        rnd.values[slot] = value
        rnd.count += 1
        waiter = self._waiter
        if key == self.next and waiter is not None and rnd.count == self.need(key) and not waiter.done():
            waiter.set_result(None)
        return "new"

    def put_row(self, key: int, slots: list[int], values: list[float]) -> list[Outcome] | None:
        """:meth:`put` of ``values[k]`` for ``slots[k]`` (distinct slots), all for ``key``: the same
        verdicts, in order, or None when every one is ``new`` (a host's batch, one call per listener).

        While no slot has departed or halted, every slot gives :func:`admit` the same arguments
        (a slot's departure key is then ``end``, its halt span :data:`NO_HALT`): it is asked once
        for the row. Otherwise, or for a key already taken, each value goes through :meth:`put`.
        """
        pos = self.next
        if (
            self._any_gone
            or self._any_halt
            or key < pos
            or key >= self.end
            or admit(key, pos, self.end, NO_HALT, self.window, self.jumps) is not None
        ):
            put = self.put
            out = [put(key, slot, value) for slot, value in zip(slots, values, strict=True)]
            return None if all(o == "new" for o in out) else out
        rnd = self._pending.get(key)
        if rnd is None:
            rnd = self._pending[key] = _Round(self.size)
        held = rnd.values
        count = rnd.count
        verdicts: list[Outcome] | None = None
        for k, slot in enumerate(slots):
            old = held[slot]
            if old is None:
                held[slot] = values[k]
                count += 1
            else:
                if verdicts is None:
                    verdicts = ["new"] * len(slots)
                verdicts[k] = slot_verdict(old, values[k])
        rnd.count = count
        waiter = self._waiter
        if key == pos and waiter is not None and count >= self.size and not waiter.done():
            waiter.set_result(None)
        return verdicts

    def taken(self, key: int, slot: int) -> float | None:
        """The value ``slot`` delivered for an already taken ``key``, if it is still kept."""
        seen = self._taken.get(key)
        return None if seen is None else seen[slot]

    async def take(self, key: int) -> list[float]:
        """Wait until every slot has delivered ``key`` (the next key), then return the values.

        A departed slot's value is NaN.
        """
        if key != self.next:
            raise NlaggError(f"node {self.owner}: {self.label(key)} taken out of order (next {self.next})")
        rnd = self._pending.get(key)
        need = self.need(key)
        if need == 0 and rnd is None:
            rnd = self._pending[key] = _Round(self.size)
        if rnd is None or rnd.count < need:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            self._wait_since = loop.time()
            if self._watchdog is None:
                self._watchdog = loop.call_later(self.timeout, self._check_deadline)
            try:
                await waiter
            finally:
                self._waiter = None
            rnd = self._pending.get(key)
            if rnd is None:  # every slot departed while we waited
                rnd = _Round(self.size)
        self._pending.pop(key, None)
        values: list[float] = rnd.values  # type: ignore[assignment]  # complete: no None left
        if self._any_gone:
            values = [math.nan if v is None else v for v in rnd.values]
        self._taken[key] = values
        if self.keep is not None:
            self._taken.pop(key - self.keep, None)
        self.next = key + 1
        return values

    def missing(self, key: int) -> list[int]:
        rnd = self._pending.get(key)
        return [
            j
            for k, j in enumerate(self.senders)
            if (rnd is None or rnd.values[k] is None) and self._gone_at[k] > key
        ]

    def _check_deadline(self) -> None:
        """Fail the wait that has lasted ``timeout``, naming the missing neighbours."""
        self._watchdog = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # not waiting: the next wait arms the timer again
        loop = asyncio.get_running_loop()
        waited = loop.time() - self._wait_since
        if waited < self.timeout:
            self._watchdog = loop.call_later(self.timeout - waited, self._check_deadline)
            return
        waiter.set_exception(
            NeighbourTimeoutError(
                f"node {self.owner}: no {self.label(self.next)} from neighbour(s) "
                f"{self.missing(self.next)} within {self.timeout:g} s"
            )
        )

    def close(self) -> None:
        """Cancel the deadline timer (the run is over)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
