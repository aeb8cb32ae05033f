"""Progress (issue 15): the testbed's live line, a node's periodic log line, a dying eavesdropper."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from nlagg_node import load_config
from nlagg_node.errors import TestbedError
from nlagg_node.lab.children import start_eavesdropper
from nlagg_node.lab.progress import RunProgress, Snapshot
from nlagg_node.lab.testbed import run_testbed
from nlagg_node.runtime.pace import Pace
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, encode, encode_x, topics

T = topics("nlagg", "p1")


def test_run_progress_follows_node_zero_and_the_statuses() -> None:
    seen: list[Snapshot] = []
    watch = RunProgress("nlagg", "p1", 3, 500, lambda: 2, seen.append, every=0.0)
    for t in range(5):
        watch.feed(Message(T.x(0), encode_x(node=0, t=t, phase="max", x=1.5, quiet=t)))
    watch.feed(Message(T.x(0), b"not json"))  # ignored
    for i in range(3):
        watch.feed(Message(T.status(i), encode(StatusMsg(node=i, state="done", iterations=5))))
    last = seen[-1]
    assert (last.phase, last.t, last.cap, last.done, last.n, last.exposures) == ("max", 4, 500, 3, 3, 2)
    assert last.rounds_per_second > 0
    assert last.eta_seconds is not None


def test_pace_logs_a_line_per_period(caplog: pytest.LogCaptureFixture) -> None:
    pace = Pace([4], 7000, every=0.0)
    with caplog.at_level(logging.INFO, logger="nlagg.progress"):
        pace.tick(0, "max")
        pace.tick(64, "max")
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["node 4: t=64 of at most 7000"]


def _kill_eavesdropper() -> bool:
    """SIGKILL this process's `nlagg eavesdrop` child; whether there was one."""
    me = os.getpid()
    for task in Path(f"/proc/{me}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"eavesdrop" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
                return True
    return False


@pytest.mark.mosquitto
async def test_testbed_reports_progress_and_stops_when_its_eavesdropper_dies(
    mosquitto_url: str, tmp_path: Path
) -> None:
    cfg = load_config(n=6, trials=1, seed=4, t_max=300, early_stop=False)
    seen: list[Snapshot] = []
    summary = await run_testbed(cfg, broker_url=mosquitto_url, in_process=True, on_progress=seen.append)
    assert summary["iterations"] == 300
    assert (seen[-1].done, seen[-1].t, seen[-1].cap) == (6, 299, 300)

    killed: list[bool] = []

    def kill_once(s: Snapshot) -> None:
        if s.t >= 20 and not killed:
            killed.append(_kill_eavesdropper())

    long = cfg.model_copy(update={"t_max": 200_000})
    async with asyncio.timeout(120):  # a guard against a hang, not a timed assertion
        with pytest.raises(TestbedError, match="eavesdropper exited with code -9 while the nodes"):
            await run_testbed(long, broker_url=mosquitto_url, in_process=True, on_progress=kill_once)
    assert killed == [True]


async def test_an_eavesdropper_exiting_before_it_subscribes_fails_at_once(tmp_path: Path) -> None:
    """No wait for the (generous) subscribe deadline: its exit and last log line come back at once."""
    with pytest.raises(TestbedError, match=r"exited with \d+ before subscribing: .*run_id='bad id'"):
        async with asyncio.timeout(60):
            await start_eavesdropper(
                "mqtt://127.0.0.1:1", "bad id", "nlagg", tmp_path / "t.sqlite", log=tmp_path / "e.log"
            )


@pytest.mark.mosquitto
@pytest.mark.parametrize("external", [True, False], ids=["given-broker", "private-broker"])
async def test_the_eavesdropper_logs_to_the_run_folder(
    external: bool, mosquitto_url: str, tmp_path: Path
) -> None:
    """Its log stays out of the testbed's output; a warning about a broker the user gave is said."""
    said: list[str] = []
    cfg = load_config(n=4, trials=1, seed=2, t_max=40, early_stop=False)
    broker = mosquitto_url if external else None  # both admit anonymous clients
    await run_testbed(cfg, broker_url=broker, in_process=True, out_dir=tmp_path, on_event=said.append)
    assert "admits anonymous clients" in (tmp_path / "eavesdropper.log").read_text()
    warned = [line for line in said if "admits anonymous clients" in line]
    assert len(warned) == (1 if external else 0)
