"""Waits that say what they wait for: a node waiting for its neighbours logs who, every few seconds.

Logged at INFO on the ``nlagg.progress`` logger (as :mod:`nlagg_node.runtime.pace`), which
``nlagg node`` shows on stderr by default: on a slow network the start-up wait can last minutes, and
a silent node looks hung.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..errors import NlaggError

__all__ = ["check_not_finished", "wait_saying"]

log = logging.getLogger("nlagg.progress")


async def wait_saying(event: asyncio.Event, what: Callable[[], str], every: float = 5.0) -> None:
    """Wait for ``event``; every ``every`` s log ``what()`` with the seconds waited so far."""
    started = time.monotonic()
    while not event.is_set():
        try:
            async with asyncio.timeout(every):
                await event.wait()
        except TimeoutError:
            log.info("%s (%.0f s so far)", what(), time.monotonic() - started)


def check_not_finished(node: int, run_id: str, states: dict[int, str], neighbours: list[int]) -> None:
    """Refuse to start in a run whose every neighbour has published ``done`` (a re-run under the id
    of a finished run): it would wait for z^(0) that nobody sends any more."""
    if neighbours and all(states.get(j) == "done" for j in neighbours):
        raise NlaggError(
            f"node {node}: run {run_id!r} is finished (every neighbour's retained status is 'done');"
            " start a new run with another --run-id"
        )
