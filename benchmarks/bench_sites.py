"""Deliveries per broker per round: one Mosquitto against K site brokers bridged along the partition.

    python benchmarks/bench_sites.py [--n 100 400] [--sites 4] [--rounds 10] [--seed 5]

For each n, on the same RGG (the plan's graph of ``--seed``), two layouts on this machine's loopback:

* one broker: every node's subscription on it;
* K sites: ``nlagg deploy plan --sites K``'s partition, one Mosquitto per site, joined by exactly
  the plan's bridges (``bridge_conf_lines``: the cut edges' topics, one direction each).

Every node holds its own connection to its site's broker, subscribed to its neighbours' x topics,
QoS 1 (what ``nlagg node`` subscribes to for x), and an eavesdropper subscribes to ``P/R/#`` at
every broker; one publisher per site publishes each of its nodes' x (wire protocol v1 payloads)
once per round, and the round ends when every subscriber has its x's. Deliveries are the brokers'
own counter ``$SYS/broker/publish/messages/sent`` over the rounds (sys_interval 1; the monitor's own
``$SYS`` messages subtracted), divided by the rounds; bridge forwarding counts at the sending
broker. The model beside it is :func:`nlagg_node.deploy.sites.delivery_model` (intra-site
deliveries, one per bridge a boundary x crosses, the bridged x's deliveries at the far site).
Also printed: each broker's CPU seconds per round (``/proc/<pid>/stat``) and rounds per second.

These brokers run without the plan's passwords and ACL (the publishers send other nodes' topics);
topics, subscriptions and bridges are the plan's. Every client runs in this one Python process,
so on a small machine the rounds per second measure the clients, not the brokers; the delivery
counts do not depend on speed. Target (issue 19): at n = 400, K = 4, the busiest site broker
carries at most 0.35 of the single broker's deliveries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan
from nlagg_node.deploy.sites import bridge_address, bridge_conf_lines, cut_edges, delivery_model
from nlagg_node.runtime.brokers import BrokerHandle, free_port, start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.wire import encode_x, topics
from nlagg_node.schedule import plan_phases

RUN = "bench"
SENT = "$SYS/broker/publish/messages/sent"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Layout:
    name: str
    site_of: list[int]
    urls: list[str]
    extra: list[list[str]]  # each broker's extra configuration lines (its bridges)


class Counter:
    """The latest ``$SYS`` sent counter of one broker, and how many ``$SYS`` messages it sent us."""

    def __init__(self, url: str) -> None:
        self.sub = MqttTransport(url, client_id=f"bench-sys-{url.rsplit(':', 1)[1]}", connect_within=30)
        self.value = -1
        self.seen = 0
        self.updated = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.sub.connect()
        await self.sub.subscribe(SENT, qos=0)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for m in self.sub.messages():
            self.value = int(m.payload)
            self.seen += 1
            self.updated.set()

    async def fresh(self) -> tuple[int, int]:
        """(counter, $SYS messages received) from an update published after this call."""
        for _ in range(2):  # the first update may have been counted before the call
            self.updated.clear()
            await self.updated.wait()
        return self.value, self.seen

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.sub.close()


async def run_layout(
    layout: Layout, nbrs: list[list[int]], rounds: int, phase: str
) -> tuple[list[float], list[float], float]:
    """Deliveries per round and CPU seconds per round of every broker, and rounds per second."""
    n = len(nbrs)
    t = topics("nlagg", RUN)
    k = len(layout.urls)
    async with contextlib.AsyncExitStack() as stack:
        brokers: list[BrokerHandle] = []
        for s, url in enumerate(layout.urls):
            port = int(url.rsplit(":", 1)[1])
            lines = ["sys_interval 1", *layout.extra[s]]
            brokers.append(await stack.enter_async_context(start_mosquitto(port=port, extra_lines=lines)))
        await asyncio.sleep(1.5)  # the bridges connect (and subscribe) at start
        counters = [Counter(url) for url in layout.urls]
        for c in counters:
            await c.start()
            stack.push_async_callback(c.close)
        want = [len(nbrs[i]) for i in range(n)]
        eaves_want = [0] * k
        for i in range(n):
            homes = {layout.site_of[i]} | {layout.site_of[j] for j in nbrs[i]}
            for s in homes:
                eaves_want[s] += 1
        got = [0] * (n + k)
        done = asyncio.Event()
        target = [*want, *eaves_want]
        remaining = [sum(target)]

        async def reader(idx: int, sub: MqttTransport) -> None:
            async for m in sub.messages():
                sub.ack([m])
                got[idx] += 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        subs: list[MqttTransport] = []
        for i in range(n):
            sub = MqttTransport(
                layout.urls[layout.site_of[i]], client_id=f"node{i}", manual_ack=True, connect_within=60
            )
            await sub.connect()
            await sub.subscribe(*(t.x(j) for j in nbrs[i]))
            subs.append(sub)
        for s in range(k):
            sub = MqttTransport(
                layout.urls[s], client_id=f"eavesdropper-{s}", manual_ack=True, connect_within=60
            )
            await sub.connect()
            await sub.subscribe(t.all)
            subs.append(sub)
        readers = [asyncio.create_task(reader(idx, sub)) for idx, sub in enumerate(subs)]
        pubs = []
        for s in range(k):
            pub = MqttTransport(layout.urls[s], client_id=f"publisher-{s}", clean_session=True)
            pubs.append(await stack.enter_async_context(pub))
        before = [await c.fresh() for c in counters]
        cpu0 = [cpu_seconds(b.pid or 0) for b in brokers]
        started = time.perf_counter()
        for r in range(rounds):
            done.clear()
            remaining[0] = sum(target)
            for i in range(n):
                pubs[layout.site_of[i]].publish_nowait(
                    t.x(i), encode_x(node=i, t=r, phase=phase, x=1.0 + i * 1e-3), qos=1
                )
            async with asyncio.timeout(300):
                await done.wait()
        elapsed = time.perf_counter() - started
        cpu1 = [cpu_seconds(b.pid or 0) for b in brokers]
        after = [await c.fresh() for c in counters]
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for sub in subs:
            await sub.close()
    deliveries = [((a[0] - b[0]) - (a[1] - b[1])) / rounds for a, b in zip(after, before, strict=True)]
    cpu = [(c1 - c0) / rounds for c0, c1 in zip(cpu0, cpu1, strict=True)]
    return deliveries, cpu, rounds / elapsed


def layouts(n: int, k: int, seed: int) -> tuple[Layout, Layout, list[list[int]], int, str]:
    cfg = load_config(None, op="max", n=n, graph="rgg", seed=seed)
    one_url = f"mqtt://127.0.0.1:{free_port()}"
    urls = tuple(f"mqtt://127.0.0.1:{free_port()}" for _ in range(k))
    plan = build_plan(PlanSpec(run=cfg, run_id=RUN, seed=seed, sites=k, site_brokers=urls))
    extra: list[list[str]] = [[] for _ in range(k)]
    for b in plan.bridges:
        extra[b.local] += bridge_conf_lines(b, bridge_address(urls[b.remote]), "unused")
    one = Layout("1 broker", [0] * n, [one_url], [[]])
    split = Layout(f"{k} sites", plan.site_of, list(urls), extra)
    phase = plan_phases(cfg.resolved())[0].name
    return one, split, plan.neighbours, len(cut_edges(plan.edges, plan.site_of)), phase


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    ok = True
    for n in args.n:
        one, split, nbrs, cut, phase = layouts(n, args.sites, args.seed)
        edges = sum(len(v) for v in nbrs) // 2
        print(f"\nn = {n}: RGG with {edges} edges; {args.sites} sites cut {cut} edges")
        single = single_cpu = 0.0
        for layout in (one, split):
            model = delivery_model(nbrs, layout.site_of)
            measured, cpu, rate = await run_layout(layout, nbrs, args.rounds, phase)
            if layout is one:
                single, single_cpu = measured[0], cpu[0]
            print(
                f"  {layout.name}: {rate:.1f} rounds/s (client-bound), load average {os.getloadavg()[0]:.1f}"
            )
            for s, (m, mod, c) in enumerate(zip(measured, model, cpu, strict=True)):
                print(
                    f"    broker {s}: {m:8.1f} deliveries/round (model {mod:6d}), "
                    f"{m / single:.3f} of one broker, {1e3 * c:6.2f} ms CPU/round"
                )
        busiest = max(measured) / single
        print(f"  busiest site broker / single broker = {busiest:.3f} (deliveries)", end="")
        print(f", {max(cpu) / single_cpu:.3f} (broker CPU seconds; 10 ms clock ticks)" if single_cpu else "")
        if n == 400 and args.sites == 4:
            ok = ok and busiest <= 0.35
            print(f"  target (n = 400, K = 4): <= 0.35 -> {'met' if busiest <= 0.35 else 'NOT met'}")
    print(f"\nload average after: {os.getloadavg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
