"""Leakage per rank with nodes that leave for good, against none (issue 16; docs/experiments.md).

For max and median at the defaults (n = 15, random geometric graph), 1000 trials each: no
departure, one and three departures. The departing nodes and their iterations are drawn once
from a fixed seed and are the same in every trial; the values and graphs are drawn per trial, so
the departing nodes hold random ranks. Prints, per rank (0 = largest value), the fraction of trials
in which the eavesdropper's view determines the value, the survivors' mean squared error and
whether a departure ever split the graph.

    python benchmarks/departure_leakage.py [--trials 1000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nlagg_node.config import RunConfig
from nlagg_node.rng import rng_for
from nlagg_node.schedule import Schedule, plan_phases
from nlagg_node.sim import simulate


def draw_departures(cfg: RunConfig, count: int) -> dict[int, int]:
    """``count`` distinct nodes, each leaving at a uniform iteration in the first half of the run."""
    rng = rng_for(cfg.seed, "departures", count)
    t_total = Schedule.of(plan_phases(cfg)).t_total
    nodes = rng.choice(cfg.n, size=count, replace=False)
    return {int(j): int(rng.integers(1, t_total // 2)) for j in nodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    args = ap.parse_args()
    for op in ("max", "median"):
        cfg = RunConfig(op=op, n=15, trials=args.trials, seed=16, record="none")
        base = None
        for count in (0, 1, 3):
            dep = draw_departures(cfg, count) if count else {}
            started = time.perf_counter()
            res = simulate(cfg, departures=dep)
            leak = res.leakage_probability()
            split = sum(len(c) > 1 for c in res.components) if dep else 0
            if base is None:
                base = leak
            print(
                f"{op:6s} departures={dep or '{}'}: mse {float(np.nanmean(res.mse)):.2e}, "
                f"split in {split}/{args.trials} trials, {time.perf_counter() - started:.1f} s"
            )
            print("  leakage by rank:", " ".join(f"{p:.3f}" for p in leak))
            print("  minus none     :", " ".join(f"{d:+.3f}" for d in leak - base))


if __name__ == "__main__":
    main()
