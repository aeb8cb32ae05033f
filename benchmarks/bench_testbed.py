"""Rounds per second of the networked testbed against a raw MQTT round baseline, in one run.

    python benchmarks/bench_testbed.py [--n 15[,200,1000]] [--rounds R] [--repeat 3]
                                       [--layouts processes,in-process]
                                       [--eavesdropper-nice 10] [--capture-baseline] [--tls] [--auth]

Both sides run on the same private Mosquitto (set_tcp_nodelay true), the same graph (the
run's RGG), the same process layout and the same transport (MqttTransport: paho, QoS 1,
TCP_NODELAY):

* baseline: synchronous rounds with a trivial payload; a node publishes round t and waits for
  round t of every neighbour. No math, no JSON, no capture.
* testbed: ``run_testbed`` (max, ``t_max = rounds``): full wire protocol v1, PDMM updates, the
  eavesdropper storing every message in SQLite and replaying the attack live (as the testbed
  runs it by default: its own process at nice +10).

Rounds per second are measured from the first round to the last (startup excluded) on both
sides; the testbed's from its z^(0) exchange on, which the baseline does not have. By default each
layout runs about seven seconds of rounds on this machine, so that fixed part weighs under 1%:
1000 rounds one process per node, 5000 in-process. 1000 in-process rounds last about a second, of
which the testbed's fixed part was 34 ms (3%; measured 2026-11-26 from the rates at 1000 and 5000
rounds, 3 repeats each). ``--rounds`` sets both. Target: testbed >= 90% of the baseline (issue 15).
``--n`` takes several sizes (``--n 15,200,1000``, issue 44); beyond n = 15 the default rounds shrink
as 15 / n (a round costs about n times as much), never below 100, and each line also gives the
hosted node-iterations per second (rounds/s x n) of both sides.
The machine is shared, so the two are run back to back, alternately, ``--repeat`` times, and the
medians compared; the line also gives the median and range of the ratios of each testbed run to the
raw run just before it (the load drifts less within a pair).

``--capture-baseline`` also runs the raw rounds with a bare capture beside them: the eavesdropper's
own MQTT client subscribed to every topic, acking what it receives and nothing more, as its own process
at the eavesdropper's nice. That is what any capture costs (Mosquitto's extra deliveries and one
reader), so testbed / that ratio is what nlagg's own work (the protocol, the math, storing and
attacking the capture) leaves of the rounds.

``--auth`` also runs the testbed with signed messages (every node an Ed25519 identity, as
``nlagg deploy plan`` gives by default; docs/protocol.md "Signed messages") after each unsigned run,
and reports its ratio to the raw rounds (target of issue 31: >= 0.85) and to the unsigned testbed.

``--tls`` also reports the TLS overhead: the same raw rounds over ``mqtts://`` (TLS 1.2+, a
private CA made as ``nlagg deploy plan --tls`` makes it, the server verified) against plain
``mqtt://``, on one Mosquitto with a plain and a TLS listener, alternately, ``--repeat`` times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

from nlagg_node.config import RunConfig
from nlagg_node.graphs import neighbours
from nlagg_node.lab.children import Child
from nlagg_node.lab.testbed import new_run_id, run_testbed
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.public import run_edges
from nlagg_node.runtime.tls import TlsSettings
from nlagg_node.runtime.transport import Transport

SELF = __file__
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class RawRound:
    """A baseline node: publish ``t``, wait for ``t`` from every neighbour, repeat."""

    def __init__(self, i: int, nbrs: list[int], run: str) -> None:
        self.i, self.nbrs, self.run = i, nbrs, run
        self.counts: dict[int, int] = {}
        self.online: set[int] = set()
        self.waiting: asyncio.Future[None] | None = None
        self.want = -1

    def topic(self, j: int | str, leaf: str) -> str:
        return f"bench/{self.run}/{j}/{leaf}"

    def ready(self, t: int) -> bool:
        if t < 0:
            return len(self.online) == len(self.nbrs)
        return self.counts.get(t, 0) == len(self.nbrs)

    def feed(self, j: int, online: bool, t: int) -> None:
        if online:
            self.online.add(j)
        else:
            self.counts[t] = self.counts.get(t, 0) + 1
        if self.waiting is not None and not self.waiting.done() and self.ready(self.want):
            self.waiting.set_result(None)

    async def wait(self, t: int) -> None:
        self.want = t
        if not self.ready(t):
            self.waiting = asyncio.get_running_loop().create_future()
            await self.waiting
            self.waiting = None

    async def run_rounds(self, tr: Transport, rounds: int) -> float:
        await tr.publish(self.topic(self.i, "on"), b"1", retain=True)
        await self.wait(-1)
        started = time.perf_counter()
        for t in range(rounds):
            tr.publish_nowait(self.topic(self.i, "x"), str(t).encode())
            await self.wait(t)
            self.counts.pop(t, None)
        return rounds / (time.perf_counter() - started)


async def _reader(tr: Transport, route: dict[int, list[RawRound]]) -> None:
    """Parse each message once (as the testbed's router decodes once), then count it at each listener."""
    async for msg in tr.messages():
        _, _, sender, leaf = msg.topic.split("/")
        online = leaf == "on"
        j, t = int(sender), -1 if online else int(msg.payload)
        for node in route.get(j, ()):
            node.feed(j, online, t)


def _tls(ca: str | None) -> TlsSettings | None:
    return None if ca is None else TlsSettings(ca_file=Path(ca))


async def raw_in_process(url: str, cfg: RunConfig, rounds: int, ca: str | None = None) -> float:
    run = new_run_id()
    nb = neighbours(cfg.n, run_edges(cfg))
    nodes = [RawRound(i, nb[i], run) for i in range(cfg.n)]
    route: dict[int, list[RawRound]] = {}
    for node in nodes:
        for j in node.nbrs:
            route.setdefault(j, []).append(node)
    async with MqttTransport(url, client_id=f"bench-{run}-host", tls=_tls(ca)) as tr:
        await tr.subscribe(f"bench/{run}/#")
        reader = asyncio.create_task(_reader(tr, route))
        rates = await asyncio.gather(*(node.run_rounds(tr, rounds) for node in nodes))
        reader.cancel()
    return min(rates)


async def raw_one_node(
    url: str, run: str, i: int, nbrs: list[int], rounds: int, ca: str | None = None
) -> float:
    node = RawRound(i, nbrs, run)
    async with MqttTransport(url, client_id=f"bench-{run}-{i}", tls=_tls(ca)) as tr:
        await tr.subscribe(*(node.topic(j, "+") for j in nbrs))
        reader = asyncio.create_task(_reader(tr, {j: [node] for j in nbrs}))
        rate = await node.run_rounds(tr, rounds)
        await asyncio.sleep(0.2)  # let the neighbours receive our last round
        reader.cancel()
    return rate


async def bare_capture(url: str) -> None:
    """``--capture-baseline``'s capture: the eavesdropper's own client (QoS 1, persistent session,
    acks in batches) subscribed to every bench topic, storing and attacking nothing."""
    from nlagg_node.runtime.transport import Message

    async with MqttTransport(url, client_id=f"bench-capture-{new_run_id()}", manual_ack=True) as sub:
        await sub.subscribe("bench/#")
        print(json.dumps({"event": "subscribed"}), flush=True)  # what Child.subscribed waits for
        batch: list[Message] = []
        async for msg in sub.messages():
            batch.append(msg)
            if not sub.backlog():
                sub.ack(batch)
                batch = []


async def raw_with_capture(url: str, cfg: RunConfig, rounds: int, in_process: bool, nice: int) -> float:
    """Raw rounds while a bare capture (its own process, at ``nice``) receives every message."""
    sink = await Child.start([sys.executable, SELF, "--bare-capture", url], nice=nice)
    try:
        async with asyncio.timeout(60):
            await sink.subscribed.wait()
        raw = raw_in_process if in_process else raw_processes
        return await raw(url, cfg, rounds)
    finally:
        await sink.stop()


async def raw_processes(url: str, cfg: RunConfig, rounds: int, ca: str | None = None) -> float:
    run = new_run_id()
    nb = neighbours(cfg.n, run_edges(cfg))
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            SELF,
            "--raw-node",
            json.dumps({"url": url, "run": run, "i": i, "nbrs": nb[i], "rounds": rounds, "ca": ca}),
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(cfg.n)
    ]
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    return min(float(out.decode().strip()) for out, _ in outs)


