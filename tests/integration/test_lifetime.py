"""A stopped launcher leaves nothing running: SIGTERM cancels the run through its own clean-up, and a
SIGKILLed launcher's nodes and eavesdropper get SIGTERM from the kernel (Linux parent-death signal)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
CLI = (sys.executable, "-c", "from nlagg_node.cli import main; main()")


def processes_with(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_until_gone(text: str, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (left := processes_with(text)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def start_testbed(tmp_path: Path, run_id: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """A long testbed run (4 node processes), returned once its nodes are running; and its stderr so far."""
    err = tmp_path / "stderr.txt"
    args = ("testbed", "--n", "4", "--op", "max", "--t-max", "100000", "--no-early-stop", "--json")
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [*CLI, *args, "--run-id", run_id, *extra], stdout=subprocess.DEVNULL, stderr=sink
        )
    deadline = time.monotonic() + 120
    while len(processes_with(f"--run-id\0{run_id}")) < 6:  # the launcher, 4 nodes, the eavesdropper
        assert proc.poll() is None, err.read_text()
        assert time.monotonic() < deadline, err.read_text()
        time.sleep(0.1)
    time.sleep(1.0)  # into the iterations
    return proc, err.read_text()


@linux_only
@pytest.mark.mosquitto
def test_sigterm_stops_the_nodes_the_eavesdropper_and_the_broker(tmp_path: Path) -> None:
    run_id = f"life-term-{os.getpid()}"
    proc, so_far = start_testbed(tmp_path, run_id)
    port = re.search(r"mqtt://127\.0\.0\.1:(\d+)", so_far)
    assert port is not None, so_far
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "nlagg: stopped by SIGTERM; nothing left behind" in stderr
    assert "Traceback" not in stderr
    assert wait_until_gone(run_id, 10) == []
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", int(port.group(1))), timeout=2),
    ):
        pass  # the private broker is down


@linux_only
@pytest.mark.mosquitto
def test_a_killed_launcher_leaves_no_node_or_eavesdropper_running(mosquitto_url: str, tmp_path: Path) -> None:
    run_id = f"life-kill-{os.getpid()}"
    proc, _ = start_testbed(tmp_path, run_id, "--broker", mosquitto_url)
    proc.kill()  # no clean-up runs: the kernel's parent-death signal must reach every child
    proc.wait(timeout=10)
    assert wait_until_gone(run_id, 30) == []
