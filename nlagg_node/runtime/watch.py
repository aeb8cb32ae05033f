"""A node's departure watch: which neighbours have left the run for good (:mod:`nlagg_node.departure`).

A neighbour departs when it says so (status ``leaving`` with its departure iteration), when its
last will (``offline``) has stayed longer than ``timeout`` once the run has begun, or, in an epoch of
a continuous deployment, when its will has come :data:`~nlagg_node.departure.FLAP_LIMIT` times
(:func:`~nlagg_node.departure.flapped`: its session flaps, before the run begins or during it). Either way the
node stops waiting for the x's (and z^(0)) it has not delivered, from the first one it has not
delivered (every neighbour of the departed node waits for the same one), and announces the
departure in its status before it publishes the next x.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from ..departure import flapped
from ..errors import ConfigError, NlaggError
from .barrier import Barrier
from .peers import Neighbours, Outbox
from .wire import StatusMsg, encode

__all__ = ["DepartureWatch"]

log = logging.getLogger("nlagg.node")


class DepartureWatch:
    """The departures node ``node`` has seen among its neighbours.

    Parameters
    ----------
    node : the watching node.
    barriers : its x and z^(0) barriers, whose slots are its neighbours ascending.
    peers : its neighbours' last statuses.
    outbox : where its status goes.
    reject : how a refused message is counted.
    timeout : seconds a will must stay; ``neighbour_timeout`` bounds it.
    flap_limit : wills of one neighbour after which it departs at once (None: never, a one-shot run).
    """

    def __init__(
        self,
        node: int,
        barriers: tuple[Barrier, Barrier],
        peers: Neighbours,
        outbox: Outbox,
        reject: Callable[[str], None],
        *,
        timeout: float,
        neighbour_timeout: float,
        flap_limit: int | None = None,
    ) -> None:
        if not 0 < timeout < neighbour_timeout:
            raise ConfigError(
                "departure_timeout",
                timeout,
                f"must lie between 0 and the neighbour timeout ({neighbour_timeout:g} s)",
            )
        self.node = node
        self.x_in, self.z0_in = barriers
        self.slot = {j: k for k, j in enumerate(self.x_in.senders)}
        self.peers = peers
        self.outbox = outbox
        self.reject = reject
        self.timeout = timeout
        self.departed: dict[int, int] = {}
        self.flap_limit = flap_limit
        self.wills: Counter[int] = Counter()  # the wills of each neighbour after it was live
        self.running = False
        self._expiry: dict[int, asyncio.TimerHandle] = {}

    def start(self) -> None:
        """The run has begun: from now on a neighbour gone offline for good departs."""
        self.running = True
        for j, state in list(self.peers.state.items()):
            self.watch(j, state, None)

    def watch(self, j: int, state: str, before: str | None) -> None:
        """Arm (offline) or disarm (back) the departure timer of neighbour j; depart it at once
        when its will has come :attr:`flap_limit` times since it was live."""
        timer = self._expiry.pop(j, None)
        if timer is not None:
            timer.cancel()
        if state == "offline" and before in ("online", "running"):
            self.wills[j] += 1
            if flapped(self.wills[j], self.flap_limit):
                log.warning(
                    "node %d: neighbour %d's session was lost %d times: absent for this run",
                    self.node,
                    j,
                    self.wills[j],
                )
                self.depart(j, None)
                return
        if state == "offline" and before != "done" and self.running:
            loop = asyncio.get_running_loop()
            self._expiry[j] = loop.call_later(self.timeout, self._expired, j)

    def _expired(self, j: int) -> None:
        self._expiry.pop(j, None)
        if self.peers.state.get(j) == "offline" and j not in self.departed:
            self.depart(j, None)

    def depart(self, j: int, at: int | None) -> None:
        """Neighbour j has left at ``at`` (None: the x it has not delivered); tell the other neighbours.
        A neighbour departs once: later word of it changes nothing."""
        if j in self.departed:
            return
        slot = self.slot[j]
        end = self.x_in.end
        if at is not None and at >= end:
            return  # it had delivered everything: nothing changes
        try:
            t = self.x_in.depart(slot, at)
        except NlaggError as exc:
            self.reject(f"node {j} leaving: {exc}")
            return
        if t >= end:
            return
        self.z0_in.depart(slot)
        self.departed[j] = t
        log.warning("node %d: neighbour %d departed at t=%d", self.node, j, t)
        msg = StatusMsg(node=self.node, state="running", departed=self.wire(), run=self.outbox.run)
        self.outbox.set_status(encode(msg))

    def wire(self) -> dict[str, int] | None:
        """The departed neighbours as the wire carries them, or None."""
        return {str(j): t for j, t in sorted(self.departed.items())} or None

    def close(self) -> None:
        for timer in self._expiry.values():
            timer.cancel()
        self._expiry.clear()
