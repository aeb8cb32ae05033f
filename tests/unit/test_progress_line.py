"""Issue 33, item 8: log lines and the command's own lines go above the live bar, never into it; an
early stop fills the bar."""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from nlagg_node.lab.progress import Snapshot, progress_line

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal_log() -> Iterator[Terminal]:
    """A root handler writing to a terminal, as ``setup_logging`` installs one."""
    stream = Terminal()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)


def snapshot(t: int, done: int) -> Snapshot:
    return Snapshot("max", t, 7000, 40.0, 86.0, done, 4, 0)


def test_lines_go_above_the_bar_and_an_early_stop_fills_it(terminal_log: Terminal) -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    with progress_line(True, console) as show:
        assert show is not None
        show(snapshot(100, 0))
        time.sleep(0.2)
        logging.getLogger("nlagg.testbed").warning("a log line")
        console.print("broker mosquitto at mqtt://127.0.0.1:1883")
        show(snapshot(3439, 4))  # every node done: stopped early, far below the cap
        time.sleep(0.3)
    assert terminal_log.getvalue() == ""  # not written past the bar
    lines = [ANSI.sub("", part).strip() for part in re.split(r"[\r\n]", console.file.getvalue())]  # type: ignore[attr-defined]
    assert "nlagg.testbed WARNING a log line" in lines
    assert "broker mosquitto at mqtt://127.0.0.1:1883" in lines
    assert any("t 7000/7000" in line and "done 4/4" in line for line in lines)
    assert not any("t 3440/7000" in line for line in lines)
    handlers = logging.getLogger().handlers
    assert any(getattr(h, "stream", None) is terminal_log for h in handlers)  # given back at the end
