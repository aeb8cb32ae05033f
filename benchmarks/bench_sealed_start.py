"""What the sealed initialization costs: a 15-node run's start, and rounds/s, sealed against plain.

    python benchmarks/bench_sealed_start.py [--n 15] [--repeat 7] [--rounds 400]

Runs ``--op average`` (the group ``auto`` seals) hosted in one process over a private Mosquitto,
alternating ``init_channel = plain`` and ``sealed`` with the same seed (the same numbers, checked):

* start: seconds from launching the nodes until every node has taken the z^(0) of all its
  neighbours and computed x^(0), measured as a one-iteration run (announce, keys, z^(0), one x),
  in wall time and in CPU time of the hosting process (on a machine shared by many processes the
  wall time mostly measures waiting for a core). Target: sealed adds under 50 ms for n = 15.
* rounds/s: a ``--rounds`` iteration run, after the exchange; sealing touches nothing per round.
* crypto CPU: the cryptography alone for the whole network (every node's key pair, one X25519
  exchange and two HKDF derivations per neighbour, one seal and one open per directed edge), the
  part of the start that does not depend on the broker or the machine's load.

Medians of ``--repeat`` alternating runs (the machine may be shared); the differences and ratios
are printed against plain, the baseline measured in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from nlagg_node.config import RunConfig
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.node import Node, run_edges


async def one_run(url: str, cfg: RunConfig, run_id: str) -> tuple[float, float, float, list[float]]:
    """Wall and CPU seconds of the whole run, its rounds/s (after the exchange), every output."""
    edges = run_edges(cfg)
    values = np.linspace(0.0, 1.0, cfg.n)
    async with MqttTransport(url, client_id=f"bench-{run_id}", clean_session=True) as tr:
        nodes = [
            Node(cfg, i, float(values[i]), tr, run_id=run_id, edges=edges, own_transport=False)
            for i in range(cfg.n)
        ]
        started, cpu0 = time.perf_counter(), time.process_time()
        results = await host_nodes(nodes, tr, "nlagg", run_id)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    rps = statistics.median(r.rounds_per_second for r in results)
    return wall, cpu, rps, [v for r in results for v in r.output]


def crypto_seconds(cfg: RunConfig) -> float:
    """CPU seconds of every sealing operation of one run of ``cfg``'s graph, done serially."""
    from nlagg_node.runtime.seal import KeyRing, new_key
    from nlagg_node.runtime.wire import topics

    edges = run_edges(cfg)
    nbrs: list[list[int]] = [[] for _ in range(cfg.n)]
    for a, b in edges.tolist():
        nbrs[a].append(b)
        nbrs[b].append(a)
    t = topics("nlagg", "bench")
    started = time.process_time()
    rings = [KeyRing(i, sorted(nbrs[i]), new_key(), prefix="nlagg", run_id="bench") for i in range(cfg.n)]
    for ring in rings:
        for j in ring.neighbours:
            ring.add(j, rings[j].public)
    for i, ring in enumerate(rings):
        for j in ring.neighbours:
            nonce, ct = ring.seal(j, 0.5, t.z0(i, j), "average")
            rings[j].open(i, nonce, ct, t.z0(i, j), "average")
    return time.process_time() - started


async def main(n: int, repeat: int, rounds: int) -> None:
    start: dict[str, list[float]] = {"plain": [], "sealed": []}
    start_cpu: dict[str, list[float]] = {"plain": [], "sealed": []}
    rate: dict[str, list[float]] = {"plain": [], "sealed": []}
    async with start_mosquitto() as broker:
        for k in range(repeat):
            outs = {}
            for channel in ("plain", "sealed"):
                base = RunConfig(op="average", n=n, trials=1, seed=k, init_channel=channel)  # type: ignore[arg-type]
                wall, cpu, _, outs[channel] = await one_run(
                    broker.url, base.model_copy(update={"t_max": 1}), f"s{k}{channel}"
                )
                start[channel].append(wall)
                start_cpu[channel].append(cpu)
                _, _, rps, _ = await one_run(
                    broker.url, base.model_copy(update={"t_max": rounds}), f"r{k}{channel}"
                )
                rate[channel].append(rps)
            assert outs["plain"] == outs["sealed"], "sealing changed the numbers"
    s_plain, s_sealed = statistics.median(start["plain"]), statistics.median(start["sealed"])
    r_plain, r_sealed = statistics.median(rate["plain"]), statistics.median(rate["sealed"])
    print(f"n = {n}, {repeat} alternating repeats, medians (Mosquitto, one process hosting every node)")
    print(f"start (announce + z0 exchange + x^(0)): plain {s_plain * 1e3:.1f} ms,"
          f" sealed {s_sealed * 1e3:.1f} ms, sealed adds {(s_sealed - s_plain) * 1e3:+.1f} ms"
          f" (ratio {s_sealed / s_plain:.3f})")  # fmt: skip
    c_plain, c_sealed = statistics.median(start_cpu["plain"]), statistics.median(start_cpu["sealed"])
    print(f"start, CPU of the hosting process: plain {c_plain * 1e3:.1f} ms, sealed {c_sealed * 1e3:.1f} ms,"
          f" sealed adds {(c_sealed - c_plain) * 1e3:+.1f} ms")  # fmt: skip
    cpu = statistics.median(
        crypto_seconds(RunConfig(op="average", n=n, trials=1, seed=k)) for k in range(repeat)
    )
    print(f"crypto CPU for the whole network: {cpu * 1e3:.1f} ms ({cpu / n * 1e3:.2f} ms per node)")
    print(f"rounds/s over {rounds} iterations: plain {r_plain:.0f}, sealed {r_sealed:.0f}"
          f" (ratio {r_sealed / r_plain:.3f})")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args()
    asyncio.run(main(args.n, args.repeat, args.rounds))
