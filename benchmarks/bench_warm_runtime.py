"""Warm against cold starts in the node runtime, beside the simulator on the same values.

    python benchmarks/bench_warm_runtime.py [--op max] [--n 15] [--epochs 3] [--period 50]

Every node of a continuous deployment runs as an asyncio task over the in-memory transport
(:func:`nlagg_node.runtime.epochdriver.run_epochs`, a fixed seed), warm (``--drift 0.005``) and then
cold (``--cold-start``), on the simulator's random walk of ``n`` values in [0, 1]
(:func:`nlagg_node.epochplan.walk_values`, seed 0); :func:`nlagg_node.sim.multiepoch.simulate_epochs`
runs the same values. One JSON line: per start, the iterations of each epoch (the most any node
ran), each epoch's start and the largest error; the simulator's iterations beside them. Both
follow one epoch planner (:mod:`nlagg_node.epochplan`: the epoch's seed, the shell draws): the
nodes here draw from seed 7 and the simulator from seed 0, so they agree to a few iterations; with
the run's seed at the nodes (``seed="config"``) they agree draw for draw.
``--period`` must exceed an epoch's run time (an epoch that overruns skips the next start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import numpy as np

from nlagg_node.config import RunConfig
from nlagg_node.epochplan import walk_values
from nlagg_node.runtime.epochdriver import EpochClock, EpochOutcome, run_epochs
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import node_will, run_edges
from nlagg_node.sim.multiepoch import simulate_epochs
from nlagg_node.valuemap import scale_for

DRIFT = 0.005


async def deploy(
    cfg: RunConfig, vals: np.ndarray, drift: float | None, period: float
) -> list[list[EpochOutcome]]:
    edges, broker, scale = run_edges(cfg), MemoryBroker(), scale_for(cfg)
    clock = EpochClock(time.time() + 1.0, period, len(vals), 5.0)

    async def node(i: int) -> list[EpochOutcome]:
        async def value_for(k: int) -> float:
            return scale.protocol_float(float(vals[k, 0, i]))

        async def transport_for(k: int, run: str) -> MemoryTransport:
            return MemoryTransport(broker, f"n{i}", will=node_will("p/r", run, i))

        outcomes = run_epochs(
            cfg,
            i,
            value_for,
            transport_for,
            clock,
            deployment=("p", "r"),
            to_user=scale.user_float,
            drift=drift,
            edges=edges,
            seed=7,
        )
        return [o async for o in outcomes]

    return list(await asyncio.gather(*(node(i) for i in range(cfg.n))))


def figures(runs: list[list[EpochOutcome]], truth: list[float], epochs: int) -> dict[str, Any]:
    done = [(o.epoch, o.output) for r in runs for o in r if o.output is not None]
    errors = [abs(float(np.ravel(out.output)[0]) - truth[k]) for k, out in done]
    return {
        "iterations": [max(out.iterations for e, out in done if e == k) for k in range(epochs)],
        "start": [runs[0][k].start for k in range(epochs)],
        "max_error": max(errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="max", choices=["max", "min", "median"])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--period", type=float, default=50.0)
    args = ap.parse_args()
    cfg = RunConfig(
        op=args.op, n=args.n, value_range=(0.0, 1.0), seed=0, may_depart=True, trials=1
    ).resolved()
    vals = walk_values(cfg, args.epochs, DRIFT)
    pick = {"max": np.max, "min": np.min, "median": np.median}[args.op]
    truth = [float(pick(vals[k, 0])) for k in range(args.epochs)]
    out: dict[str, Any] = {"op": args.op, "n": args.n, "drift": DRIFT}
    for name, drift in (("runtime_warm", DRIFT), ("runtime_cold", None)):
        out[name] = figures(asyncio.run(deploy(cfg, vals, drift, args.period)), truth, args.epochs)
    for name, warm in (("sim_warm", True), ("sim_cold", False)):
        res = simulate_epochs(cfg, args.epochs, DRIFT, warm=warm, values=vals)
        out[name] = {"iterations": res.iterations[:, 0].tolist(), "fell_back": res.fell_back[:, 0].tolist()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
