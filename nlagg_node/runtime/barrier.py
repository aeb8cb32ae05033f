"""What a node waits for and what it ends with: the keyed barrier slots, the timeout error, the result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal

from ..errors import NlaggError

__all__ = ["KeyedSlots", "NeighbourTimeoutError", "NodeResult", "first_error"]


class NeighbourTimeoutError(NlaggError):
    """A neighbour did not deliver what the barrier waits for within the configured timeout."""


@dataclass
class NodeResult:
    """What one node ended with (``value`` is private; it never leaves the node)."""

    node: int
    value: float
    finals: list[float]  # final x of every phase
    output: list[float]  # combine(): the k values of top-K, else one value
    iterations: int
    seconds: float
    z0_sent: dict[str, list[float]] = field(default_factory=dict)  # group -> z_{i|j}^(0), j ascending
    x: list[float] = field(default_factory=list)  # x_i^(t), t = 0..iterations-1
    rejected: int = 0
    duplicates: int = 0

    @property
    def rounds_per_second(self) -> float:
        return self.iterations / self.seconds if self.seconds > 0 else 0.0


class KeyedSlots:
    """Values that neighbours send for one key (an iteration or a dual group), and one waiter."""

    def __init__(self, expected: list[int]) -> None:
        self.expected = expected
        self.slots: dict[tuple[str, int | str], dict[int, float]] = {}
        self._key: tuple[str, int | str] | None = None
        self._future: asyncio.Future[None] | None = None

    def put(self, key: tuple[str, int | str], sender: int, value: float) -> Literal["new", "dup", "conflict"]:
        slot = self.slots.setdefault(key, {})
        if sender in slot:
            return "dup" if slot[sender] == value else "conflict"
        slot[sender] = value
        fut = self._future
        if key == self._key and len(slot) == len(self.expected) and fut is not None and not fut.done():
            fut.set_result(None)
        return "new"

    async def take(self, key: tuple[str, int | str], within: float, what: str, node: int) -> dict[int, float]:
        slot = self.slots.setdefault(key, {})
        if len(slot) < len(self.expected):
            self._key = key
            self._future = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(within):
                    await self._future
            except TimeoutError:
                missing = [j for j in self.expected if j not in slot]
                raise NeighbourTimeoutError(
                    f"node {node}: no {what} from neighbour(s) {missing} within {within:g} s"
                ) from None
            finally:
                self._key = None
                self._future = None
        return self.slots.pop(key)


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of a (possibly nested) exception group: what a task group's caller re-raises,
    so a node failure surfaces as itself (e.g. :class:`NeighbourTimeoutError`), not as a group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
