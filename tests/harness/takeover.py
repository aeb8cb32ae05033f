"""Session takeovers by a holder of one node's broker password (issue 43, break 5).

The plan's broker binds sessions to user names, so a client that connects with node j's password
lands in node j's session: the broker closes node j's connection (publishing its last will,
``offline``) and, with a clean session, drops what was queued for it. :func:`take_over_again_and_again`
does that every :data:`FLAP` seconds, as the red team did, until told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from nlagg_node.runtime.tls import broker_endpoint
from tests.harness.mqtt_frames import connect_frame

if TYPE_CHECKING:
    from tests.harness.planbed import PlanBed

__all__ = ["FLAP", "take_over_again_and_again"]

FLAP = 0.3  # seconds between two takeovers (the red team's)


async def take_over_again_and_again(bed: PlanBed, node: int, stop: asyncio.Event) -> int:
    """Connect as ``node`` with its own password and a clean session every :data:`FLAP` s until
    ``stop``; each connection stays open until the next one is accepted (the broker then closes it).
    Returns how many the broker accepted."""
    endpoint = broker_endpoint(bed.url)
    user = f"node{node}"
    connect = connect_frame(f"flap-{node}", username=user, password=bed.password(user), clean=True)
    held: list[asyncio.StreamWriter] = []
    accepted = 0
    try:
        while not stop.is_set():
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(connect)
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, TimeoutError):
                async with asyncio.timeout(5):
                    head = await reader.readexactly(4)
                accepted += head[0] >> 4 == 2 and head[3] == 0
            for old in held:
                old.close()
            held = [writer]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLAP):
                    await stop.wait()
    finally:
        for old in held:
            old.close()
    return accepted
