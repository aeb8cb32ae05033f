"""The dashboard's HTTP server on loopback, without a browser: access rules and the event stream (its
model: tests/unit/test_dashboard.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from adversary.reporting.dashboard import Dashboard
from adversary.reporting.dashboard.server import MAX_EVENT_STREAMS
from tests.harness.transcripts import finished_max_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished max run on 8 nodes, node 0 corrupted, as a transcript (no ground truth beside it)."""
    return finished_max_run(tmp_path_factory.mktemp("dash"))


def _get(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


async def test_loopback_needs_no_token_but_a_loopback_host_header(finished: Path) -> None:
    async with Dashboard(finished, "127.0.0.1", 0) as dash:
        assert dash.token is None
        base = f"http://127.0.0.1:{dash.port}"
        status, body, headers = await asyncio.to_thread(_get, base + "/")
        assert status == 200
        assert b"data-t" in body
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert (await asyncio.to_thread(_get, base + "/", "GET", {"Host": "evil.example"}))[0] == 403
        assert (await asyncio.to_thread(_get, base + "/api/state", "POST"))[0] == 405
        assert (await asyncio.to_thread(_get, base + "/static/app.js"))[0] == 200


async def test_other_hosts_need_the_token(finished: Path) -> None:
    async with Dashboard(finished, "0.0.0.0", 0) as dash:
        assert dash.token is not None
        base = f"http://127.0.0.1:{dash.port}"
        assert (await asyncio.to_thread(_get, base + "/api/state"))[0] == 401
        assert (await asyncio.to_thread(_get, base + "/api/state?token=wrong"))[0] == 401
        status, _, headers = await asyncio.to_thread(_get, f"{base}/?token={dash.token}")
        assert status == 200
        assert "HttpOnly" in headers["Set-Cookie"]
        bearer = {"Authorization": f"Bearer {dash.token}"}
        status, body, _ = await asyncio.to_thread(_get, base + "/api/state", "GET", bearer)
        assert status == 200
        assert json.loads(body)["run_id"] == dash.state.run_id


async def test_events_stream_starts_with_a_snapshot(finished: Path) -> None:
    async with Dashboard(finished, "127.0.0.1", 0) as dash:
        reader, writer = await asyncio.open_connection("127.0.0.1", dash.port)
        writer.write(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{dash.port}\r\n\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(60):
            while (line := await reader.readline()) != b"event: snapshot\n":
                assert line
            data = (await reader.readline()).decode()
        writer.close()
        doc = json.loads(data.removeprefix("data: "))
        assert doc["run_id"] == dash.state.run_id
        assert len(doc["positions"]) == 8


async def _open_stream(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A GET /api/events; its status line, and the stream read up to its first snapshot if 200."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    await writer.drain()
    status = await reader.readline()
    if b" 200 " in status:
        while (line := await reader.readline()) != b"event: snapshot\n":
            assert line
    return reader, writer, status


async def test_event_streams_are_capped_with_a_503(finished: Path) -> None:
    async with Dashboard(finished, "127.0.0.1", 0) as dash:
        held = []
        try:
            async with asyncio.timeout(120):
                for _ in range(MAX_EVENT_STREAMS):
                    reader, writer, status = await _open_stream(dash.port)
                    assert b" 200 " in status, status
                    held.append(writer)
                reader, writer, status = await _open_stream(dash.port)
                body = await reader.read()
            writer.close()
            assert b" 503 " in status, status
            assert f"{MAX_EVENT_STREAMS} event streams are open".encode() in body
            # The page's other routes still answer.
            assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{dash.port}/api/state"))[0] == 200
            # A closed stream gives its slot back (once the server has seen it go).
            held.pop().close()
            async with asyncio.timeout(60):
                while True:
                    _, writer, status = await _open_stream(dash.port)
                    held.append(writer)
                    if b" 200 " in status:
                        break
                    await asyncio.sleep(0.2)
        finally:
            for w in held:
                w.close()
