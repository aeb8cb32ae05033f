"""Wall time of ``nlagg testbed`` with early stopping against the fixed schedule, in one run.

    python benchmarks/bench_early_stop.py [--n 15] [--ops max,median,topk] [--seed 0]

For each operator: ``nlagg testbed --n N --op OP --json`` with ``--early-stop`` and with
``--no-early-stop``, back to back (the machine is shared: compare the ratio, not the seconds),
then the simulator's stop iteration for the same configuration. Prints one JSON line per
operator: both walls, their ratio (target <= 0.4), exactness and whether the testbed ran the
simulator's number of iterations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from nlagg_node.config import load_config
from nlagg_node.sim import simulate


def _testbed(n: int, op: str, seed: int, early: bool) -> tuple[float, dict[str, object]]:
    flag = "--early-stop" if early else "--no-early-stop"
    cmd = [sys.executable, "-m", "nlagg_node", "testbed", "--n", str(n), "--op", op, "--seed", str(seed)]
    started = time.perf_counter()
    out = subprocess.run([*cmd, flag, "--json"], check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - started, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--ops", default="max,median,topk")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for op in args.ops.split(","):
        wall_early, early = _testbed(args.n, op, args.seed, True)
        wall_fixed, fixed = _testbed(args.n, op, args.seed, False)
        cfg = load_config(op=op, n=args.n, seed=args.seed, trials=1, record="none", early_stop=True)
        sim_iterations = int(simulate(cfg).phase_iterations[0].sum())
        print(
            json.dumps(
                {
                    "op": op,
                    "n": args.n,
                    "wall_early_s": round(wall_early, 2),
                    "wall_fixed_s": round(wall_fixed, 2),
                    "ratio": round(wall_early / wall_fixed, 3),
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
