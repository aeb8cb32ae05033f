"""Children that do not outlive their launcher, and launchers that stop cleanly on SIGTERM.

A testbed starts a broker, an eavesdropper and a process per node. Two ways to end it must stop
them all:

* ``kill`` (SIGTERM), SIGHUP, a CI job's timeout or ``docker stop``: :func:`run_stoppable` turns
  the signal into a cancellation of the run, so its own clean-up stops every child, as Ctrl-C does;
* SIGKILL of the launcher, which no clean-up survives: on Linux every child is started with a
  parent-death signal (:func:`parent_death_signal`), so the kernel sends it SIGTERM (a node then
  leaves the run, the eavesdropper commits and exits, Mosquitto shuts down).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import StoppedBySignal

__all__ = ["parent_death_signal", "run_stoppable"]

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to send the child SIGTERM when its parent dies (Linux).

    None elsewhere. The C function is looked up here, before the fork, so the child only calls it.
    A child that changes its user id (Mosquitto started as root drops to its own user) loses the
    setting: for it, :func:`run_stoppable` is the safeguard.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    term = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, term, 0, 0, 0)

    return preexec


def run_stoppable(
    coro: Coroutine[Any, Any, T], signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)
) -> T:
    """``asyncio.run(coro)``, where SIGTERM or SIGHUP cancel ``coro`` as Ctrl-C does.

    Its ``finally`` blocks and context managers stop what it started. Raises
    :class:`StoppedBySignal` afterwards (a second signal during the clean-up is ignored).
    """
    received: list[int] = []

    async def guarded() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None

        def stop(signum: int) -> None:
            if not received:
                received.append(signum)
                task.cancel()

        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, stop, signum)
        return await coro

    try:
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        if not received:
            raise
        raise StoppedBySignal(received[0]) from None
    if received:  # the clean-up swallowed the cancellation: the result is not the whole run's
        raise StoppedBySignal(received[0])
    return result
