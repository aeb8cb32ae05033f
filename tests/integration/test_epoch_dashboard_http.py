"""The dashboard of an epoch store over HTTP: the token as for one run, and a fresh snapshot on the
event stream when a new epoch begins (its model: tests/unit/test_epoch_dashboard.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from adversary.reporting.dashboard import Dashboard
from adversary.transcript import EpochStore
from tests.harness.epochs import add_epoch


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def _next_snapshot(reader: asyncio.StreamReader) -> dict[str, Any]:
    while (line := await reader.readline()) != b"event: snapshot\n":
        assert line
    doc: dict[str, Any] = json.loads((await reader.readline()).decode().removeprefix("data: "))
    return doc


async def test_the_stream_moves_on_to_a_new_epoch_behind_the_token(tmp_path: Path) -> None:
    with EpochStore(tmp_path / "store", "P", "R") as store:
        add_epoch(store, 0, close=True)
        add_epoch(store, 1, close=False)
        async with Dashboard(store.folder, "0.0.0.0", 0, poll_every=0.05) as dash:
            base = f"http://127.0.0.1:{dash.port}"
            assert await asyncio.to_thread(_status, base + "/api/state") == 401
            assert await asyncio.to_thread(_status, f"{base}/api/state?token={dash.token}") == 200
            reader, writer = await asyncio.open_connection("127.0.0.1", dash.port)
            writer.write(
                f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{dash.port}\r\n"
                f"Authorization: Bearer {dash.token}\r\n\r\n".encode()
            )
            await writer.drain()
            async with asyncio.timeout(60):
                doc = await _next_snapshot(reader)
                while doc["epoch"] != 1 or "config" not in doc:
                    doc = await _next_snapshot(reader)
                assert [e["epoch"] for e in doc["epochs"]["series"]] == [0, 1]
                add_epoch(store, 2, close=False)
                doc = await _next_snapshot(reader)
            writer.close()
    assert doc["epoch"] == 2
    assert [e["epoch"] for e in doc["epochs"]["series"]] == [0, 1, 2]
    assert len(doc["positions"]) == 8
