"""The dashboard in a real browser: Debian's chromium, driven by Playwright (no ``playwright install``).

The page exposes its state for tests: every node of the graph is an element with ``data-node`` and
``data-state`` (``honest``, ``interval``, ``exposed``, ``corrupted``; ``data-value`` when a value is
known), and ``<body data-t>`` is the iteration shown.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adversary.simulated import simulate_transcript
from nlagg_node.config import RunConfig

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ENTRY = "from nlagg_node.cli import main; main()"
T_MAX = 400  # max on 8 nodes, seed 3: the maximizer is exposed at t = 263


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class _Command:
    """A ``nlagg`` subprocess whose output is read line by line in a thread."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "COLUMNS": "200"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, within: float = 240.0) -> re.Match[str]:
        """The first output line (from now on) matching ``pattern``."""
        while True:
            try:
                line = self.lines.get(timeout=within)
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} in the output: {''.join(self.seen)}") from None
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def url(self) -> str:
        return self.wait_for(r"(http://127\.0\.0\.1:\d+/)").group(1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _states(page: Any) -> dict[int, dict[str, str]]:
    return {
        int(n["node"]): n
        for n in page.eval_on_selector_all(
            "[data-node]", "els => els.map(e => ({...e.dataset}))"
        )
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.mosquitto
def test_testbed_dashboard_shows_the_maximizer_exposed(browser: Any, tmp_path: Path) -> None:
    """n = 8, max, node 0 corrupted, watched live: the maximizer and only it is exposed."""
    out = tmp_path / "run"
    cmd = _Command(
        "testbed", "--n", "8", "--op", "max", "--corrupt", "0", "--seed", "3", "--t-max", str(T_MAX),
        "--broker-kind", "mosquitto", "--out", str(out), "--dashboard", "127.0.0.1:0",
    )  # fmt: skip
    try:
        url = cmd.url()
        page = browser.new_page(bypass_csp=True)  # Playwright evaluates strings; the page never does
        page.goto(url)
        page.wait_for_function(f"document.body.dataset.t === '{T_MAX - 1}'", timeout=600_000)
        page.wait_for_function("document.body.dataset.finished === 'true'", timeout=120_000)
        cmd.wait_for("the run is over")  # the testbed has written its summary (the ground truth)
        summary = json.loads((out / "summary.json").read_text())
        values = {int(k): float(v) for k, v in summary["private_values"].items()}
        maximizer = max(values, key=lambda i: values[i])
        assert maximizer != 0
        states = _states(page)
        assert states[maximizer]["state"] == "exposed"
        assert float(states[maximizer]["value"]) == values[maximizer]
        assert states[0]["state"] == "corrupted"
        others = [i for i in range(8) if i not in (0, maximizer)]
        assert [states[i]["state"] for i in others if states[i]["state"] == "exposed"] == []
        page.close()
    finally:
        rc = cmd.stop()
    assert rc == 0, "".join(cmd.seen)


def test_replay_of_a_finished_transcript_follows_the_slider(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "max.sqlite"
    simulate_transcript(RunConfig(op="max", n=8, t_max=T_MAX, seed=3), path, corrupted=[0])
    truth = json.loads(path.with_name(path.name + ".truth.json").read_text())
    values = {int(k): float(v) for k, v in truth["private_values"].items()}
    maximizer = max(values, key=lambda i: values[i])
    cmd = _Command("dashboard", str(path), "--port", "0")
    try:
        page = browser.new_page(bypass_csp=True)  # Playwright evaluates strings; the page never does
        page.goto(cmd.url())
        page.wait_for_function(
            f"document.body.dataset.finished === 'true' && document.body.dataset.t === '{T_MAX - 1}'",
            timeout=300_000,
        )
        exposed_at = int(_states(page)[maximizer]["exposedT"])
        assert 0 < exposed_at < T_MAX - 1

        def slide(t: int) -> dict[int, dict[str, str]]:
            page.eval_on_selector(
                "#slider", "(el, t) => { el.value = String(t); el.dispatchEvent(new Event('input')); }", t
            )
            page.wait_for_function(f"document.body.dataset.t === '{t}'", timeout=120_000)
            return _states(page)

        before = slide(exposed_at - 1)
        assert before[maximizer]["state"] != "exposed"
        assert before[0]["state"] == "corrupted"
        at = slide(exposed_at)
        assert (at[maximizer]["state"], float(at[maximizer]["value"])) == ("exposed", values[maximizer])
        assert page.eval_on_selector_all("#exposure-list li.later", "els => els.length") == 0
        slide(0)
        assert page.eval_on_selector_all("#exposure-list li.later", "els => els.length") == 1
        page.click("#live-btn")
        page.wait_for_function(f"document.body.dataset.t === '{T_MAX - 1}'", timeout=120_000)
        page.close()
    finally:
        rc = cmd.stop()
    assert rc == 0, "".join(cmd.seen)
