"""Wall time of the README's first command, ``nlagg testbed --n 15 --op max``, in both layouts it may pick.

Where Mosquitto is installed (on PATH, or in /usr/sbin or /usr/local/sbin, where Debian puts it off a
user's PATH) the testbed starts it and runs one process per node; on a machine without it, the
embedded broker with the nodes hosted in one process. The second is what ``--broker-kind amqtt``
picks here (its auto layout on the embedded broker), so both run on one machine: the command as a
user types it (a fresh interpreter, the console script's own line, in an empty folder), ``--repeat``
times, the layouts alternately. Printed per run: the layout it picked, the wall time of the whole
command, the testbed's own summary line (iterations, rounds/s, its wall) and the 1-minute load
average before and after, since the machine is shared.

Run: python benchmarks/bench_first_command.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nlagg_node.runtime.brokers import mosquitto_binary

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "from nlagg_node.cli import main; main()"
COMMAND = ["testbed", "--n", "15", "--op", "max"]
LAYOUTS = {"mosquitto": [], "bare machine": ["--broker-kind", "amqtt"]}
SUMMARY = re.compile(r"\d+ iterations, [\d.]+ rounds/s, wall [\d.]+ s")


def run_once(layout: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", ENTRY, *COMMAND, *LAYOUTS[layout]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
    after = os.getloadavg()[0]
    said = done.stdout + done.stderr
    found = SUMMARY.search(said)
    summary = found.group(0) if found else f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    picked = "in-process" if "hosting the nodes in one process" in said else "processes"
    return f"{layout:12} {picked:10} {wall:6.1f} s   {summary}   load {before:.1f} -> {after:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if mosquitto_binary() is None:
        raise SystemExit("bench_first_command: error: mosquitto: not installed (apt install mosquitto)")
    for _ in range(args.repeat):
        for layout in LAYOUTS:
            print(run_once(layout), flush=True)


if __name__ == "__main__":
    main()
