"""Mosquitto's memory over the epochs of a continuous deployment: what its retained topic tree keeps.

    python benchmarks/bench_broker_memory.py [--epochs 300] [--n 10] [--scenario nodes ...]

Each scenario starts its own Mosquitto on a free port (lab config, anonymous, ``sys_interval 1``)
and drives it with the topics of a continuous deployment ``P/R`` (docs/continuous.md), the way the
nodes and the eavesdropper use them, without running the protocol: every epoch k a fresh tree
``P/R/e{k}/...``: per node a retained key and ``online`` status, its z^(0) to each of 4 neighbours,
``--iters`` x messages (QoS 1), a retained ``done`` status and its output retained on
``P/R/results/{i}``; an eavesdropper holds a persistent session on ``P/R/#`` throughout.

Scenarios (one thing varied at a time):

* ``nodes``: what nodes did before 2026-11-27 (commit 650144a): after epoch k each clears (empty
  retained message) its status and key of ``e{k-1}`` and of ``e{k-1}r``, the cold rerun, whether
  it ran or not;
* ``own``: the same, clearing ``e{k-1}`` only (topics that did hold a retained message): what nodes
  did from then until the shared topics;
* ``shared``: what nodes do since 2026-11-27 (branch ``retained``): the retained key and statuses
  on the topics every epoch shares, ``P/R/node/{i}/key`` and ``P/R/node/{i}/status`` (the payload
  names the run ``e{k}``), x's and z^(0)'s on the epoch's own ``P/R/e{k}/...`` (not retained);
  nothing cleared;
* ``kept``: nothing cleared;
* ``reused``: every epoch on the same topics (``e0``; a control: a tree of fixed shape);
* ``unretained``: statuses and keys not retained, nothing cleared (a control: no retained tree).

Prints one JSON line per scenario: Mosquitto's own heap count (``$SYS/broker/heap/current``, the
bytes it holds allocated: no allocator caching in it; null where the build does not track it), its
most ever (``heap/maximum``: a burst of QoS 1 messages queued for a subscriber that fell behind,
which the RSS keeps as allocator cache) and its RSS (``VmRSS``) at checkpoint epochs, the heap's
growth per epoch from epoch 20 on, and the RSS's growth after epoch 20 (the soak's criterion,
issue 35).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from nlagg_node.runtime.brokers import LOOPBACK, free_port, mosquitto_binary

SCENARIOS = ("nodes", "own", "shared", "kept", "reused", "unretained")
HEAP = "$SYS/broker/heap/current"
HEAP_MAX = "$SYS/broker/heap/maximum"
ROOT = "P/R"


def _config(port: int, store: Path) -> str:
    lines = [
        f"listener {port} {LOOPBACK}",
        "allow_anonymous true",
        "set_tcp_nodelay true",
        "max_inflight_messages 0",
        "max_queued_messages 100000",
        "sys_interval 1",
        "persistence false",
        f"persistence_location {store}/",
        "log_dest none",
    ]
    if os.geteuid() == 0:
        lines.append("user root")  # Mosquitto would otherwise drop to its own user
    return "\n".join(lines) + "\n"


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class _Heap:
    """The broker's ``$SYS`` heap count, as it comes (once a second)."""

    def __init__(self) -> None:
        self.value: int | None = None
        self.maximum: int | None = None  # the most it ever held (a burst of queued messages)
        self.seen = 0
        self.cond = threading.Condition()

    def on_message(self, _c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self.cond:
            if msg.topic == HEAP_MAX:
                self.maximum = int(msg.payload)
                return
            self.value = int(msg.payload)
            self.seen += 1
            self.cond.notify_all()

    def fresh(self, timeout: float = 4.0) -> int | None:
        """The count after two more reports (the second one made after everything before it)."""
        with self.cond:
            want = self.seen + 2
            self.cond.wait_for(lambda: self.seen >= want, timeout)
            return self.value


def _client(port: int, cid: str, *, clean: bool = True) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean)
    c.connect(LOOPBACK, port)
    c.loop_start()
    return c


@contextmanager
def _broker() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    binary = mosquitto_binary()
    if binary is None:
        raise SystemExit("mosquitto not found")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="nlagg-brokermem-") as tmp:
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(_config(port, Path(tmp)))
        proc = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            yield proc, port
        finally:
            proc.terminate()
            proc.wait()


