"""Warm starts against cold starts and against a naive warm start, over epochs of drifting values.

    python benchmarks/bench_epochs.py [--trials 200] [--epochs 20] [--drift 0.005] [--seed 0]
                                      [--stop-rule certificate|tolerance]
    python benchmarks/bench_epochs.py --table [--drifts 0.001,0.005,0.01,0.05,0.1]
    python benchmarks/bench_epochs.py --jump 0.2 [--epochs 6]
    python benchmarks/bench_epochs.py --tail

Workload of issue 35: n = 15, RGG, values uniform in the declared range [0, 1], a bounded random
walk with steps uniform in [-D, D] (``nlagg sim --epochs K --drift D``), the defaults of each
operator. Three starts of epochs 1..K-1, in the same process on the same values and graphs:

* ``warm``: :func:`nlagg_node.warm.warm_start` (the default of ``nlagg sim --epochs``);
* ``naive``: the floor to beat: the median's prior at the last output with the run's c, max's
  one-sided start 0.02 of the range beyond the last output; no band, no shells, no fallback;
* ``cold``: every epoch as a single run (``--cold-start``).

Default: the acceptance figures, one JSON line per (operator, start): the median's neighbours'
(ranks 6 and 8) leakage in the first epoch and the largest and mean over the later ones (target
<= 0.05 per epoch), rank 1's for max, the median iterations of the first epoch and of the later
ones and their ratio (target for max <= 0.25; for the median reported), the cumulative exposure
beyond the ideal world (largest over ranks), the share of exact epochs and the share of epochs in
which a value other than the aggregate entered a certified stop's candidate (``stray_candidates``).
Max runs its own stop rule, the certified stop, unless ``--stop-rule tolerance`` asks for the
tolerance rule it had before.

``--table``: a markdown table over drifts (warm and cold, max and median), for docs/epochs.md.

``--tail``: why max's warm epochs could not reach 1/4 of the first's iterations on the tolerance
rule (``--stop-rule tolerance``), which the certified stop answers. Once the descent from
the start has met the maximum (from a warm start at once), the maximizer's x is pinned at
``s_max`` (eq. (xi_up)'s max operator selects it) and every other x follows the linear branch: one
PDMM iteration is an affine map of the signed duals whose linear part depends neither on ``c`` (it
scales out of the linear branch) nor on the start. Its spectral radius ``rho`` over the modes
visible in x sets the tail: ``-1 / log10(rho)`` iterations per decade of precision. The map is
linearized here from the protocol's own functions (:func:`nlagg_node.pdmm.x_update`,
:func:`~nlagg_node.pdmm.z_update`), on every trial's graph with its first epoch's maximizer pinned,
for the run's theta and for the best theta of a grid, and with per-edge step parameters
(:data:`EDGE_WEIGHTS`) at their best theta. One JSON line: the median iterations per decade, the
decades from the warm start's margin to the tolerance, the tail's predicted iterations plus the
stop rule's overhead (:mod:`nlagg_node.termination`: ``2 W + 2 diam``) and that over the cold first
epoch's iterations, beside the measured ones, and the iterations per decade a ratio of 1/4 needs.

``--jump J``: values beyond the declared drift. From epoch 3 on every value moves up by J of the
range (reflected at the top); one JSON line per (operator, start) with the jump epoch's leakage of
the watched ranks, the share of trials exposing a node beyond the ideal world in it, the share that
fell back, its median iterations, and the next epoch's leakage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from nlagg_node.config import RunConfig, load_config
from nlagg_node.epochplan import walk_values
from nlagg_node.graphs import EdgeLayout, sample_graphs
from nlagg_node.init import DualInitSpec
from nlagg_node.pdmm import Objective, dual_sum, x_update, z_update
from nlagg_node.sim.multiepoch import EpochsResult, simulate_epochs
from nlagg_node.termination import diameter
from nlagg_node.warm import WarmStart, warm_margin

NAIVE_MAX_MARGIN = 0.02
"""The naive max start: this fraction of the range beyond the last output."""


def naive_start(
    op: str,
    last_output: float,
    *,
    drift: float,
    c: float,
    sigma_z: float,
    value_range: tuple[float, float] | None = None,
) -> WarmStart:
    """The floor: the prior at the last output (median) or a start 0.02 beyond it (max), the
    run's c, every value run as is (an unbounded band: never a shell, never a fallback)."""
    lo, hi = value_range if value_range is not None else (0.0, 1.0)
    y = (last_output - lo) / (hi - lo)
    if op == "median":
        spec = DualInitSpec(kind="prior", sigma_z=sigma_z, c=c, prior_median=y)
        return WarmStart("prior", spec, c, y, drift, -math.inf, math.inf, 0.0)
    spec = DualInitSpec(kind="from-above", mu_z=c * NAIVE_MAX_MARGIN, sigma_z=sigma_z, c=c, center=y)
    return WarmStart("from-above", spec, c, y, drift, -math.inf, math.inf, 0.0)


def _config(op: str, trials: int, seed: int, stop_rule: str | None = None) -> RunConfig:
    return load_config(
        op=op, n=15, trials=trials, value_range=(0.0, 1.0), record="none", seed=seed, stop_rule=stop_rule
    )


