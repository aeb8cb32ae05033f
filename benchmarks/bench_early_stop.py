"""Wall time of ``nlagg testbed`` with early stopping against the fixed schedule, in one run.

    python benchmarks/bench_early_stop.py [--n 15] [--ops max,median,topk] [--seed 0]

For each operator: ``nlagg testbed --n N --op OP --json`` at its defaults (early stopping on) and
with ``--no-early-stop``, back to back (the machine is shared: compare the ratio, not the seconds),
then the simulator's stop iteration for the same configuration. Prints one JSON line per
operator: both walls, their ratio (target <= 0.4), the CPU seconds of each (the testbed process
and all it started), the load average before and after, exactness and whether the testbed ran
the simulator's number of iterations.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from nlagg_node.config import load_config
from nlagg_node.sim import simulate


def _children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _testbed(n: int, op: str, seed: int, early: bool) -> tuple[float, float, dict[str, object]]:
    """Wall and CPU seconds (the testbed and every process it started, broker included) and the summary."""
    flags = [] if early else ["--no-early-stop"]  # early stopping is the default
    cmd = [sys.executable, "-m", "nlagg_node", "testbed", "--n", str(n), "--op", op, "--seed", str(seed)]
    started, cpu = time.perf_counter(), _children_cpu()
    out = subprocess.run([*cmd, *flags, "--json"], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - started
    return wall, _children_cpu() - cpu, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--ops", default="max,median,topk")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for op in args.ops.split(","):
        load = os.getloadavg()[0]
        wall_early, cpu_early, early = _testbed(args.n, op, args.seed, True)
        wall_fixed, cpu_fixed, fixed = _testbed(args.n, op, args.seed, False)
        cfg = load_config(op=op, n=args.n, seed=args.seed, trials=1, record="none")
        sim_iterations = int(simulate(cfg).phase_iterations[0].sum())
        print(
            json.dumps(
                {
                    "op": op,
                    "n": args.n,
                    "wall_early_s": round(wall_early, 2),
                    "wall_fixed_s": round(wall_fixed, 2),
                    "ratio": round(wall_early / wall_fixed, 3),
                    "cpu_early_s": round(cpu_early, 1),
                    "cpu_fixed_s": round(cpu_fixed, 1),
                    "cpu_ratio": round(cpu_early / cpu_fixed, 3),
                    "load_average": [round(load, 1), round(os.getloadavg()[0], 1)],
                    "exact_early": early["exact"],
                    "exact_fixed": fixed["exact"],
                    "iterations_early": early["iterations"],
                    "iterations_fixed": fixed["iterations"],
                    "iterations_sim": sim_iterations,
                    "iterations_equal_sim": early["iterations"] == sim_iterations,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