async def testbed_rate(url: str, cfg: RunConfig, in_process: bool, nice: int, auth: bool) -> float:
    summary = await run_testbed(cfg, broker_url=url, in_process=in_process, eavesdropper_nice=nice, auth=auth)
    if not summary["exact"] and cfg.t_max_value >= 7000:
        print("warning: testbed result not exact", file=sys.stderr)
    return float(summary["rounds_per_second"])


async def tls_overhead(cfg: RunConfig, layouts: list[str], repeat: int) -> None:
    from tests.harness.tlsbroker import tls_lab_broker  # a test fixture, not part of the installed package

    rounds = cfg.t_max_value

    async with tls_lab_broker() as broker:
        plain, tls, ca = broker.plain_url, broker.tls_url, str(broker.ca_file)
        for layout in layouts:
            raw = raw_in_process if layout == "in-process" else raw_processes
            base, secured = [], []
            for _ in range(repeat):
                base.append(await raw(plain, cfg, rounds))
                secured.append(await raw(tls, cfg, rounds, ca))
            b, s = statistics.median(base), statistics.median(secured)
            print(
                f"{layout:>11}: raw MQTT rounds plain {b:7.1f}/s   over TLS {s:7.1f}/s   "
                f"TLS costs {1 - s / b:6.1%}  (runs: plain {[round(x) for x in base]}, "
                f"TLS {[round(x) for x in secured]})"
            )


