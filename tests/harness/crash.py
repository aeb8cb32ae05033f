"""Crash a running task at a chosen moment (for resume tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest


async def crash_when(run: asyncio.Task[Any], ready: Callable[[], bool], *, within: float = 600.0) -> None:
    """Wait (at most ``within`` s) until ``ready()``, then cancel ``run``, which must still be running:
    the crash hits a running network, not one that already finished.

    The default is long: a run with checkpoints fsyncs every node's state at every iteration, and
    on a machine whose disk is busy (a Pi image installing beside it) the 13 s the certified run
    takes idle grew past 120 s."""
    async with asyncio.timeout(within):
        while True:  # polled: the moment is a state of other objects, which signal nothing
            if run.done() or ready():
                break
            await asyncio.sleep(0.002)
    assert not run.done()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
