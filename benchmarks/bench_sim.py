"""Simulator throughput against a straightforward batched-numpy model, with 1 thread and all threads.

Workload of issues 2, 17 and 34: max consensus, RGG n = 15, 3000 iterations, c = 10,
mu_z = 100. The baseline is the model a numpy user would write: all trials as flat arrays,
the dual sums with ``np.bincount``, fresh arrays every iteration, matching events tracked;
it runs on the same graphs and values, on the fixed schedule.

Default: in-process ns per (trial x directed edge x iteration) of ``simulate()`` (1000
trials, fixed schedule) with 1 numba thread and with all threads, and of the numpy model
(``--baseline-iterations`` iterations, extrapolated), timed in the same process.

``--whole-process``: what a user waits for. Wall time of the whole command
``nlagg sim --op max --n 15 --trials 5000 --t-max 3000 --c 10 --mu-z 100 --json``
(interpreter start, imports, kernel load from the warm cache, setup, loop, output), with
early stopping (the default) and with ``--no-early-stop``, taking turns, with
``NUMBA_NUM_THREADS=1`` and with all threads, against the whole numpy model as its own
process (``python bench_sim.py --numpy-model``), best of ``--repeat`` runs each, with the
load average at each. Targets (issues 17 and 34): the command at least 4x the model, and
early stopping no slower than the fixed schedule. Exit status 1 if either fails with all
threads.

``--digest``: one sha256 over the simulator's outputs in many configurations (every
operator, early and fixed, departures...): a change to the simulator must leave it as it is.
``--digest --stop-rule tolerance`` runs every case on the tolerance rule (max and min stop on the
certified stop by default since 2026-11-27): the digest from before the certified stop.

Run: python benchmarks/bench_sim.py [--whole-process | --digest [--stop-rule R]] [--trials N] [--t-max 3000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nlagg_node.sim import SimResult

ROOT = Path(__file__).resolve().parents[1]
C, MU_Z = 10.0, 100.0


def _config(trials: int, t_max: int):  # type: ignore[no-untyped-def]
    from nlagg_node import load_config

    return load_config(
        op="max",
        n=15,
        graph="rgg",
        trials=trials,
        t_max=t_max,
        c=C,
        mu_z=MU_Z,
        record="none",
        early_stop=False,
    )


def numpy_model(trials: int, t_max: int, seed: int = 0) -> tuple[float, float]:
    """The straightforward batched model; returns (seconds of the loop, directed edges)."""
    from nlagg_node.graphs import EdgeLayout, sample_graphs
    from nlagg_node.sim import draw_values

    cfg = _config(trials, t_max)
    layout = EdgeLayout.from_graphs(cfg.n, sample_graphs(cfg.graph_spec(), cfg.seed, trials))
    s = draw_values("normal", seed, trials, cfg.n).ravel()
    E, N = len(layout.src), layout.n_nodes
    rev = (np.arange(E) + E // 2) % E
    rng = np.random.default_rng(seed)
    z = -layout.sign * MU_Z + rng.standard_normal(E)
    cd = C * layout.degree
    matched = np.zeros(N, dtype=bool)
    start = time.perf_counter()
    for _ in range(t_max):
        v = np.bincount(layout.src, weights=layout.sign * z, minlength=N)
        x = np.maximum((-1.0 - v) / cd, s)
        matched |= x == s
        z = 0.5 * z + 0.5 * (z[rev] + 2 * C * layout.sign[rev] * x[layout.dst])
    return time.perf_counter() - start, float(E)


def in_process(trials: int, t_max: int, baseline_iterations: int) -> None:
    import numba

    from nlagg_node import simulate
    from nlagg_node.sim.engine import _PARALLEL_TRIALS

    cfg = _config(trials, t_max)
    # Compile or load both kernels: the serial one (few trials) and the parallel one.
    simulate(cfg.model_copy(update={"trials": 2, "t_max": 10}))
    simulate(cfg.model_copy(update={"trials": 2 * _PARALLEL_TRIALS, "t_max": 10}))
    all_threads = numba.get_num_threads()
    load = os.getloadavg()[0]
    print(
        f"workload: {trials} trials x {t_max} iterations (max, RGG n=15, c=10, mu_z=100),"
        f" {all_threads} cores, load average {load:.1f}"
    )
    for threads in sorted({1, all_threads}):
        numba.set_num_threads(threads)
        start = time.perf_counter()
        result = simulate(cfg)
        wall = time.perf_counter() - start
        edges = result.extra["directed_edges"]
        ns = wall / (edges * t_max) * 1e9
        loop_ns = result.extra["loop_seconds"] / (edges * t_max) * 1e9
        print(
            f"simulate(), {threads} thread(s): {wall:.2f} s, {ns:.2f} ns per trial-edge-iteration "
            f"(loop alone {loop_ns:.2f} ns)"
        )
    numba.set_num_threads(all_threads)
    loop_s, edges = numpy_model(trials, baseline_iterations)
    base_ns = loop_s / (edges * baseline_iterations) * 1e9
    print(f"numpy model ({baseline_iterations} iterations): {base_ns:.2f} ns per trial-edge-iteration")


def _walls(cmds: list[list[str]], env: dict[str, str], repeat: int) -> list[tuple[float, float, float]]:
    """Best wall time, best CPU time (user + system, all threads) and the 1-minute load average
    at the best run, per command; the commands take turns, ``repeat`` rounds."""
    best = [(float("inf"), float("inf"), 0.0) for _ in cmds]
    for _ in range(repeat):
        for k, cmd in enumerate(cmds):
            load = os.getloadavg()[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            if wall < best[k][0]:
                best[k] = (wall, min(cpu, best[k][1]), load)
            else:
                best[k] = (best[k][0], min(cpu, best[k][1]), best[k][2])
    return best


def _sim_args(trials: int, t_max: int) -> list[str]:
    """The ``nlagg sim`` arguments of the workload (early stopping, the default)."""
    run = f"--op max --n 15 --trials {trials} --t-max {t_max} --c 10 --mu-z 100 --json"
    return ["sim", *run.split()]


def whole_process(trials: int, t_max: int, repeat: int) -> int:
    """``nlagg sim`` with early stopping and with ``--no-early-stop`` against the numpy model, each
    its own process. Exit status 1 unless early stopping is no slower than the fixed schedule and
    the command is at least 4x the model, with all threads."""
    from nlagg_node.sweep import available_cores

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("NUMBA_NUM_THREADS", None)
    cli = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]
    args = _sim_args(trials, t_max)
    for warm in ("2", "16"):  # the serial and the parallel kernel in the cache
        for schedule in ("--early-stop", "--no-early-stop"):
            warm_args = [*cli, "sim", "--trials", warm, "--t-max", "10", schedule, "--json"]
            subprocess.run(warm_args, env=env, check=True, stdout=subprocess.DEVNULL)
    model = [sys.executable, str(Path(__file__).resolve()), "--numpy-model", "--trials", str(trials)]
    model += ["--t-max", str(t_max)]
    ((base, base_cpu, base_load),) = _walls([model], env, repeat)
    cores = available_cores()
    print(f"whole process, best of {repeat}, {cores} cores:")
    print(f"  nlagg {' '.join(args)} [--no-early-stop]")
    print(
        f"  numpy model (bincount over flat arrays, fixed schedule), its own process: {base:.2f} s wall,"
        f" {base_cpu:.2f} s CPU (load average {base_load:.1f})"
    )
    ok = True
    for threads in sorted({1, cores}):
        t_env = {**env, "NUMBA_NUM_THREADS": str(threads)}
        (early, early_cpu, early_load), (fixed, fixed_cpu, fixed_load) = _walls(
            [[*cli, *args], [*cli, *args, "--no-early-stop"]], t_env, repeat
        )
        print(
            f"  nlagg sim, {threads} thread(s), early stop: {early:.2f} s wall = {base / early:.1f}x the"
            f" numpy model [target >= 4x]; {early_cpu:.2f} s CPU (load average {early_load:.1f})"
        )
        print(
            f"  nlagg sim, {threads} thread(s), --no-early-stop: {fixed:.2f} s wall = {base / fixed:.1f}x;"
            f" {fixed_cpu:.2f} s CPU (load average {fixed_load:.1f})"
        )
        print(
            f"  early stop / fixed schedule, {threads} thread(s): wall {early / fixed:.2f},"
            f" CPU {early_cpu / fixed_cpu:.2f} [target <= 1]"
        )
        ok = early <= fixed and base / early >= 4
    # What does not scale with t_max: interpreter, imports, kernel load, graphs and z^(0), output.
    at = args.index("--t-max") + 1
    fixed_args = [*args[:at], "1", *args[at + 1 :]]
    ((setup, setup_cpu, setup_load),) = _walls(
        [[*cli, *fixed_args]], {**env, "NUMBA_NUM_THREADS": "1"}, repeat
    )
    print(
        f"  of which start-up and setup (the same command with --t-max 1, 1 thread): "
        f"{setup:.2f} s wall, {setup_cpu:.2f} s CPU (load average {setup_load:.1f})"
    )
    return 0 if ok else 1


# The bit-equality check of any change to the simulator: one digest over every operator, early
# stopping and the fixed schedule, serial (< 8 trials) and parallel kernels, a shared graph, a
# progress bar's chunks, early stop on a graph that may lose nodes, and departures (with early
# stopping and may_depart, and on the fixed schedule) that split the graph.
_OPS = ("max", "min", "topk", "median", "quantile", "trimmed-mean", "average")
_ARTICULATION = [
    (0, 1),
    (1, 2),
    (2, 3),
    (0, 2),
    (1, 3),
    (3, 4),
    (4, 5),
    (5, 6),
    (6, 7),
    (5, 7),
    (7, 8),
    (6, 8),
]


def _digest_cases(folder: Path) -> list[tuple[str, dict[str, object], dict[int, int] | None, bool]]:
    """(name, run options, departures, with a progress callback) of every case :func:`digest` hashes."""
    graph = folder / "articulation.csv"
    graph.write_text("".join(f"{i},{j}\n" for i, j in _ARTICULATION))
    split: dict[str, object] = {"n": 9, "graph": "file", "graph_file": graph, "trials": 3, "may_depart": True}
    cases: list[tuple[str, dict[str, object], dict[int, int] | None, bool]] = []
    for op in _OPS:
        for early in (True, False):
            opts: dict[str, object] = {"op": op, "n": 10, "trials": 12, "t_max": 2500, "early_stop": early}
            cases.append((f"{op}-{'early' if early else 'fixed'}", opts, None, False))
    cases += [
        ("max-serial", {"op": "max", "n": 12, "trials": 3, "t_max": 3000}, None, False),
        ("median-ring", {"op": "median", "graph": "ring", "n": 9, "trials": 9, "t_max": 3000}, None, False),
        ("max-progress", {"op": "max", "n": 10, "trials": 12, "t_max": 2500}, None, True),
        (
            "max-may-depart",
            {"op": "max", "n": 10, "trials": 12, "t_max": 2500, "may_depart": True},
            None,
            False,
        ),
        ("max-split-early", {"op": "max", **split}, {4: 300}, False),
        ("median-split-early", {"op": "median", **split}, {4: 300}, True),
        ("max-split-fixed", {"op": "max", **split, "early_stop": False, "t_max": 1500}, {4: 300}, False),
        (
            "max-rgg-departs",
            {"op": "max", "n": 10, "trials": 12, "may_depart": True},
            {2: 200, 7: 900},
            False,
        ),
    ]
    return cases


def _result_digest(result: SimResult) -> bytes:
    """sha256 of every output array of ``result`` (not its timings)."""
    h = hashlib.sha256()
    arrays = [result.values, result.used_values, result.rank, result.output, result.truth_lo]
    arrays += [result.truth_hi, result.mse, result.matched, result.first_match, result.exposed]
    arrays += [result.first_exposed, result.converged_iterations, result.phase_iterations]
    arrays += [result.node_iterations, result.recorded_t, result.recorded_x, *result.graphs]
    arrays += [result.z0[g] for g in sorted(result.z0)]
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(repr((result.departed, result.components, result.departed_in)).encode())
    return h.digest()


def digest(stop_rule: str | None = None) -> str:
    """sha256 over the outputs of every case of :func:`_digest_cases` (prints one line per case),
    each on ``stop_rule`` (None: its operator's own)."""
    from nlagg_node import load_config, simulate

    whole = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        for name, opts, departures, watched in _digest_cases(Path(tmp)):
            cfg = load_config(seed=3, record="all", stop_rule=stop_rule, **opts)
            result = simulate(
                cfg, progress=(lambda done, total: None) if watched else None, departures=departures
            )
            one = _result_digest(result)
            print(f"  {name}: {one.hex()[:16]} (iterations {result.phase_iterations.mean():.0f})")
            whole.update(one)
    return whole.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, help="default: 1000, 5000 with --whole-process")
    ap.add_argument("--t-max", type=int, default=3000)
    ap.add_argument("--baseline-iterations", type=int, default=300)
    ap.add_argument("--whole-process", action="store_true", help="time whole commands side by side")
    ap.add_argument("--repeat", type=int, default=2, help="whole-process runs per side; the best counts")
    ap.add_argument("--numpy-model", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--digest", action="store_true", help="print the simulator's output digest")
    ap.add_argument("--stop-rule", choices=("certificate", "tolerance"), default=None, help="--digest's")
    args = ap.parse_args()
    if args.digest:
        print(f"simulator output digest: {digest(args.stop_rule)}")
        return 0
    trials = args.trials or (5000 if args.whole_process else 1000)
    if args.numpy_model:
        numpy_model(trials, args.t_max)
        return 0
    if args.whole_process:
        return whole_process(trials, args.t_max, args.repeat)
    in_process(trials, args.t_max, args.baseline_iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
