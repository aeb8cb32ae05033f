"""Start-up of the ``nlagg`` command as a user meets it: ``nlagg --help`` and a one-trial ``nlagg sim``.

Issue 17's targets on this machine: ``nlagg --help`` under 0.3 s and ``nlagg sim --trials 1`` under
1 s with the numba cache warm. Each command runs ``--repeat`` times in a fresh interpreter (the
console script's own line, ``from nlagg_node.cli import main; main()``); the best and the median wall
time and CPU time (user + system, all threads) are printed, next to the baseline measured in the same
run: a bare interpreter start (``python -c pass``, which here includes the site hooks). The machine
is shared, so the load average is printed too; the CPU time is the steadier figure when it is high.
Exit status 1 if a best wall time misses its target.

Run: python benchmarks/bench_startup.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "from nlagg_node.cli import main; main()"


def timed(cmd: list[str], env: dict[str, str], repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``repeat`` runs of ``cmd``."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9, help="runs per command; best and median are printed")
    args = ap.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    sim = ["sim", "--trials", "1", "--json"]
    subprocess.run([sys.executable, "-c", ENTRY, *sim], env=env, check=True, stdout=subprocess.DEVNULL)
    cases = [
        ("python -c pass (baseline)", [sys.executable, "-c", "pass"], None),
        ("nlagg --help", [sys.executable, "-c", ENTRY, "--help"], 0.3),
        ("nlagg sim --trials 1 --json", [sys.executable, "-c", ENTRY, *sim], 1.0),
    ]
    load = os.getloadavg()
    print(f"best / median of {args.repeat} runs; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    ok = True
    base = 0.0
    for name, cmd, target in cases:
        walls, cpus = timed(cmd, env, args.repeat)
        best = min(walls)
        line = (
            f"{name:30s} wall {best:.3f} / {statistics.median(walls):.3f} s, "
            f"CPU {min(cpus):.3f} / {statistics.median(cpus):.3f} s"
        )
        if target is None:
            base = best
        else:
            line += f"; {best / base:.1f}x the bare interpreter [target: under {target:g} s]"
            ok = ok and best < target
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
