"""Child processes of a lab run: ``nlagg node`` and ``nlagg eavesdrop`` started on this machine.

One reader for all of them: every stdout line is kept, and the JSON ones (the node's ``--json``
result, the eavesdropper's ``--events``) are parsed and handed to a callback as they arrive. Used by
the testbed (:mod:`nlagg_node.lab.testbed`) and the fault harness (``tests/harness/faults.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from ..argv import eavesdrop_argv, this_python
from ..errors import TestbedError
from ..lifetime import parent_death_signal

__all__ = ["Child", "log_tail", "start_eavesdropper"]

Event = dict[str, Any]


def _append(path: Path) -> BinaryIO:
    return open(path, "ab")  # closed by the caller's with-block


class Child:
    """A running child process whose stdout is read line by line.

    Attributes
    ----------
    lines : every stdout line so far (decoded, stripped).
    events : the lines that were JSON objects, parsed, in order.
    subscribed : set when an ``{"event": "subscribed"}`` line arrives (the eavesdropper is listening).
    """

    def __init__(self, proc: asyncio.subprocess.Process, on_event: Callable[[Event], None] | None) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.events: list[Event] = []
        self.subscribed = asyncio.Event()
        self._on_event = on_event
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        nice: int = 0,
        on_event: Callable[[Event], None] | None = None,
    ) -> Child:
        """Start ``argv`` with stdin closed, stdout read here, stderr appended to ``log`` (else inherited).

        ``nice`` > 0 lowers its CPU priority by that much below this process's.
        """
        with contextlib.ExitStack() as stack:
            err = None if log is None else stack.enter_context(_append(log))
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=parent_death_signal(),  # a SIGKILLed launcher leaves no node running
            )
        if nice > 0 and hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        return cls(proc, on_event)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            self.lines.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            self.events.append(event)
            if event.get("event") == "subscribed":
                self.subscribed.set()
            if self._on_event is not None:
                self._on_event(event)

    def last_event(self, kind: str) -> Event | None:
        """The last ``{"event": kind, ...}`` line, if any."""
        return next((e for e in reversed(self.events) if e.get("event") == kind), None)

    def cpu_seconds(self) -> float | None:
        """The CPU time it has used so far (Linux: ``/proc``); None where that cannot be read."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int:
        """Wait for the exit and for the last stdout line to be read; the exit code."""
        rc = await self.proc.wait()
        await asyncio.gather(self._reader, return_exceptions=True)
        return rc

    async def kill(self) -> None:
        """SIGKILL: no clean disconnect, no last words."""
        await self._end(signal.SIGKILL, 0.0)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it is still running after ``grace`` seconds."""
        await self._end(signal.SIGTERM, grace)

    async def _end(self, sig: signal.Signals, grace: float) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                async with asyncio.timeout(grace if sig != signal.SIGKILL else None):
                    await self.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        # The pipe closes with the process: the reader ends on its own (a grandchild could hold it).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await asyncio.gather(self._reader, return_exceptions=True)
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


def log_tail(log: Path | None, lines: int = 3) -> list[str]:
    """The last ``lines`` lines of a child's log (none when there is no log)."""
    if log is None or not log.is_file():
        return []
    return log.read_text(errors="replace").strip().splitlines()[-lines:]


async def start_eavesdropper(
    url: str,
    run_id: str,
    prefix: str,
    db: Path,
    *,
    log: Path | None = None,
    nice: int = 0,
    verbose: bool = False,
    on_event: Callable[[Event], None] | None = None,
    within: float = 180.0,
    ca_file: Path | None = None,
) -> Child:
    """``nlagg eavesdrop --events --no-live`` as a child, returned once it has subscribed.

    ``ca_file`` verifies an ``mqtts://`` broker.

    Raises :class:`TestbedError` at once when the child exits before subscribing (with the last
    lines of its log), and (after stopping it) when it has not subscribed within ``within`` s. The
    deadline is generous on purpose: on a loaded machine a niced child's imports alone can take
    half a minute, and a slow start is not a failure.
    """
    argv = eavesdrop_argv(
        url,
        run_id,
        str(db),
        prefix=prefix,
        ca_file=None if ca_file is None else str(ca_file),
        events=True,
        live=False,
        verbose=verbose,
        program=this_python(),
    )
    child = await Child.start(argv, log=log, nice=nice, on_event=on_event)
    subscribed = asyncio.ensure_future(child.subscribed.wait())
    exited = asyncio.ensure_future(child.proc.wait())
    try:
        async with asyncio.timeout(within):
            await asyncio.wait((subscribed, exited), return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        await child.stop()
        raise TestbedError(f"the eavesdropper did not subscribe within {within:g} s") from None
    finally:
        for waiter in (subscribed, exited):
            waiter.cancel()
    if not child.subscribed.is_set():
        rc = await child.wait()
        last = " | ".join(log_tail(log))
        why = f": {last}" if last else ""
        raise TestbedError(f"the eavesdropper exited with {rc} before subscribing{why}")
    return child
