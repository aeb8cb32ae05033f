"""Bounds on the dashboard's connections that wait for a request: an outsider's idle sockets.

Before its request headers are in, a connection has shown no token: anyone who can reach the
port can open one and send nothing, or a header line a minute (slowloris). Without a bound,
about a thousand of them exhaust the process's file descriptors ("Too many open files") and the
dashboard stops answering everyone. :class:`ConnectionGate` counts the connections that *wait*
(connected, or kept alive after a response, with no request under way) and holds them to

- ``per_source`` per peer address and ``total`` in all: a new connection beyond either closes the
  oldest waiting one (of that address, or of all), never the newcomer, so a client that sends
  its request at once is served however many sockets an outsider holds open;
- ``header_s`` seconds each: a connection still waiting then is closed, however slowly it was
  trickling bytes in.

A connection whose request is under way (an open event stream included) is not counted:
serving it already needed its headers, and, off loopback, the token.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from nlagg_node.errors import ConfigError

__all__ = ["ConnectionGate", "GateLimits", "Peer", "gated_app", "gated_protocol"]

log = logging.getLogger("nlagg.dashboard")

Peer = tuple[str, int]


@dataclass(frozen=True)
class GateLimits:
    """Bounds on waiting connections (see the module docstring).

    The defaults stay far below a common descriptor limit of 1024 (with the listen backlog of
    128 the server accepts at once), and far above what one browser opens (6 per host).
    """

    per_source: int = 32
    total: int = 256
    header_s: float = 10.0

    def __post_init__(self) -> None:
        if not 1 <= self.per_source <= self.total:
            raise ConfigError("per_source", self.per_source, f"must lie in 1..total ({self.total})")
        if not self.header_s > 0:
            raise ConfigError("header_s", self.header_s, "must be positive")


class ConnectionGate:
    """The waiting connections of one server, oldest first, each closed at its deadline.

    The server calls :meth:`opened` and :meth:`closed` from its protocol, :meth:`started` and
    :meth:`finished` around each request (``peer`` is the request's client address).
    """

    def __init__(self, limits: GateLimits) -> None:
        self.limits = limits
        self.dropped = 0  # waiting connections closed by a bound or a deadline
        self._open: dict[Peer, asyncio.Transport] = {}
        self._waiting: OrderedDict[Peer, asyncio.TimerHandle] = OrderedDict()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def opened(self, peer: Peer, transport: asyncio.Transport) -> None:
        """A new connection: it waits; the oldest waiting one of its source, or of all, may go."""
        self.started(peer)  # a stale entry of the same address and port (its close still on the way)
        same = [p for p in self._waiting if p[0] == peer[0]]
        if len(same) >= self.limits.per_source:
            self._drop(same[0], "per-source bound")
        if len(self._waiting) >= self.limits.total:
            self._drop(next(iter(self._waiting)), "total bound")
        self._open[peer] = transport
        self._wait(peer)

    def started(self, peer: Peer) -> None:
        """``peer``'s request headers are in: it no longer waits."""
        timer = self._waiting.pop(peer, None)
        if timer is not None:
            timer.cancel()

    def finished(self, peer: Peer) -> None:
        """``peer``'s response is out: kept alive, it waits again (with a fresh deadline)."""
        if peer in self._open and peer not in self._waiting:
            self._wait(peer)

    def closed(self, peer: Peer) -> None:
        self.started(peer)
        self._open.pop(peer, None)

    def _wait(self, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        self._waiting[peer] = loop.call_later(self.limits.header_s, self._drop, peer, "header deadline")

    def _drop(self, peer: Peer, why: str) -> None:
        transport = self._open.pop(peer, None)
        self.started(peer)
        if transport is None:
            return
        if self.dropped == 0:
            log.warning(
                "dashboard: closed a connection without a request from %s (%s); further ones are"
                " only counted",
                peer[0],
                why,
            )
        self.dropped += 1
        transport.abort()


def gated_protocol(gate: ConnectionGate) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol, reporting each connection's opening and closing to ``gate``."""

    class GatedH11(H11Protocol):
        peer: Peer | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.peer = get_remote_addr(transport)  # what uvicorn gives the app as the client
            if self.peer is not None:
                gate.opened(self.peer, transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None:
                gate.closed(self.peer)
            super().connection_lost(exc)

    return GatedH11


def gated_app(app: ASGIApp, gate: ConnectionGate) -> ASGIApp:
    """``app``, telling ``gate`` when each request starts (its headers are in) and ends."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or client is None:
            await app(scope, receive, send)
            return
        peer = (str(client[0]), int(client[1]))
        gate.started(peer)
        try:
            await app(scope, receive, send)
        finally:
            gate.finished(peer)

    return call
