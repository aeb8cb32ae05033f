"""A capture's session: how it reaches its broker, what it shows, and its read-and-commit loop,
alike for one run's capture (:func:`~adversary.capture.run_eavesdropper`) and a deployment's
(:func:`~adversary.capture.run_epoch_eavesdropper`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.tls import TlsSettings

__all__ = ["DEFAULT_SESSION", "CaptureSession", "capture_until", "commit_due"]


ATTEMPT_TIMEOUT = 10.0
"""Seconds one connection attempt may take (TCP/TLS and CONNACK), as for a node: a reconnection
after a broker crash must reach the broker again while the nodes still republish what that crash
lost (:data:`~nlagg_node.runtime.peers.RESEND_AFTER`), so one stuck attempt cannot take 30 s."""


@dataclass(frozen=True, kw_only=True)
class CaptureSession:
    """A capture's session.

    prefix : the topic prefix of the run (or of the deployment, ``P`` of ``P/R/e{k}``).
    username, password, tls : the broker login; ``tls`` verifies an ``mqtts://`` broker (and gives
        a client certificate when it asks for one).
    live : a live table on the terminal (never with ``events``).
    stop_after : seconds the whole capture may take, its first connection included (None: until done).
    events : JSON lines for a supervising process instead of text.
    """

    prefix: str = "nlagg"
    username: str | None = None
    password: str | None = None
    live: bool = True
    stop_after: float | None = None
    events: bool = False
    tls: TlsSettings | None = None

    @property
    def shows_live(self) -> bool:
        """Whether the live table is drawn (not for a supervising process)."""
        return self.live and not self.events

    def subscriber(self, url: str, client_id: str) -> MqttTransport:
        """The capture's client at ``url`` with this session's login, connecting within ``stop_after``:
        the MQTT adapter acknowledging a message only when told to (after the transcript's commit),
        over a persistent session kept under ``client_id``."""
        within = 30.0 if self.stop_after is None else max(0.1, min(30.0, self.stop_after))
        return MqttTransport(
            url,
            client_id=client_id,
            username=self.username,
            password=self.password,
            tls=self.tls,
            manual_ack=True,
            reconnect_tries=40,
            backoff_max=2.0,
            connect_timeout=min(within, ATTEMPT_TIMEOUT),
            connect_within=within,
        )


DEFAULT_SESSION = CaptureSession()
"""An anonymous, plain ``nlagg`` session with a live table."""


async def capture_until(
    finished: asyncio.Event,
    read: Callable[[], Coroutine[Any, Any, None]],
    commit_loop: Callable[[asyncio.TaskGroup], Coroutine[Any, Any, None]],
) -> None:
    """Read and commit (in one task group, which the commit loop may add to) until reading ends or
    ``finished`` is set; then stop both. A failure of either is raised."""
    async with asyncio.TaskGroup() as tg:
        committer = tg.create_task(commit_loop(tg))
        reader = tg.create_task(read())
        done = tg.create_task(finished.wait())
        try:
            await asyncio.wait({reader, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (committer, reader, done):
                task.cancel()


def commit_due(pending: int, backlog: int, committed_at: float) -> bool:
    """Whether a capture commits (and acknowledges) now: ``pending`` messages unacknowledged, the
    subscriber's ``backlog`` still to read, the last commit at ``committed_at`` (monotonic). A full
    batch always; while the broker has nothing more to send, a small batch or a short wait."""
    if pending >= 256:
        return True
    return backlog == 0 and (pending >= 16 or time.monotonic() - committed_at >= 0.02)
