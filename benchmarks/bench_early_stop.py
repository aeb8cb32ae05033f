"""Wall time of ``nlagg testbed`` with early stopping against the fixed schedule, in one run.

    python benchmarks/bench_early_stop.py [--n 15] [--ops max,median,topk] [--seeds 0] [--sim-seeds 200]
                                          [--tolerance 1e-9] [--depart 4@300 --neighbour-timeout 4]

For each operator: ``nlagg testbed --n N --op OP --json`` at its defaults (early stopping on) and
with ``--no-early-stop``, back to back (the machine is shared: compare the ratio, not the seconds),
then the simulator's stop iteration for the same configuration. Prints one JSON line per
operator and seed: both walls, their ratio (target <= 0.4), the CPU seconds of each (the testbed process
and all it started), the load average before and after, exactness, whether the testbed ran
the simulator's number of iterations, and ``ratio_floor``: the iterations the trial needs before
every x stays within tolerance over the fixed schedule's, the ratio no stopping rule can beat.

A testbed runs one trial (trial 0 of its seed), so its ratio depends on the seed. ``--seeds 0,1,2``
measures several; ``--sim-seeds S`` (simulator only, seconds) adds a line per operator with the
distribution over seeds ``0 .. S-1`` of the iterations run (stop / fixed schedule) and of the floor.
``--tolerance`` runs everything at another precision (``nlagg testbed --tolerance``; the default,
1e-9 of the range, is the acceptance's): what a user who needs less precision gets.
``--depart SPEC`` kills those node processes at those iterations in both testbeds (the early one
then runs with ``--may-depart``, as ``--depart`` does) and gives the simulator the same departures:
early stopping where nodes leave for good, against the fixed schedule with the same departures. A
killed node is declared departed after 3/4 of ``--neighbour-timeout`` (the testbed's default is 60 s),
which both runs wait once.
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
from nlagg_node.departure import parse_departures
from nlagg_node.sim import simulate


def _children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _testbed(
    n: int, op: str, seed: int, early: bool, tolerance: float, depart: str, timeout: float | None
) -> tuple[float, float, dict[str, object]]:
    """Wall and CPU seconds (the testbed and every process it started, broker included) and the summary."""
    flags = [] if early else ["--no-early-stop"]  # early stopping is the default
    flags += ["--tolerance", repr(tolerance)]
    flags += ["--depart", depart] if depart else []
    flags += ["--neighbour-timeout", repr(timeout)] if timeout is not None else []
    cmd = [sys.executable, "-m", "nlagg_node", "testbed", "--n", str(n), "--op", op, "--seed", str(seed)]
    started, cpu = time.perf_counter(), _children_cpu()
    out = subprocess.run([*cmd, *flags, "--json"], check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - started
    return wall, _children_cpu() - cpu, json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--ops", default="max,median,topk")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, one testbed pair each (empty: none)")
    ap.add_argument("--sim-seeds", type=int, default=200, help="seeds in the simulator's summary (0: none)")
    ap.add_argument("--tolerance", type=float, default=1e-9, help="precision, a fraction of the range")
    ap.add_argument("--depart", default="", help="node@iteration,...: nodes killed for good in both runs")
    ap.add_argument("--neighbour-timeout", type=float, default=None, help="the testbeds' (seconds)")
    args = ap.parse_args()
    departures = parse_departures(args.depart)
    for op in args.ops.split(","):
        if args.sim_seeds > 0:
            _sim_summary(op, args.n, args.sim_seeds, args.tolerance, departures)
        for seed in (int(s) for s in args.seeds.split(",") if s):
            _pair(op, args.n, seed, args.tolerance, args.depart, args.neighbour_timeout)


def _sim_trial(
    op: str, n: int, seed: int, tolerance: float, departures: dict[int, int] | None = None
) -> tuple[int, int, float | None]:
    """The simulator's stop iteration, the fixed schedule's length and the floor (None: not converged).

    No stopping rule ends an exact run before every x stays within tolerance (the first such
    iteration, summed over the phases): with no start-up cost and no detection delay at all, the
    ratio would still be this floor.
    """
    cfg = load_config(
        op=op, n=n, seed=seed, trials=1, record="none", tolerance=tolerance, may_depart=bool(departures)
    )
    sim = simulate(cfg, departures=departures)
    converged = int(sim.converged_iterations[0])
    return (
        int(sim.phase_iterations[0].sum()),
        sim.t_total,
        converged / sim.t_total if converged >= 0 else None,
    )


def _sim_summary(op: str, n: int, seeds: int, tolerance: float, departures: dict[int, int]) -> None:
    trials = [_sim_trial(op, n, seed, tolerance, departures) for seed in range(seeds)]
    ran = sorted(stop / total for stop, total, _ in trials)
    floors = sorted(f for _, _, f in trials if f is not None)

    def pct(xs: list[float], q: float) -> float | None:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None

    print(
        json.dumps(
            {
                "op": op,
                "n": n,
                "sim_seeds": seeds,
                "tolerance": tolerance,
                "departures": departures,
                "iterations_ratio": {"p10": pct(ran, 0.1), "median": pct(ran, 0.5), "p90": pct(ran, 0.9)},
                "ratio_floor": {"p10": pct(floors, 0.1), "median": pct(floors, 0.5), "p90": pct(floors, 0.9)},
                "not_converged": len(trials) - len(floors),
            }
        ),
        flush=True,
    )


def _pair(op: str, n: int, seed: int, tolerance: float, depart: str, timeout: float | None) -> None:
    load = os.getloadavg()[0]
    wall_early, cpu_early, early = _testbed(n, op, seed, True, tolerance, depart, timeout)
    wall_fixed, cpu_fixed, fixed = _testbed(n, op, seed, False, tolerance, depart, timeout)
    sim_iterations, _, floor = _sim_trial(op, n, seed, tolerance, parse_departures(depart))
    print(
        json.dumps(
            {
                "op": op,
                "n": n,
                "seed": seed,
                "tolerance": tolerance,
                "departed": early.get("departed"),
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
                "ratio_floor": None if floor is None else round(floor, 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