ROUNDS = {"processes": 1000, "in-process": 5000}  # about seven seconds each here at n = 15 (see above)
MIN_ROUNDS = 100


def default_rounds(layout: str, n: int) -> int:
    """About seven seconds of rounds at n = 15, scaled as 15 / n beyond it (at least MIN_ROUNDS)."""
    return max(MIN_ROUNDS, ROUNDS[layout] * 15 // max(n, 15))


def layout_config(args: argparse.Namespace, layout: str, n: int) -> RunConfig:
    rounds = args.rounds or default_rounds(layout, n)
    return RunConfig(op="max", n=n, trials=1, t_max=rounds, seed=args.seed, early_stop=False)


async def main(args: argparse.Namespace) -> None:
    layouts = args.layouts.split(",")
    unknown = sorted(set(layouts) - set(ROUNDS))
    if unknown:
        sys.exit(f"--layouts: unknown {unknown}; use {','.join(ROUNDS)}")
    sizes = [int(v) for v in str(args.n).split(",")]
    if not args.tls_only:
        async with start_mosquitto() as broker:
            for n in sizes:
                print(f"Mosquitto at {broker.url}; n = {n}, RGG seed {args.seed}")
                for layout in layouts:
                    await testbed_ratio(broker.url, layout_config(args, layout, n), layout, args)
    if args.tls or args.tls_only:
        for n in sizes:
            print(f"TLS overhead (mqtts:// against mqtt://, n = {n}, raw rounds):")
            for layout in layouts:
                await tls_overhead(layout_config(args, layout, n), [layout], args.repeat)


async def testbed_ratio(url: str, cfg: RunConfig, layout: str, args: argparse.Namespace) -> None:
    in_process = layout == "in-process"
    raw = raw_in_process if in_process else raw_processes
    rounds = cfg.t_max_value
    base, ours, captured, signed = [], [], [], []
    for _ in range(args.repeat):
        base.append(await raw(url, cfg, rounds))
        ours.append(await testbed_rate(url, cfg, in_process, args.eavesdropper_nice, auth=False))
        if args.auth:
            signed.append(await testbed_rate(url, cfg, in_process, args.eavesdropper_nice, auth=True))
        if args.capture_baseline:
            captured.append(await raw_with_capture(url, cfg, rounds, in_process, args.eavesdropper_nice))
    b, o = statistics.median(base), statistics.median(ours)
    # Each testbed run against the raw run just before it: the load drifts less within a pair.
    pairs = [t / r for r, t in zip(base, ours, strict=True)]
    print(
        f"{layout:>11} ({rounds} rounds): raw MQTT rounds {b:7.1f}/s   testbed {o:7.1f}/s   "
        f"ratio {o / b:5.2f}  (target >= 0.90; runs: raw {[round(x) for x in base]}, "
        f"testbed {[round(x) for x in ours]}; pairs: median {statistics.median(pairs):4.2f}, "
        f"{min(pairs):4.2f}-{max(pairs):4.2f}); node-iterations/s raw {b * cfg.n:,.0f}, "
        f"testbed {o * cfg.n:,.0f}"
    )
    if signed:
        a = statistics.median(signed)
        print(
            f"{layout:>11}: signed (--auth) {a:7.1f}/s   ratio to raw {a / b:5.2f} (target >= 0.85)   "
            f"to unsigned {a / o:5.2f}  (runs {[round(x) for x in signed]}; pairs with raw: "
            f"{[round(s / r, 2) for r, s in zip(base, signed, strict=True)]})"
        )
    if captured:
        c = statistics.median(captured)
        print(
            f"{layout:>11}: raw rounds beside a bare capture {c:7.1f}/s ({c / b:5.3f} of raw); "
            f"testbed / that {o / c:5.2f}  (runs {[round(x) for x in captured]})"
        )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bare-capture":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(bare_capture(sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-node":
        spec = json.loads(sys.argv[2])
        rate = raw_one_node(spec["url"], spec["run"], spec["i"], spec["nbrs"], spec["rounds"], spec["ca"])
        print(asyncio.run(rate))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="15", help="network size(s), comma-separated: 15,200,1000")
    parser.add_argument(
        "--rounds", type=int, default=None, help="default: 1000 processes, 5000 in-process (x 15 / n)"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", default="processes,in-process")
    parser.add_argument("--eavesdropper-nice", type=int, default=10, help="the testbed's default: 10")
    parser.add_argument(
        "--capture-baseline", action="store_true", help="also raw rounds beside a bare capture subscriber"
    )
    parser.add_argument("--tls", action="store_true", help="also measure the TLS overhead (raw rounds)")
    parser.add_argument(
        "--auth", action="store_true", help="also the testbed with signed messages (deploy plan's default)"
    )
    parser.add_argument("--tls-only", action="store_true", help="only the TLS overhead")
    asyncio.run(main(parser.parse_args()))
