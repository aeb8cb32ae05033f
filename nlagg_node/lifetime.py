"""Children that do not outlive their launcher, and commands that stop cleanly on a signal.

A testbed starts a broker, an eavesdropper and a process per node. Every way to end it must stop
them all, quickly and with one line:

* Ctrl-C (SIGINT), ``kill`` (SIGTERM), SIGHUP, a CI job's timeout or ``docker stop``:
  :func:`run_stoppable` (async commands) and :func:`stop_on_signals` (the others) turn the signal
  into a cancellation of the run, so its own clean-up stops every child; the command then exits
  with ``128 + signal`` (130 for Ctrl-C) and one line (:func:`exit_interrupted`), no traceback;
* SIGKILL of the launcher (or the OOM killer), which no clean-up survives: on Linux every child is
  started with a parent-death signal (:func:`parent_death_signal`), so the kernel sends it SIGTERM
  (a node then leaves the run, the eavesdropper commits and exits, Mosquitto shuts down); the
  temporary folders it leaves are named after its pid (:func:`owned_tempdir`) and removed by the
  next command that makes one (:func:`sweep_orphans`), with any process still running from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .errors import StoppedBySignal

__all__ = [
    "INTERRUPTS",
    "exit_interrupted",
    "on_stop_signal",
    "owned_tempdir",
    "parent_death_signal",
    "partial_results_in",
    "run_stoppable",
    "stop_on_signals",
    "stop_requested",
    "sweep_orphans",
]

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
INTERRUPTS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a command cleanly (Ctrl-C, ``kill``, a closed terminal)."""

# The signals received by the run_stoppable in progress (None outside one): on_stop_signal adds to it.
_received: list[int] | None = None


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to send the child SIGTERM when its parent dies (Linux).

    None elsewhere. The C function is looked up here, before the fork, so the child only calls it.
    A child that changes its user id loses the setting: the private Mosquitto is told to keep the
    launcher's user (``user`` in its configuration) for that reason.
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


def on_stop_signal(stop: Callable[[], object], signals: tuple[int, ...] = INTERRUPTS) -> None:
    """Call ``stop`` on any of ``signals`` (in the running loop) instead of cancelling the whole run.

    For a coroutine whose own way to stop is gentler than a cancellation (the eavesdropper commits
    and prints its summary). Inside :func:`run_stoppable` the signal is still recorded, so the
    command exits with ``128 + signal`` once the coroutine has returned.
    """
    loop = asyncio.get_running_loop()

    def handler(signum: int) -> None:
        if _received is not None and not _received:
            _received.append(signum)
        stop()

    for signum in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, handler, signum)


def stop_requested() -> bool:
    """Whether the :func:`run_stoppable` in progress has received a stop signal (its clean-up runs):
    a coroutine that would go on waiting after its work (a dashboard) ends instead."""
    return bool(_received)


def run_stoppable(
    coro: Coroutine[Any, Any, T],
    signals: tuple[int, ...] = INTERRUPTS,
    *,
    partial: Path | None = None,
) -> T:
    """``asyncio.run(coro)``, where SIGINT, SIGTERM or SIGHUP cancel ``coro``.

    Its ``finally`` blocks and context managers stop what it started. Raises
    :class:`StoppedBySignal` afterwards (a second signal during the clean-up is ignored), naming
    ``partial`` (the command's output folder or file) when something is left there.
    """
    global _received
    received: list[int] = []

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            if len(received) == 1:  # the first signal: later ones wait for its clean-up
                task.cancel()

        on_stop_signal(stop, signals)
        return await coro

    outer, _received = _received, received
    try:
        result = asyncio.run(guarded())
    except (asyncio.CancelledError, KeyboardInterrupt):
        # KeyboardInterrupt: a Ctrl-C that came before the handlers were in place.
        raise StoppedBySignal(received[0] if received else signal.SIGINT, partial or _partial) from None
    finally:
        _received = outer
    if received:  # the clean-up swallowed the cancellation: the result is not the whole run's
        raise StoppedBySignal(received[0], partial or _partial)
    return result


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP in synchronous code: unwinds like Ctrl-C (``finally`` blocks run)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_partial: Path | None = None


def partial_results_in(path: Path | None) -> None:
    """Name what the running command leaves when it is interrupted (its ``--out``), for the line
    :func:`exit_interrupted` prints; a command calls it once, before its long part."""
    global _partial
    _partial = path


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or :class:`_Signalled`) that caused ``exc``: Typer turns one raised in a command
    into a silent ``SystemExit(130)``, chained to it."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Around a synchronous command: SIGINT, SIGTERM or SIGHUP unwind it like Ctrl-C (``finally``
    blocks and context managers run), and it ends with :class:`StoppedBySignal`, naming what
    :func:`partial_results_in` declared when something is left there."""

    def raise_it(signum: int, _frame: object) -> NoReturn:
        raise _Signalled(signum)

    previous = {s: signal.signal(s, raise_it) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as exc:
        cause = _interrupt_behind(exc)
        if cause is None:
            raise
        signum = cause.signum if isinstance(cause, _Signalled) else signal.SIGINT
        raise StoppedBySignal(signum, _partial) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def exit_interrupted(exc: BaseException) -> NoReturn:
    """One line on stderr and exit ``128 + signal`` for a :class:`StoppedBySignal` (or a bare
    ``KeyboardInterrupt``, which is Ctrl-C); the CLI's boundary calls it."""
    stopped = exc if isinstance(exc, StoppedBySignal) else StoppedBySignal(signal.SIGINT)
    print(f"nlagg: {stopped}", file=sys.stderr, flush=True)
    sys.exit(128 + stopped.signum)


# Temporary folders owned by a process ------------------------------------------------------------

_OWNED = "nlagg-{kind}-{pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _processes_using(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder`` (a Mosquitto started with a config in it)."""
    needle = str(folder).encode()
    found = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
    return found


def sweep_orphans(base: Path | None = None) -> list[Path]:
    """Remove the folders :func:`owned_tempdir` made for processes that are gone (SIGKILLed), after
    stopping (SIGTERM) any process still running from one of them; the folders removed."""
    where = Path(base if base is not None else tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for folder in where.glob("nlagg-*-*-*"):
            parts = folder.name.split("-")
            if len(parts) < 4 or not parts[2].isdigit() or not folder.is_dir():
                continue
            if int(parts[2]) == os.getpid() or _alive(int(parts[2])):
                continue
            for pid in _processes_using(folder):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@contextlib.contextmanager
def owned_tempdir(kind: str) -> Iterator[Path]:
    """A temporary folder ``nlagg-KIND-PID-xxxx``, removed on exit; a later call removes it even
    if this process was killed first (:func:`sweep_orphans`, which runs here first)."""
    sweep_orphans()
    with tempfile.TemporaryDirectory(prefix=_OWNED.format(kind=kind, pid=os.getpid())) as path:
        yield Path(path)