def _epoch(pub: mqtt.Client, scenario: str, k: int, n: int, iters: int) -> mqtt.MQTTMessageInfo:
    """Publish epoch ``k`` as the ``n`` nodes of a ring with 4 neighbours each would."""
    base = f"{ROOT}/e{0 if scenario == 'reused' else k}"
    held = ROOT if scenario == "shared" else base  # where the retained key and statuses go
    named = f',"run":"e{k}"'.encode() if scenario == "shared" else b""
    retain = scenario != "unretained"
    for i in range(n):
        pub.publish(f"{held}/node/{i}/key", b"k" * 44 + named, qos=1, retain=retain)
        info = pub.publish(
            f"{held}/node/{i}/status", b'{"state":"online"' + named + b"}", qos=1, retain=retain
        )
        for d in (-2, -1, 1, 2):
            pub.publish(f"{base}/edge/{i}/{(i + d) % n}/z0", b"z" * 80, qos=1)
    for _ in range(iters):
        for i in range(n):
            info = pub.publish(f"{base}/node/{i}/x", b"x" * 60, qos=1)
    cleared = {"nodes": (f"e{k - 1}", f"e{k - 1}r"), "own": (f"e{k - 1}",)}.get(scenario, ())
    for i in range(n):
        pub.publish(f"{held}/node/{i}/status", b'{"state":"done"' + named + b"}", qos=1, retain=retain)
        info = pub.publish(f"{ROOT}/results/{i}", f'{{"epoch":{k}}}'.encode(), qos=1, retain=True)
        for run in cleared if k > 0 else ():
            pub.publish(f"{ROOT}/{run}/node/{i}/status", b"", qos=1, retain=True)
            info = pub.publish(f"{ROOT}/{run}/node/{i}/key", b"", qos=1, retain=True)
    return info


def run_scenario(scenario: str, epochs: int, n: int, iters: int, checkpoints: list[int]) -> dict[str, object]:
    """One fresh broker through ``epochs`` epochs of ``scenario``: its heap and RSS at ``checkpoints``."""
    heap = _Heap()
    rows: list[dict[str, int | None]] = []
    with _broker() as (proc, port):
        mon = _client(port, "bench-monitor")
        mon.on_message = heap.on_message
        mon.subscribe([(HEAP, 0), (HEAP_MAX, 0)])
        eaves = _client(port, "bench-eavesdropper", clean=False)
        eaves.subscribe(f"{ROOT}/#", qos=1)
        pub = _client(port, "bench-nodes")
        try:
            for k in range(epochs + 1):
                _epoch(pub, scenario, k, n, iters).wait_for_publish(30)
                if k in checkpoints:
                    now = heap.fresh()
                    rows.append(
                        {"epoch": k, "heap": now, "heap_max": heap.maximum, "rss_kb": _rss_kb(proc.pid)}
                    )
        finally:
            for c in (pub, eaves, mon):
                c.disconnect()
                c.loop_stop()
    return _summary(scenario, n, rows)


def _summary(scenario: str, n: int, rows: list[dict[str, int | None]]) -> dict[str, object]:
    """The growth per epoch of the heap and the RSS's after epoch 20 (from the checkpoint ``rows``)."""
    at20 = next(r for r in rows if r["epoch"] == 20)
    last = rows[-1]
    out: dict[str, object] = {"scenario": scenario, "n": n, "checkpoints": rows}
    h20, hend, span = at20["heap"], last["heap"], int(last["epoch"] or 0) - 20
    if h20 is not None and hend is not None and span > 0:
        out["heap_bytes_per_epoch"] = round((hend - h20) / span, 1)
        out["heap_bytes_per_node_epoch"] = round((hend - h20) / span / n, 1)
    r20, rend = at20["rss_kb"], last["rss_kb"]
    if r20 and rend:
        out["rss_growth_after_epoch_20"] = round(rend / r20 - 1, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--n", type=int, default=10, help="nodes (a ring, 4 neighbours each)")
    ap.add_argument("--iters", type=int, default=20, help="x messages per node and epoch")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: every one")
    args = ap.parse_args()
    if args.n < 5:
        ap.error("--n must be at least 5 (a ring with 4 neighbours each)")
    if args.epochs < 20:
        ap.error("--epochs must be at least 20 (growth is measured from epoch 20 on)")
    marks = [m for m in (0, 20, 50, 100, 200, 300, 500, 1000, 2000) if m < args.epochs] + [args.epochs]
    for scenario in args.scenario or SCENARIOS:
        print(json.dumps(run_scenario(scenario, args.epochs, args.n, args.iters, marks)), flush=True)


if __name__ == "__main__":
    main()
