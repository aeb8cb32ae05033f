"""CPU per captured message of the eavesdropper, against storing the bare message, in one process.

    python benchmarks/bench_capture.py [--n 15] [--t-max 2000] [--op max] [--every 256] [--repeat 3]

The messages are a simulated run's (``simulate_transcript``: config, z^(0), every x, statuses), in
capture order, fed without a broker, so only the capture's own work is timed:

* store: the baseline. Each message's topic, payload and receive time appended to a SQLite table
  (WAL, one transaction per ``--every`` messages): what any capture that keeps the raw messages pays;
* transcript: :meth:`adversary.transcript.Transcript.add`, committed as often: decode and validate
  (the nodes' rules, the barrier window, dedup and conflicts), the parsed fields stored beside;
* eavesdropper: :meth:`adversary.capture.eavesdropper.Eavesdropper.handle`: the above, plus the per-node
  views and the live attack's replay, one iteration at a time, as ``nlagg eavesdrop`` runs it.

Each is timed in CPU time (``time.process_time``) ``--repeat`` times, interleaved, and the best of
each kept (the machine is shared). Prints one JSON line: microseconds per message and the ratios to
the bare store. At n = 15 the eavesdropper receives about 15 x's per round, so its microseconds per
message times 15 are its CPU per round of the testbed.

    python benchmarks/bench_capture.py --mqtt [--messages 50000] [--n 200] [--rounds-per-s 33] [--repeat 3]

``--mqtt`` times the capture's MQTT client instead, on a private Mosquitto: ``--messages`` x's
(payloads as an n-node run's) are queued for its persistent session while it is away, then it
connects and drains them as the capture does, acknowledging each batch only after the SQLite
commit that holds it (``commit_due``: every 256 messages, or when the inbox runs dry). Wall
messages/s and CPU per message, best of ``--repeat``, and the ratio of the rate to the load a run
puts on the capture, ``--rounds-per-s`` times ``--n`` x's per second (an x per node and round).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Protocol

from adversary.capture.eavesdropper import Eavesdropper
from adversary.capture.session import DEFAULT_SESSION, commit_due
from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.transport import Message

Rows = list[tuple[str, bytes]]


def bare_store(path: Path, rows: Rows, every: int) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, topic TEXT, payload BLOB, received REAL)")
    sql = "INSERT INTO messages (topic, payload, received) VALUES (?, ?, ?)"
    buf: list[tuple[str, bytes, float]] = []
    for k, (topic, payload) in enumerate(rows, 1):
        buf.append((topic, payload, time.time()))
        if k % every == 0 or k == len(rows):
            db.execute("BEGIN")
            db.executemany(sql, buf)
            db.execute("COMMIT")
            buf.clear()
    db.close()


def transcript_add(path: Path, rows: Rows, every: int) -> None:
    with Transcript(path, run_id="bench") as tr:
        for k, (topic, payload) in enumerate(rows, 1):
            tr.add(topic, payload)
            if k % every == 0:
                tr.commit()


def eavesdropper_handle(path: Path, rows: Rows, every: int) -> None:
    with Transcript(path, run_id="bench") as tr:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "bench-eavesdropper"), tr)
        for k, (topic, payload) in enumerate(rows, 1):
            eaves.handle(topic, payload)
            if k % every == 0:
                tr.commit()
        assert eaves.rejected == 0, f"{eaves.rejected} messages rejected"


class Acker(Protocol):
    """The capture's client as the drain uses it (the hand-written client it replaced had the same
    surface: compared at commit 07cc6ae, benchmarks/RESULTS.md)."""

    async def connect(self) -> None: ...

    async def subscribe(self, *filters: str, qos: int = 1) -> None: ...

    def messages(self) -> AsyncIterator[Message]: ...

    def ack(self, deliveries: Iterable[Message]) -> None: ...

    def backlog(self) -> int: ...

    async def close(self) -> None: ...


def paho_manual_ack(url: str, client_id: str) -> Acker:
    """The capture's client: the MQTT adapter with ``manual_ack``, as ``nlagg eavesdrop`` makes it."""
    return DEFAULT_SESSION.subscriber(url, client_id)


def x_rows(n: int, count: int) -> Rows:
    """``count`` x messages of an n-node run, round by round (payloads shaped as the wire's)."""
    rows: Rows = []
    for k in range(count):
        i, t = k % n, k // n
        x = 0.1 + (k * 0.6180339887498949) % 0.8
        rows.append((f"nlagg/bench/node/{i}/x", b'{"v":1,"node":%d,"t":%d,"phase":"max","x":%r}' % (i, t, x)))
    return rows


