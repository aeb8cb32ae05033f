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
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from adversary.capture.eavesdropper import Eavesdropper
from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--t-max", type=int, default=2000)
    ap.add_argument("--op", default="max")
    ap.add_argument("--every", type=int, default=256, help="messages per commit")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
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