def _run(op: str, start: str, args: argparse.Namespace, drift: float) -> EpochsResult:
    cfg = _config(op, args.trials, args.seed, args.stop_rule if op == "max" else None)
    if start == "naive":
        return simulate_epochs(cfg, args.epochs, drift, starter=naive_start)
    return simulate_epochs(cfg, args.epochs, drift, warm=start == "warm")


def _figures(op: str, start: str, res: EpochsResult) -> dict[str, Any]:
    leak = res.leakage_by_epoch()
    its = res.iterations_by_epoch()
    watched = [6, 8] if op == "median" else [1]
    later = leak[1:, watched]
    return {
        "op": op,
        "start": start,
        "drift": res.drift,
        "watched_ranks": watched,
        "leak_first": [round(float(v), 4) for v in leak[0, watched]],
        "leak_later_max": round(float(later.max()), 4),
        "leak_later_mean": round(float(later.mean()), 4),
        "iterations_first": float(its[0]),
        "iterations_later": float(np.median(its[1:])),
        "ratio": round(float(np.median(its[1:]) / its[0]), 3),
        "cumulative_beyond_ideal_max": round(float(res.cumulative_beyond_ideal().max()), 4),
        "exact": round(float(res.exact.mean()), 4),
        "fallback": round(float(res.fell_back.mean()), 4),
        "stray_candidates": round(float(res.stray.mean()), 4),
        "seconds": round(res.wall_seconds, 1),
    }


def acceptance(args: argparse.Namespace) -> None:
    for op in ("max", "median"):
        for start in ("warm", "naive", "cold"):
            print(json.dumps(_figures(op, start, _run(op, start, args, args.drift))), flush=True)


JUMP_EPOCH = 3


def jump(args: argparse.Namespace) -> None:
    for op, ranks in (("max", [1, 2]), ("median", [6, 8])):
        cfg = _config(op, args.trials, args.seed)
        vals = walk_values(cfg, args.epochs, args.drift)
        moved = vals[JUMP_EPOCH:] + args.jump
        vals[JUMP_EPOCH:] = np.where(moved > 1.0, 2.0 - moved, moved)
        for start, kw in (("warm", {}), ("naive", {"starter": naive_start}), ("cold", {"warm": False})):
            res = simulate_epochs(cfg, args.epochs, args.drift, values=vals, **kw)
            leak = res.leakage_by_epoch()
            k = JUMP_EPOCH
            beyond = (res.exposed[k] & ~res.ideal[k]).any(axis=1).mean()
            line = {
                "op": op,
                "start": start,
                "jump": args.jump,
                "ranks": ranks,
                "leak_jump_epoch": [round(float(leak[k, r]), 3) for r in ranks],
                "beyond_ideal_jump_epoch": round(float(beyond), 3),
                "fallback": round(float(res.fell_back[k].mean()), 3),
                "iterations": float(np.median(res.iterations[k])),
                "leak_next_epoch": [round(float(leak[k + 1, r]), 3) for r in ranks],
                "exact": round(float(res.exact[k].mean()), 3),
            }
            print(json.dumps(line), flush=True)


def _ranks(values: np.ndarray[Any, Any], ranks: list[int]) -> str:
    return " / ".join(f"{values[r]:.3f}" for r in ranks)


