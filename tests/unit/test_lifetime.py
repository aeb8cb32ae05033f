"""SIGTERM cancels a run through its own clean-up (``run_stoppable``), in the test's process (the
launcher's children: tests/integration/test_lifetime.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from nlagg_node.errors import StoppedBySignal
from nlagg_node.lifetime import run_stoppable


def test_sigterm_cancels_the_run_after_its_clean_up() -> None:
    cleaned: list[str] = []

    async def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        finally:
            cleaned.append("children stopped")

    started = time.monotonic()
    with pytest.raises(StoppedBySignal, match="stopped by SIGTERM") as info:
        run_stoppable(run())
    assert info.value.signum == signal.SIGTERM
    assert cleaned == ["children stopped"]
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler ends with the run


def test_a_run_without_a_signal_returns_its_result() -> None:
    async def run() -> int:
        await asyncio.sleep(0)
        return 7

    assert run_stoppable(run()) == 7
