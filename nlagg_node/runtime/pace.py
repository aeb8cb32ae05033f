"""A node's progress line: every few seconds, where the loop is and how fast it goes (``nlagg node``).

Logged at INFO on the ``nlagg.progress`` logger, which ``nlagg node`` shows on stderr by default.
The loop calls :meth:`Pace.tick` every 64 iterations; the clock is read only then.
"""

from __future__ import annotations

import logging
import time

__all__ = ["Pace"]

log = logging.getLogger("nlagg.progress")


class Pace:
    """Logs ``t`` of ``cap``, the phase and rounds per second of the nodes ``ids`` every ``every`` s."""

    def __init__(self, ids: list[int], cap: int, every: float = 5.0) -> None:
        self.who = f"node {ids[0]}" if len(ids) == 1 else f"nodes {ids[0]}..{ids[-1]}"
        self.cap, self.every = cap, every
        self.since: tuple[float, int] | None = None

    def tick(self, t: int, phase: str) -> None:
        """At iteration ``t``: a line if ``every`` seconds have passed since the last one."""
        now = time.monotonic()
        if self.since is None:
            self.since = (now, t)
            return
        then, t_then = self.since
        if now - then >= self.every:
            rate = (t - t_then) / (now - then)
            log.info("%s: t=%d of at most %d, phase %s, %.0f rounds/s", self.who, t, self.cap, phase, rate)
            self.since = (now, t)
