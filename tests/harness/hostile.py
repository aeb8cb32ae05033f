"""A hostile client holding one node's own broker credentials: what issue 13's red team sent.

With the plan's ACL it may publish only on its node's own topics, so it sends what those allow:
x's whose iteration no SQLite integer holds (t = 2^64) or no run has (t = 10^12, before the run's
configuration is out), forged x's outside every barrier window or in no phase, payloads of 10 and
100 MiB, and session takeovers (another node's client id, three times). Every node and the
eavesdropper must drop all of it; the run must end as the simulator's.

The broker binds sessions to user names (``use_username_as_clientid``), so every connection of the
intruder, takeovers included, lands in the session of the node whose credentials it holds, and the
broker closes that node's connection: the node reconnects and finds its session. The intruder
speaks raw MQTT 3.1.1 (QoS 0 publishes, a persistent session, no acknowledgement of anything the
broker delivers meanwhile), so what it receives in the node's stead stays unacknowledged and goes
to the node again when it is back; a client that acknowledged it, or started a clean session,
would take those messages from the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from nlagg_node.runtime.tls import broker_endpoint
from nlagg_node.runtime.wire import topics
from tests.harness.mqtt_frames import CONNACK, DISCONNECT_FRAME, connack_code, connect_frame, publish_frame

if TYPE_CHECKING:
    from tests.harness.planbed import PlanBed

__all__ = ["Intruder"]


def _x(node: int, t: int, x: float, phase: str) -> bytes:
    return b'{"v":1,"node":%d,"t":%d,"phase":"%s","x":%r}' % (node, t, phase.encode(), x)


@dataclass
class Intruder:
    """Node ``node``'s credentials in the wrong hands.

    ``victim`` is another node whose client id it tries to take over, ``phase_at`` the run's phase
    name of an iteration, ``transcript`` the eavesdropper's file (to learn the current iteration).
    """

    url: str
    prefix: str
    run_id: str
    node: int
    victim: int
    username: str
    password: str
    t_total: int
    phase_at: Callable[[int], str]
    transcript: Path

    @classmethod
    def with_password_of(cls, bed: PlanBed, node: int, victim: int | None = None) -> Self:
        """Node ``node``'s broker password, taken from ``bed``'s plan (not its signing key)."""
        return cls(
            url=bed.url,
            prefix="nlagg",
            run_id=bed.run_id,
            node=node,
            victim=node if victim is None else victim,
            username=f"node{node}",
            password=bed.password(f"node{node}"),
            t_total=bed.t_total,
            phase_at=bed.phase_at,
            transcript=bed.db,
        )

    async def _session(
        self, client_id: str, frames: list[bytes], stay: float = 0.0, eager: bool = False
    ) -> None:
        """Connect, write ``frames`` at once, stay ``stay`` s, disconnect; acknowledge nothing.

        ``eager``: write them with the CONNECT, before its CONNACK (MQTT allows it), so that the
        broker has them before the node whose session this takes over can come back and close it,
        and return once the broker has closed the connection (it read the DISCONNECT, after every
        frame, or another connection took the session): the next one cannot take over this one.
        """
        endpoint = broker_endpoint(self.url)
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        try:
            connect = connect_frame(client_id, username=self.username, password=self.password)
            writer.write(connect + b"".join(frames) if eager else connect)
            head = await reader.readexactly(2)
            body = await reader.readexactly(head[1])
            assert head[0] >> 4 == CONNACK, head
            assert connack_code(body) == 0, "the broker refused the intruder's credentials"
            if not eager:
                writer.write(b"".join(frames))
            await writer.drain()
            await asyncio.sleep(stay)
            writer.write(DISCONNECT_FRAME)
            await writer.drain()
            if eager:  # what the session delivers meanwhile is read, never acknowledged
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10.0):
                        while await reader.read(1 << 16):
                            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the node came back and closed this connection: the broker took what it read
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def send(self, frames: list[bytes]) -> None:
        """Write ``frames`` in one session of the stolen credentials, with its CONNECT (``eager``):
        the broker reads every one before the node whose session this takes over can close it,
        however loaded the machine is."""
        await self._session(f"intruder-{self.node}", frames, eager=True)

    async def before_config(self) -> None:
        """Iterations out of every bound, sent before the run's configuration is published."""
        x = topics(self.prefix, self.run_id).x(self.node)
        frames = [publish_frame(x, _x(self.node, t, 1.0, self.phase_at(0))) for t in (2**64, 10**12)]
        await self._session(f"intruder-{self.node}", frames)

    def current_t(self) -> int:
        """The latest iteration of an x in the transcript (the run's current iteration, give or take)."""
        with contextlib.closing(sqlite3.connect(f"file:{self.transcript}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT MAX(t) FROM messages WHERE valid = 1 AND kind = 'x'").fetchone()
        return int(row[0] or 0)

    async def strike(self, *, big_payloads: bool = True, takeovers: int = 3) -> int:
        """Forged windows and phases, oversized payloads, session takeovers; returns the t it forged at."""
        t_now = self.current_t()
        x = topics(self.prefix, self.run_id).x(self.node)
        # Outside every window: near the end of the run, not just ahead of the transcript. The
        # transcript lags the nodes (the eavesdropper runs at nice 10), and an x forged at an
        # iteration the nodes had already passed would be refused as a conflict instead.
        ahead = self.t_total - 2
        frames = [publish_frame(x, _x(self.node, ahead, 42.0, self.phase_at(ahead)))] if ahead > t_now else []
        frames.append(publish_frame(x, _x(self.node, t_now + 1, 42.0, "not-a-phase")))
        frames.append(
            publish_frame(x, _x(self.node, self.t_total + 5, 42.0, self.phase_at(self.t_total - 1)))
        )
        await self.send(frames)  # with the CONNECT: the node taking its session back cannot cut them off
        if big_payloads:
            for size in (10 << 20, 100 << 20):
                await self._session(f"intruder-{self.node}", [publish_frame(x, b"9" * size)])
        for _ in range(takeovers):
            await self._session(f"nlagg-{self.run_id}-node-{self.victim}", [], stay=1.0)
        return t_now
