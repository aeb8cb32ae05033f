"""Live progress of a testbed run: what the launcher sees of it, and a rich line on stderr.

The launcher follows the run on its own connection: node 0's x messages (iteration and phase:
the nodes move in lockstep, one barrier apart) and every node's status (how many are done). The
eavesdropper's exposure events come from its child process. :class:`RunProgress` turns these
into :class:`Snapshot` s, at most a few per second; :func:`progress_line` renders them with rich
on stderr, and only when stderr is a terminal (``--json`` output stays clean either way).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.transport import Message, Transport
from ..runtime.wire import HotDecoder, StatusMsg, WireError, XMsg, split_x_batch, topics

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ProgressFn", "RunProgress", "Snapshot", "logs_above", "progress_line"]


@dataclass(frozen=True)
class Snapshot:
    """Where a run stands: ``t`` of ``cap`` iterations (``cap`` the fixed schedule's, a bound with
    early stopping), the phase, rounds per second since the first x, the time left at that rate if
    the run went to the cap, nodes done, exposures the eavesdropper reported."""

    phase: str
    t: int
    cap: int
    rounds_per_second: float
    eta_seconds: float | None
    done: int
    n: int
    exposures: int


ProgressFn = Callable[[Snapshot], None]
"""What receives the snapshots."""


class RunProgress:
    """Follows one run from the launcher's connection and reports a :class:`Snapshot` every ``every`` s.

    Parameters
    ----------
    n, cap : the run's nodes and the iterations of its fixed schedule.
    exposures : how many nodes the eavesdropper has exposed so far.
    report : called with each snapshot.
    """

    def __init__(
        self,
        prefix: str,
        run_id: str,
        n: int,
        cap: int,
        exposures: Callable[[], int],
        report: Callable[[Snapshot], None],
        every: float = 0.25,
    ) -> None:
        self.topics = topics(prefix, run_id)
        self.decode = HotDecoder(prefix, run_id).decode
        self.run = prefix, run_id
        self.n, self.cap, self.every = n, cap, every
        self.exposures, self.report = exposures, report
        self.t, self.phase = -1, ""
        self.done: set[int] = set()
        self.first: tuple[float, int] | None = None
        self.last_report = 0.0

    async def follow(self, transport: Transport) -> None:
        """Subscribe to node 0's x (alone, or in-process among its host's x's) and every status, and
        report until cancelled."""
        await transport.subscribe(self.topics.x(0), self.topics.x_batches, self.topics.status("+"))
        async for msg in transport.messages():
            self.feed(msg)

    def feed(self, raw: Message) -> None:
        """One message of the run (anything else is ignored)."""
        try:
            batch = split_x_batch(raw.topic, raw.payload, *self.run)
            if batch is None:
                _, msg = self.decode(raw.topic, raw.payload)
            elif batch[0]:
                msg = batch[0][0].msg  # a host's x's of one iteration
            else:
                return
        except WireError:
            return
        now = time.monotonic()
        if isinstance(msg, StatusMsg):
            if msg.state == "done":
                self.done.add(msg.node)
        elif isinstance(msg, XMsg):
            self.t, self.phase = msg.t, msg.phase
            if self.first is None:
                self.first = (now, self.t)
        if now - self.last_report >= self.every or len(self.done) == self.n:
            self.last_report = now
            self.report(self.snapshot(now))

    def snapshot(self, now: float | None = None) -> Snapshot:
        """The run as last seen."""
        now = time.monotonic() if now is None else now
        rate = 0.0
        if self.first is not None and now > self.first[0]:
            rate = (self.t - self.first[1]) / (now - self.first[0])
        left = self.cap - 1 - self.t
        eta = left / rate if rate > 0 else None
        return Snapshot(
            self.phase, max(self.t, 0), self.cap, rate, eta, len(self.done), self.n, self.exposures()
        )


@contextmanager
def progress_line(enabled: bool, console: Console | None = None) -> Iterator[ProgressFn | None]:
    """A rich progress line, updated by the callback this yields (None when not ``enabled``).

    It is drawn on ``console`` when that is a terminal (the console the command prints its lines
    with: they then appear above the bar, never inside it), else on stderr. Log records go above
    it too while it is shown. Once every node is done the bar is full, whatever the cap.
    """
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    columns = (
        TextColumn("[bold]{task.fields[phase]}"),
        BarColumn(),
        TextColumn("t {task.completed:.0f}/{task.total:.0f}"),
        TextColumn("{task.fields[rate]:.0f} rounds/s"),
        TextColumn("ETA {task.fields[eta]}"),
        TextColumn("done {task.fields[done]}"),
        TextColumn("exposed {task.fields[exposed]}"),
    )
    shared = console if console is not None and console.is_terminal else Console(stderr=True)
    with Progress(*columns, console=shared, transient=True) as bar, logs_above(bar.console):
        task = bar.add_task("run", total=1, phase="starting", rate=0.0, eta="-", done="0", exposed=0)

        def show(s: Snapshot) -> None:
            eta = "-" if s.eta_seconds is None else f"<= {s.eta_seconds:.0f} s"
            finished = s.done >= s.n  # an early stop ends the run before the cap: the bar is full
            bar.update(
                task,
                total=s.cap,
                completed=s.cap if finished else s.t + 1,
                phase="done" if finished else s.phase,
                rate=s.rounds_per_second,
                eta="0 s" if finished else eta,
                done=f"{s.done}/{s.n}",
                exposed=s.exposures,
            )

        yield show


class _ConsoleHandler(logging.Handler):
    """Writes records, formatted as ``like`` formats them, through a rich console (above its bar)."""

    def __init__(self, console: Console, like: logging.Handler) -> None:
        super().__init__(like.level)
        self.console = console
        self.setFormatter(like.formatter)

    def emit(self, record: logging.LogRecord) -> None:
        from rich.text import Text

        try:
            self.console.print(Text(self.format(record)), soft_wrap=True)
        except Exception:  # logging must never raise: logging.Handler's own rule
            self.handleError(record)


@contextmanager
def logs_above(console: Console) -> Iterator[None]:
    """While a live display is on ``console``: the root logger's terminal stream handlers print
    through it, so a log line goes above the display instead of into it."""
    root = logging.getLogger()
    swapped = [
        (h, _ConsoleHandler(console, h))
        for h in root.handlers
        if isinstance(h, logging.StreamHandler) and getattr(h.stream, "isatty", lambda: False)()
    ]
    for old, new in swapped:
        root.removeHandler(old)
        root.addHandler(new)
    try:
        yield
    finally:
        for old, new in swapped:
            root.removeHandler(new)
            root.addHandler(old)
