"""Live progress of a testbed run: what the launcher sees of it, and a rich line on stderr.

The launcher follows the run on its own connection: node 0's x messages (iteration and phase:
the nodes move in lockstep, one barrier apart) and every node's status (how many are done). The
eavesdropper's exposure events come from its child process. :class:`RunProgress` turns these
into :class:`Snapshot` s, at most a few per second; :func:`progress_line` renders them with rich
on stderr, and only when stderr is a terminal (``--json`` output stays clean either way).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..runtime.transport import Message, Transport
from ..runtime.wire import X_TYPES, HotDecoder, StatusMsg, WireError, topics

__all__ = ["ProgressFn", "RunProgress", "Snapshot", "progress_line"]


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
        self.n, self.cap, self.every = n, cap, every
        self.exposures, self.report = exposures, report
        self.t, self.phase = -1, ""
        self.done: set[int] = set()
        self.first: tuple[float, int] | None = None
        self.last_report = 0.0

    async def follow(self, transport: Transport) -> None:
        """Subscribe to node 0's x and every status, and report until cancelled."""
        await transport.subscribe(self.topics.x(0), self.topics.status("+"))
        async for msg in transport.messages():
            self.feed(msg)

    def feed(self, raw: Message) -> None:
        """One message of the run (anything else is ignored)."""
        try:
            _, msg = self.decode(raw.topic, raw.payload)
        except WireError:
            return
        now = time.monotonic()
        if isinstance(msg, StatusMsg):
            if msg.state == "done":
                self.done.add(msg.node)
        elif isinstance(msg, X_TYPES):
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
def progress_line(enabled: bool) -> Iterator[ProgressFn | None]:
    """A rich progress line on stderr, updated by the callback this yields (None when not ``enabled``)."""
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
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("run", total=1, phase="starting", rate=0.0, eta="-", done="0", exposed=0)

        def show(s: Snapshot) -> None:
            eta = "-" if s.eta_seconds is None else f"<= {s.eta_seconds:.0f} s"
            bar.update(
                task, total=s.cap, completed=s.t + 1, phase=s.phase, rate=s.rounds_per_second,
                eta=eta, done=f"{s.done}/{s.n}", exposed=s.exposures,
            )  # fmt: skip

        yield show
