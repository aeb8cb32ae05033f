"""The median at even n against the odd n beside it: worst leakage beyond the ideal world (issue 44).

    python benchmarks/bench_even_median.py [--n 49,50,51,99,100,101] [--trials 1000] [--seeds 0,1]

For each n and seed, ``simulate`` at the median's defaults: the worst leakage probability over the
ranks the ideal world does not expose (its holder excluded: for an even n the lower middle value, which
the run outputs), the leakage of the ranks around the output, the share of trials within 1e-9 and the
median iterations run. benchmarks/RESULTS.md, 2026-11-29 (fourth session), has a run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nlagg_node import RunConfig, simulate
from nlagg_node.schedule import distance_to
from nlagg_node.verdict import ideal_ranks


def measure(n: int, trials: int, seed: int) -> str:
    """One line: the worst rank beyond the ideal world and what surrounds it."""
    cfg = RunConfig(op="median", n=n, trials=trials, seed=seed, record="none")
    started = time.perf_counter()
    result = simulate(cfg)
    wall = time.perf_counter() - started
    leak = result.leakage_probability()
    ideal = set(ideal_ranks(cfg))
    worst, rank = max((float(p), r) for r, p in enumerate(leak) if r not in ideal)
    error = distance_to(result.output, result.truth_lo[:, None], result.truth_hi[:, None]).max(axis=1)
    around = ", ".join(f"{r}: {leak[r]:.3f}" for r in range(max(0, n // 2 - 2), min(n, n // 2 + 3)))
    return (
        f"n={n} seed={seed}: worst beyond the ideal world {worst:.3f} (rank {rank}); ranks {around};"
        f" exact {np.mean(error < 1e-9):.3f}; iterations {np.median(result.phase_iterations):.0f};"
        f" {wall:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", default="49,50,51,99,100,101")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--seeds", default="0,1")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        for n in (int(v) for v in args.n.split(",")):
            print(measure(n, args.trials, seed), flush=True)


if __name__ == "__main__":
    main()
