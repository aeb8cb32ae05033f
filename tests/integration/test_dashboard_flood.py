"""An outsider's sockets against the dashboard (issue 31): idle and half-sent requests, slowloris.

Before the bounds of adversary/reporting/dashboard/gate.py, 1100 half-sent requests exhausted a
dashboard's 1024 descriptors ("Too many open files") and it answered nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from adversary.reporting.dashboard import Dashboard, GateLimits
from tests.harness.transcripts import finished_max_run

ENTRY = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]
NOFILE = 1024  # the dashboard's descriptor limit, as on the host of the review
SOCKETS = 1100  # the outsider's, more than that limit
SOURCES = 11  # loopback addresses 127.0.0.2.. it dials from (the legitimate client: 127.0.0.1)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return finished_max_run(tmp_path_factory.mktemp("flood"))


@contextlib.contextmanager
def _dashboard_process(transcript: Path) -> Iterator[tuple[subprocess.Popen[str], int, str]]:
    """``nlagg dashboard`` on every address (so a token is needed), at most NOFILE descriptors."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    proc = subprocess.Popen(
        [*ENTRY, "dashboard", str(transcript), "--host", "0.0.0.0", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=(\S+)", line)
        assert found, line
        yield proc, int(found[1]), found[2]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _outsider(port: int) -> tuple[list[socket.socket], int]:
    """SOCKETS connections from SOURCES loopback addresses, every other one a half-sent request;
    returns them and how many connects failed."""
    socks, failed = [], 0
    for k in range(SOCKETS):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(5)
        try:
            sock.bind((f"127.0.0.{2 + k % SOURCES}", 0))
            sock.connect(("127.0.0.1", port))
            if k % 2:
                sock.sendall(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:
            failed += 1
        socks.append(sock)
    return socks, failed


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_outsiders_1100_sockets_leave_the_token_answered(finished: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = SOCKETS + 200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the outsider needs {need} descriptors; this process may have {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    try:
        with _dashboard_process(finished) as (proc, port, token):
            socks, failed = _outsider(port)
            try:
                time.sleep(0.5)  # let the dashboard accept what the kernel queued
                fds = _open_fds(proc.pid)
                start = time.monotonic()
                url = f"http://127.0.0.1:{port}/api/state?token={token}"
                with urllib.request.urlopen(url, timeout=10) as resp:
                    status, body = resp.status, resp.read()
                took = time.monotonic() - start
                alive = proc.poll() is None
                closed = sum(_closed_by_peer(sock) for sock in socks)
            finally:
                for sock in socks:
                    sock.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"fds {fds}, connects failed {failed}, closed by the dashboard {closed}, answered in {took:.3f} s")
    assert status == 200
    assert b'"run_id"' in body
    assert alive
    limits = GateLimits()
    # the waiting connections, plus what one turn of the loop may accept, plus the process's own
    assert fds <= limits.total + 128 + 64
    assert closed >= SOCKETS - failed - limits.total  # the rest were closed to stay within the bound


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        async with asyncio.timeout(seconds):
            return await reader.read(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


async def test_a_trickled_header_is_cut_at_its_deadline_and_a_source_holds_few(finished: Path) -> None:
    limits = GateLimits(per_source=3, total=8, header_s=0.5)
    async with Dashboard(finished, "127.0.0.1", 0, limits=limits) as dash:
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", dash.port)
        slow_w.write(b"GET / HTTP/1.1\r\n")

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for _ in range(40):  # one header byte every 0.05 s: 2 s of headers
                    slow_w.write(b"X")
                    await slow_w.drain()
                    await asyncio.sleep(0.05)

        dripping = asyncio.create_task(trickle())
        started = asyncio.get_running_loop().time()
        cut = await _closed_within(slow_r, 3.0)
        cut_after = asyncio.get_running_loop().time() - started
        dripping.cancel()
        slow_w.close()
        # per source: the fourth idle socket closes the first one (never the newest)
        idle = [await asyncio.open_connection("127.0.0.1", dash.port) for _ in range(4)]
        first_closed = await _closed_within(idle[0][0], 2.0)
        last_open = not await _closed_within(idle[-1][0], 0.2)
        # a request sent at once is served beside them
        reader, writer = await asyncio.open_connection("127.0.0.1", dash.port)
        writer.write(f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{dash.port}\r\n\r\n".encode())
        status = await reader.readline()
        for _, w in [*idle, (reader, writer)]:
            w.close()
    assert cut
    assert 0.4 <= cut_after < 2.0  # at the 0.5 s deadline, not after the 2 s the headers would take
    assert first_closed
    assert last_open
    assert status.startswith(b"HTTP/1.1 200")
