"""How fast ``nlagg dashboard`` serves a large transcript, against the CLI's own start, in one run.

    python benchmarks/bench_dashboard.py TRANSCRIPT [--repeat 3]
    python benchmarks/bench_dashboard.py --make PATH [--n 200]   # simulate one first (median, 1.2M messages)

Each repeat launches ``nlagg dashboard TRANSCRIPT --port 0`` as a fresh process (imports count)
and measures from the launch:

* page: the page answered (HTTP 200 on ``/``). Target: under 2 s for n = 200 and 1M messages.
* first state: the first Server-Sent Event carrying the graph (what the page draws first);
* complete: the state has read every row of the transcript (the page shows the last iteration);

and the largest SSE event in bytes: the payload is bounded by ``n * 400`` trajectory points
whatever the number of messages. Baseline: ``nlagg --help`` in a fresh process (interpreter and
CLI imports), measured in the same run; the ratios are printed beside the seconds. The machine
may be shared: the medians of ``--repeat`` alternating runs are compared.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ENTRY = "from nlagg_node.cli import main; main()"


def _baseline() -> tuple[float, float]:
    """Wall and CPU seconds of ``nlagg --help`` in a fresh process."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", ENTRY, "--help"], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return time.perf_counter() - started, cpu


def _rows(path: Path) -> int:
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT MAX(id) FROM messages").fetchone()[0])
    finally:
        db.close()


def _events(port: int):  # type: ignore[no-untyped-def]
    """Yield (event name, data bytes) from /api/events."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.sendall(f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    stream = sock.makefile("rb")
    name = ""
    try:
        for line in stream:
            if line.startswith(b"event: "):
                name = line[7:].strip().decode()
            elif line.startswith(b"data: "):
                yield name, line[6:].strip()
    finally:
        sock.close()


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), to compare across machine loads."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(path: Path, total: int) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "dashboard", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/", lines.get(timeout=120))):
            pass
        port = int(found.group(1))
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        page = time.perf_counter() - started
        page_cpu = _cpu(proc.pid)
        first = complete = first_cpu = complete_cpu = 0.0
        largest = 0
        for name, data in _events(port):
            largest = max(largest, len(data))
            doc = json.loads(data)
            if not first and name == "snapshot" and "config" in doc:
                first, first_cpu = time.perf_counter() - started, _cpu(proc.pid)
            if doc["messages"] >= total:
                complete, complete_cpu = time.perf_counter() - started, _cpu(proc.pid)
                break
        return {
            "page": page,
            "first": first,
            "complete": complete,
            "page_cpu": page_cpu,
            "first_cpu": first_cpu,
            "complete_cpu": complete_cpu,
            "largest_event": float(largest),
        }
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def make(path: Path, n: int) -> None:
    from adversary.simulated import simulate_transcript
    from nlagg_node.config import RunConfig

    started = time.perf_counter()
    simulate_transcript(RunConfig(op="median", n=n, seed=7), path, corrupted=[0])
    print(f"wrote {path}: {_rows(path)} messages in {time.perf_counter() - started:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("transcript", type=Path, nargs="?")
    ap.add_argument("--make", type=Path, help="simulate a median run into this new transcript first")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = args.transcript
    if args.make is not None:
        make(args.make, args.n)
        path = path or args.make
    if path is None:
        ap.error("give a transcript (or --make PATH)")
    total = _rows(path)
    runs, base = [], []
    for _ in range(args.repeat):
        base.append(_baseline())
        runs.append(measure(path, total))
    b, b_cpu = statistics.median(x[0] for x in base), statistics.median(x[1] for x in base)
    print(f"transcript {path}: {total} messages")
    print(f"baseline, nlagg --help in a fresh process: {b:.2f} s wall, {b_cpu:.2f} s CPU")
    milestones = (("page", "page served"), ("first", "first state"), ("complete", "whole transcript read"))
    for key, what in milestones:
        v = statistics.median(r[key] for r in runs)
        c = statistics.median(r[key + "_cpu"] for r in runs)
        print(
            f"  {what:>22}: {v:6.2f} s wall ({v / b:4.1f} x baseline), {c:6.2f} s CPU ({c / b_cpu:4.1f} x);"
            f" wall of each run: {[round(r[key], 2) for r in runs]}"
        )
    largest = max(r["largest_event"] for r in runs)
    print(f"  largest SSE event: {largest / 1e6:.2f} MB")
    page = statistics.median(r["page"] for r in runs)
    print(f"target: page served in under 2 s: {'met' if page < 2.0 else 'NOT met'} ({page:.2f} s wall)")


if __name__ == "__main__":
    main()