async def fill(url: str, rows: Rows) -> None:
    """Publish ``rows`` at QoS 1 and wait until the broker has the last (and so every one)."""
    async with MqttTransport(url, client_id=f"bench-pub-{time.monotonic_ns()}") as pub:
        for topic, payload in rows[:-1]:
            pub.publish_nowait(topic, payload)
        await pub.publish(*rows[-1])


async def drain(client: Acker, db_path: Path, count: int) -> tuple[float, float]:
    """Read ``count`` queued messages, commit each batch to SQLite, then acknowledge it (as the
    capture). ``(wall s, CPU s)`` from the connection to the last ack."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, topic TEXT, payload BLOB)")
    sql = "INSERT INTO messages (topic, payload) VALUES (?, ?)"
    wall, cpu = time.perf_counter(), time.process_time()
    await client.connect()
    batch: list[Message] = []
    got = 0
    committed = time.monotonic()
    async for msg in client.messages():
        batch.append(msg)
        got += 1
        if got == count or commit_due(len(batch), client.backlog(), committed):
            db.execute("BEGIN")
            db.executemany(sql, [(m.topic, m.payload) for m in batch])
            db.execute("COMMIT")
            client.ack(batch)
            batch = []
            committed = time.monotonic()
        if got == count:
            break
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await client.close()
    db.close()
    return wall, cpu


async def bench_mqtt(
    args: argparse.Namespace, clients: dict[str, Callable[[str, str], Acker]]
) -> dict[str, object]:
    rows = x_rows(args.n, args.messages)
    best: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with start_mosquitto() as broker:
            for rep in range(args.repeat):
                for name, make in clients.items():
                    client_id = f"bench-capture-{name}-{rep}"
                    first = make(broker.url, client_id)
                    await first.connect()
                    await first.subscribe("nlagg/bench/#", qos=1)
                    await first.close()  # the session keeps the subscription: what follows is queued
                    await fill(broker.url, rows)
                    wall, cpu = await drain(
                        make(broker.url, client_id), Path(tmp) / f"{name}-{rep}.db", len(rows)
                    )
                    old = best.get(name, (float("inf"), float("inf")))
                    best[name] = (min(old[0], wall), min(old[1], cpu))
    needed = args.rounds_per_s * args.n
    out: dict[str, object] = {
        "messages": len(rows),
        "needed_per_s": needed,
        "per_s": {name: round(len(rows) / w) for name, (w, _) in best.items()},
        "cpu_us_per_message": {name: round(c / len(rows) * 1e6, 1) for name, (_, c) in best.items()},
        "over_needed": {name: round(len(rows) / w / needed, 2) for name, (w, _) in best.items()},
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mqtt", action="store_true", help="time the capture's MQTT client on Mosquitto")
    ap.add_argument("--messages", type=int, default=50_000, help="--mqtt: messages drained per run")
    ap.add_argument("--rounds-per-s", type=float, default=33.0, help="--mqtt: the run's rounds per second")
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--t-max", type=int, default=2000)
    ap.add_argument("--op", default="max")
    ap.add_argument("--every", type=int, default=256, help="messages per commit")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.mqtt:
        clients: dict[str, Callable[[str, str], Acker]] = {"paho_manual_ack": paho_manual_ack}
        print(json.dumps(asyncio.run(bench_mqtt(args, clients))), flush=True)
        return
    cfg = RunConfig(op=args.op, n=args.n, t_max=args.t_max, seed=0, early_stop=False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        src = simulate_transcript(cfg, folder / "source.sqlite", run_id="bench")
        db = sqlite3.connect(src)
        sql = "SELECT topic, payload FROM messages ORDER BY id"  # capture order
        rows: Rows = [(str(topic), bytes(payload)) for topic, payload in db.execute(sql)]
        db.close()
        cases: dict[str, Callable[[Path, Rows, int], None]] = {
            "store": bare_store,
            "transcript": transcript_add,
            "eavesdropper": eavesdropper_handle,
        }
        best = dict.fromkeys(cases, float("inf"))
        for rep in range(args.repeat):
            for name, fn in cases.items():
                path = folder / f"{name}-{rep}.sqlite"
                start = time.process_time()
                fn(path, rows, args.every)
                best[name] = min(best[name], (time.process_time() - start) / len(rows))
    us = {name: round(v * 1e6, 2) for name, v in best.items()}
    print(
        json.dumps(
            {
                "messages": len(rows),
                "us_per_message": us,
                "transcript_over_store": round(best["transcript"] / best["store"], 2),
                "eavesdropper_over_store": round(best["eavesdropper"] / best["store"], 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
