"""CPU cost of signed messages (identities), measured in CPU time so that a loaded machine still tells.

    python benchmarks/bench_auth.py [--n 15] [--rounds 400] [--repeat 3]

* the primitives: one Ed25519 signature of a message, one verification (``Verifier.check``: split,
  base64, verify), and what an x costs instead, the check of its key-chain element
  (:mod:`nlagg_node.protocol.chain`: base64 and one hash), in microseconds of CPU;
* a network of n nodes (the run's RGG, max, fixed schedule) on the in-memory broker, each node with its
  own router (as one process per node: every receiver verifies what it reads), without and with
  identities: CPU per round, and the extra per node and round. The in-memory broker costs nothing on
  the wire, so this is the protocol's own work; what a round of the networked testbed costs in all is
  in ``bench_testbed.py`` (``--auth``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from nlagg_node.config import RunConfig
from nlagg_node.protocol import Verifier, new_identity
from nlagg_node.protocol.chain import ChainCheck, KeyChain, key_b64
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, run_edges
from nlagg_node.runtime.wire import encode_x, topics


def primitives(count: int = 3000) -> tuple[float, float, float]:
    """Microseconds of CPU per signature, per verification, and per key-chain check of an x."""
    identity = new_identity()
    topic = topics("nlagg", "bench").x(3)
    body = encode_x(node=3, t=1210, phase="max", x=0.8123456789, quiet=0, stop=1497)
    start = time.process_time()
    for _ in range(count):
        signed = identity.sign(topic, body)
    signing = (time.process_time() - start) / count * 1e6
    check = Verifier([identity.public] * 4).check
    start = time.process_time()
    for _ in range(count):
        check(topic, 3, signed)
    verifying = (time.process_time() - start) / count * 1e6
    chain = KeyChain(identity.chain_seed("bench"), count)
    keys = [key_b64(chain.key(t)) for t in range(count)]
    follow = ChainCheck(chain.anchor)
    start = time.process_time()
    for t, k in enumerate(keys):
        follow.check(t, k)
    return signing, verifying, (time.process_time() - start) / count * 1e6


async def network_cpu(cfg: RunConfig, auth: bool) -> float:
    """Milliseconds of CPU per round of the whole memory network."""
    edges = run_edges(cfg)
    ids = [new_identity() for _ in range(cfg.n)]
    keys = [identity.public for identity in ids] if auth else None
    broker = MemoryBroker()
    nodes = [
        Node(
            cfg,
            i,
            0.01 * i,
            MemoryTransport(broker, f"n{i}"),
            run_id="bench",
            edges=edges,
            identities=keys,
            identity=ids[i] if auth else None,
        )
        for i in range(cfg.n)
    ]
    start = time.process_time()
    async with asyncio.TaskGroup() as tg:
        for node in nodes:
            await node.__aenter__()
        for node in nodes:
            tg.create_task(node.run())
    return (time.process_time() - start) / cfg.t_max_value * 1e3


def main(args: argparse.Namespace) -> None:
    sign, verify, hashed = primitives()
    print(
        f"per message: Ed25519 sign {sign:5.1f} us, verify {verify:5.1f} us; "
        f"an x's key-chain check {hashed:4.1f} us of CPU"
    )
    cfg = RunConfig(op="max", n=args.n, trials=1, t_max=args.rounds, seed=args.seed, early_stop=False)
    degree = 2 * len(run_edges(cfg)) / cfg.n
    plain, signed = [], []
    for _ in range(args.repeat):
        plain.append(asyncio.run(network_cpu(cfg, auth=False)))
        signed.append(asyncio.run(network_cpu(cfg, auth=True)))
    p, s = statistics.median(plain), statistics.median(signed)
    print(
        f"memory network n = {cfg.n} (mean degree {degree:.1f}), {args.rounds} rounds: CPU per round "
        f"{p:6.2f} ms unsigned, {s:6.2f} ms signed (x{s / p:4.1f}); "
        f"+{(s - p) / cfg.n * 1e3:5.0f} us per node and round "
        f"(signing each x and verifying it at {degree:.1f} receivers: {sign + degree * verify:5.0f} us; "
        f"{degree:.1f} chain checks: {degree * hashed:3.0f} us)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