def table(args: argparse.Namespace) -> None:
    drifts = [float(d) for d in args.drifts.split(",")]
    print(
        "| op | drift | start | leakage per epoch (ranks) | cumulative (same ranks) | worst cumulative"
        " beyond ideal | iterations first / later | exact |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for op, ranks in (("max", [1, 2]), ("median", [6, 8])):
        for d in drifts:
            for start in ("warm", "cold"):
                res = _run(op, start, args, d)
                its = res.iterations_by_epoch()
                print(
                    f"| {op} | {d:g} | {start} | {_ranks(res.leakage_probability(), ranks)}"
                    f" | {_ranks(res.cumulative_leakage_probability(), ranks)}"
                    f" | {res.cumulative_beyond_ideal().max():.3f}"
                    f" | {its[0]:.0f} / {np.median(its[1:]):.0f} | {res.exact.mean():.3f} |",
                    flush=True,
                )


THETAS = tuple(round(0.1 * k, 1) for k in range(1, 10))


EdgeWeight = Callable[[np.ndarray[Any, Any], np.ndarray[Any, Any]], np.ndarray[Any, Any]]
EDGE_WEIGHTS: dict[str, EdgeWeight] = {
    "uniform": lambda di, dj: np.ones_like(di),
    "1/sqrt(di dj)": lambda di, dj: 1.0 / np.sqrt(di * dj),
    "sqrt(di dj)": lambda di, dj: np.sqrt(di * dj),
    "1/di + 1/dj": lambda di, dj: 1.0 / di + 1.0 / dj,
}
"""Per-edge step parameters ``c_ij = c w(d_i, d_j)`` (PDMM allows any symmetric ones; the paper and
the protocol use ``uniform``), tried to see whether any conditions the tail better."""


def tail_radius(
    n: int,
    edges: np.ndarray[Any, Any],
    pinned: int,
    theta: float,
    weight: EdgeWeight = EDGE_WEIGHTS["uniform"],
) -> float:
    """Spectral radius of a max run's tail map on one graph, over the modes x sees.

    One iteration with node ``pinned`` at its value and every other x on the linear branch is
    ``u -> M u + b``; ``M``'s columns are the iteration of each unit dual less the iteration of
    zero, computed with the protocol's own x- and z-update (c = 1: c scales out of ``M``; with
    ``weight`` each edge's c is ``weight(d_i, d_j)`` and ``c d_i`` their sum at node i).
    """
    lay = EdgeLayout.from_graphs(n, [edges])
    rev = (np.arange(len(lay.src)) + lay.n_pairs) % len(lay.src)
    s = np.full(n, -np.inf)
    s[pinned] = 0.0  # x = max(linear branch, s): pinned for duals near 0, the rest never
    c_edge = weight(lay.degree[lay.src], lay.degree[lay.dst])
    cd = dual_sum(c_edge, lay.src, n)

    def step(u: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        x = x_update(Objective.maximum(), dual_sum(u, lay.src, n), s, cd)
        return np.asarray(z_update(u, u[rev], x[lay.dst], c_edge, theta))

    eye = np.eye(len(lay.src)) * 1e-6  # small enough that the pinned node stays pinned
    base = step(np.zeros(len(lay.src)))
    m = np.stack([step(col) - base for col in eye], axis=1) / 1e-6
    w, vecs = np.linalg.eig(m)
    seen = np.zeros(len(w), dtype=bool)
    for k in range(len(w)):  # a mode x sees moves some unpinned node's dual sum
        v = dual_sum(np.real(vecs[:, k]), lay.src, n), dual_sum(np.imag(vecs[:, k]), lay.src, n)
        v[0][pinned] = v[1][pinned] = 0.0
        seen[k] = max(np.abs(v[0]).max(), np.abs(v[1]).max()) > 1e-9
    return float(np.abs(w[seen]).max())


def _per_decade(rho: float) -> float:
    """Iterations per decade of precision of a tail with spectral radius ``rho``."""
    return -1.0 / math.log10(rho)


def tail(args: argparse.Namespace) -> None:
    cfg = _config("max", args.trials, args.seed, "tolerance").resolved()
    vals = walk_values(cfg, 1, args.drift)[0]
    graphs = sample_graphs(cfg.graph_spec(), cfg.seed, cfg.trials)
    per_decade, overhead = [], []
    by_weight: dict[str, list[float]] = {w: [] for w in EDGE_WEIGHTS}  # at each weighting's best theta
    for b, edges in enumerate(graphs):
        pinned = int(np.argmax(vals[b]))
        for w, weight in EDGE_WEIGHTS.items():
            rhos = {th: tail_radius(cfg.n, edges, pinned, th, weight) for th in THETAS}
            by_weight[w].append(_per_decade(min(rhos.values())))
            if w == "uniform":
                per_decade.append(_per_decade(rhos[cfg.theta]))
        overhead.append(2 * cfg.stop_window_value + 2 * diameter(cfg.n, edges))
    margin = warm_margin(args.drift, cfg.c_value, cfg.sigma_z_value)
    decades = math.log10(margin / cfg.tolerance)
    stop = float(np.median(overhead))
    predicted = float(np.median(decades * np.asarray(per_decade) + np.asarray(overhead)))
    its = simulate_epochs(cfg, args.epochs, args.drift).iterations
    first, later = float(np.median(its[0])), float(np.median(its[1:]))
    line = {
        "theta": cfg.theta,
        "iterations_per_decade": round(float(np.median(per_decade)), 1),
        "best_theta_iterations_per_decade": round(float(np.median(by_weight["uniform"])), 1),
        "best_theta_by_edge_weights": {w: round(float(np.median(v)), 1) for w, v in by_weight.items()},
        "decades": round(decades, 2),
        "stop_overhead": stop,
        "predicted_warm": round(predicted, 0),
        "measured_warm": later,
        "first": first,
        "ratio_predicted": round(predicted / first, 3),
        "ratio": round(later / first, 3),
        "per_decade_for_quarter": round((first / 4 - stop) / decades, 1),
    }
    print(json.dumps(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--drift", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--stop-rule",
        choices=("certificate", "tolerance"),
        default=None,
        help="max's stop rule [default: its own]",
    )
    ap.add_argument("--table", action="store_true", help="the drift table of docs/epochs.md")
    ap.add_argument("--drifts", default="0.001,0.005,0.01,0.05,0.1")
    ap.add_argument("--jump", type=float, default=None, help="values jump up by this share of the range")
    ap.add_argument("--tail", action="store_true", help="max's warm iterations against its tail's rate")
    args = ap.parse_args()
    started = time.perf_counter()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}", flush=True
    )
    if args.tail:
        tail(args)
    elif args.jump is not None:
        jump(args)
    elif args.table:
        table(args)
    else:
        acceptance(args)
    print(f"# {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
