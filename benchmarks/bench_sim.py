"""Simulator throughput: ns per (trial x directed edge x iteration).

Workload of issue 2: 1000 trials, n = 15, RGG, max consensus, 3000 iterations.
A straightforward batched numpy loop (fresh arrays every iteration, fancy-index
gathers for the reverse edges) runs in the same process as the baseline, on the
same graphs, so the ratio is meaningful on a shared, noisy machine.
Target: 4 ns or less.

Run: python benchmarks/bench_sim.py [--trials 1000] [--t-max 3000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from nlagg_node import EdgeLayout, load_config, simulate
from nlagg_node.graphs import sample_graphs


def naive_loop(layout: EdgeLayout, s: np.ndarray, c: float, mu_z: float, t_max: int) -> np.ndarray:
    """The textbook batched loop: z and x as fresh arrays each iteration."""
    rng = np.random.default_rng(0)
    E = len(layout.src)
    rev = (np.arange(E) + E // 2) % E
    z = -layout.sign * mu_z + rng.standard_normal(E)
    cd = c * layout.degree
    x = np.empty(layout.n_nodes)
    for _ in range(t_max):
        v = np.zeros(layout.n_nodes)
        np.add.at(v, layout.src, layout.sign * z)
        x = np.maximum((-1.0 - v) / cd, s)
        z = 0.5 * z + 0.5 * (z[rev] + 2 * c * layout.sign[rev] * x[layout.dst])
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--t-max", type=int, default=3000)
    ap.add_argument("--baseline-iterations", type=int, default=300)
    args = ap.parse_args()
    cfg = load_config(
        op="max", n=15, graph="rgg", trials=args.trials, t_max=args.t_max, c=10.0, mu_z=100.0, record="none"
    )

    simulate(cfg.model_copy(update={"trials": 2, "t_max": 10}))  # compile or load the kernel cache
    start = time.perf_counter()
    result = simulate(cfg)
    wall = time.perf_counter() - start
    edges = result.extra["directed_edges"]
    ns = wall / (edges * args.t_max) * 1e9
    loop_ns = result.extra["loop_seconds"] / (edges * args.t_max) * 1e9

    layout = EdgeLayout.from_graphs(cfg.n, sample_graphs(cfg.graph_spec(), cfg.seed, cfg.trials))
    s = result.values.ravel()
    t_base = args.baseline_iterations
    start = time.perf_counter()
    naive_loop(layout, s, 10.0, 100.0, t_base)
    base_ns = (time.perf_counter() - start) / (edges * t_base) * 1e9

    print(
        f"workload: {args.trials} trials x {edges / args.trials:.1f} directed edges x {args.t_max} iterations"
        " (max, RGG n=15)"
    )
    print(
        f"simulate(): {wall:.2f} s wall (setup included), {ns:.2f} ns per trial-edge-iteration"
        "  [target <= 4 ns]"
    )
    print(f"  of which the iteration loop: {loop_ns:.2f} ns per trial-edge-iteration")
    print(f"naive batched numpy loop ({t_base} iterations): {base_ns:.2f} ns per trial-edge-iteration")
    print(f"speed-up over the naive loop: {base_ns / ns:.1f}x")


if __name__ == "__main__":
    main()
