"""A continuous deployment soaked with faults: the plan's own files, Mosquitto, node processes and
the continuous eavesdropper, epoch after epoch (``benchmarks/soak_epochs.py``, the slow test
``tests/integration/test_epoch_soak.py``).

The deployment is ``nlagg deploy plan --every S --epochs K`` (max, values in [0, 100]): its
Mosquitto configuration (passwords, the continuous ACL, persistence), each node as
``nlagg deploy node nodes/<i>.toml`` in its own process, and ``nlagg eavesdrop --continuous
--keep-epochs N`` with the eavesdropper's credentials. The values follow a pinned random walk whose
steps stay within the declared drift (a fraction of the range); epoch k's values are written to
the nodes' value files half a period before its start, so the truth of every epoch is known.
Faults (:class:`Fault`) strike on a schedule: a node SIGKILLed mid-epoch and restarted, the broker
stopped mid-epoch and started again, a node stopped (SIGTERM) for some epochs, the eavesdropper
SIGKILLed mid-epoch and restarted. Every live process's RSS and the store's size are sampled near
the end of each epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from adversary.epochs import attack_epochs
from adversary.transcript import EpochStore
from nlagg_node.argv import eavesdrop_argv, this_python
from nlagg_node.lab.children import Child
from nlagg_node.lifetime import parent_death_signal
from nlagg_node.private import write_private
from nlagg_node.rng import rng_for
from nlagg_node.runtime.brokers import free_port, mosquitto_binary
from nlagg_node.runtime.outputs import EpochOutput, read_outputs

__all__ = [
    "EpochVerdict",
    "Fault",
    "FaultKind",
    "Soak",
    "SoakReport",
    "SoakSettings",
    "default_faults",
    "rss_kib",
    "walk",
]

SPAN = 100.0
RUN_ID = "soak"
FaultKind = Literal["node", "broker", "absent", "eavesdropper"]


@dataclass(frozen=True)
class Fault:
    """A fault at epoch ``epoch``: ``node`` SIGKILL of node ``node`` mid-epoch and a restart;
    ``broker`` stop mid-epoch and start; ``absent`` SIGTERM of node ``node`` before the epoch and a
    restart ``length`` epochs later; ``eavesdropper`` SIGKILL mid-epoch and a restart."""

    epoch: int
    kind: FaultKind
    node: int = 0
    length: int = 0


def default_faults(epochs: int, n: int) -> list[Fault]:
    """The schedule of a run of ``epochs``: each fault kind at least once, spread over the run."""

    def at(fraction: float) -> int:
        return max(1, min(epochs - 2, round(fraction * epochs)))

    faults = [
        Fault(at(0.15), "node", node=1),
        Fault(at(0.25), "eavesdropper"),
        Fault(at(0.35), "broker"),
        Fault(at(0.45), "absent", node=n - 1, length=max(1, epochs // 40)),
        Fault(at(0.6), "node", node=4),
        Fault(at(0.7), "eavesdropper"),
        Fault(at(0.8), "node", node=7),
    ]
    return faults if epochs >= 20 else [Fault(at(0.3), "node", node=1), Fault(at(0.7), "eavesdropper")]


def walk(n: int, epochs: int, drift: float, seed: int) -> np.ndarray:
    """``(epochs, n)`` values in [0, SPAN]: a random walk from uniform starts in the middle of the
    range, steps uniform in ``[-drift, drift] * SPAN``, clipped to the range (a step never grows)."""
    rng = rng_for(seed, "epoch-soak-walk")
    values = np.empty((epochs, n))
    values[0] = rng.uniform(0.2 * SPAN, 0.8 * SPAN, n)
    for k in range(1, epochs):
        values[k] = np.clip(values[k - 1] + rng.uniform(-drift, drift, n) * SPAN, 0.0, SPAN)
    return values


RSS_PARTS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
"""The resident set and its parts (/proc/PID/status): anonymous memory is the heap, file pages are
mapped files (libraries, an SQLite store's shared memory), which the kernel may drop and refetch."""


def rss_parts(pid: int) -> dict[str, int] | None:
    """Process ``pid``'s :data:`RSS_PARTS` in KiB (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = dict(re.findall(r"^(VmRSS|RssAnon|RssFile|RssShmem):\s+(\d+) kB", text, re.MULTILINE))
    return {k: int(v) for k, v in found.items()} if "VmRSS" in found else None


def rss_kib(pid: int) -> int | None:
    """The resident set of process ``pid`` in KiB (None once it is gone)."""
    parts = rss_parts(pid)
    return parts["VmRSS"] if parts is not None else None


def folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass(frozen=True)
class SoakSettings:
    epochs: int = 200
    every: float = 8.0
    n: int = 10
    drift: float = 0.005  # a fraction of the value range [0, SPAN]
    seed: int = 0
    keep_epochs: int = 5
    lead: float = 15.0  # seconds from the launch to epoch 0's start (the processes start Python)
    faults: tuple[Fault, ...] | None = None  # None: default_faults
    warm: bool = True  # the plan declares the drift (warm starts, docs/continuous.md); else --cold-start


@dataclass
class Incarnation:
    """One process's life: the epoch it started before and its RSS sampled per epoch."""

    name: str
    pid: int
    since: int
    parts: dict[int, dict[str, int]] = field(default_factory=dict)  # per epoch sampled: RSS_PARTS


class Soak:
    """The deployment under ``workdir`` (see the module notes); ``async with``, then :meth:`run`."""

    def __init__(self, settings: SoakSettings, workdir: Path) -> None:
        self.s = settings
        self.workdir = workdir
        self.root = workdir / "plan"
        self.store = workdir / "store"
        self.logs = workdir / "logs"
        self.port = free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.truth = walk(settings.n, settings.epochs, settings.drift, settings.seed)
        self.faults = list(
            default_faults(settings.epochs, settings.n) if settings.faults is None else settings.faults
        )
        self.origin = 0.0
        self.edges: list[tuple[int, int]] = []
        self.nodes: dict[int, Child] = {}
        self.eavesdropper: Child | None = None
        self.broker: asyncio.subprocess.Process | None = None
        self.lives: list[Incarnation] = []
        self.store_bytes: dict[int, int] = {}
        self.late_values: list[int] = []  # epochs whose values were written after the nodes read them
        self.children: list[tuple[int, Child]] = []  # every node process, restarts included
        self.fault_log: list[str] = []

    # The parts ---------------------------------------------------------------------------------
    def _plan(self) -> None:
        """``nlagg deploy plan --every S --epochs K`` on a free port, and its Mosquitto configuration
        as root may run it (Mosquitto would otherwise drop to its own user)."""
        self.origin = time.time() + self.s.lead
        argv = [*this_python(), "deploy", "plan", "--out", str(self.root), "--run-id", RUN_ID]
        argv += ["--op", "max", "--n", str(self.s.n), "--value-range", "0", str(SPAN), "--c", "10"]
        argv += ["--mu-z", "30", "--seed", str(self.s.seed), "--every", repr(self.s.every)]
        argv += ["--epochs", str(self.s.epochs), "--origin", repr(self.origin)]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--broker", self.url]
        argv += ["--drift", repr(self.s.drift)] if self.s.warm else ["--cold-start"]
        subprocess.run(argv, check=True, capture_output=True)
        conf = self.root / "broker" / "mosquitto.conf"
        (self.root / "broker" / "soak.conf").write_text(conf.read_text() + "user root\n")
        graph = json.loads((self.root / "graph.json").read_text())
        self.edges = [(int(a), int(b)) for a, b in graph["edges"]]
        self._write_values(0)

    def start(self, k: int) -> float:
        return self.origin + k * self.s.every

    def _write_values(self, k: int) -> None:
        read_at = self.start(k) - min(self.s.every / 3, 30.0) / 2  # the nodes read half a join window early
        for i, v in enumerate(self.truth[k]):
            write_private(self.root / "values" / f"{i}.txt", f"{float(v)!r}\n")
        if k and time.time() > read_at - 0.1:
            self.late_values.append(k)

    async def _start_broker(self, k: int) -> None:
        binary = mosquitto_binary() or "mosquitto"
        with (self.logs / "mosquitto.log").open("ab") as log:
            self.broker = await asyncio.create_subprocess_exec(
                binary,
                "-c",
                "broker/soak.conf",
                cwd=self.root,
                stdout=log,
                stderr=log,
                preexec_fn=parent_death_signal(),
            )
        async with asyncio.timeout(20):
            while not _listening(self.port):
                assert self.broker.returncode is None, (self.logs / "mosquitto.log").read_text()[-2000:]
                await asyncio.sleep(0.05)
        self.lives.append(Incarnation("broker", self.broker.pid, k))

    async def _stop_broker(self) -> None:
        proc = self.broker
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # persistence: its sessions and retained messages are saved
            await proc.wait()

    async def _start_node(self, i: int, k: int) -> None:
        argv = [*this_python(), "deploy", "node", str(self.root / "nodes" / f"{i}.toml")]
        child = await Child.start(argv, log=self.logs / f"node{i}.log")
        self.nodes[i] = child
        self.children.append((i, child))
        self.lives.append(Incarnation(f"node {i}", child.proc.pid, k))

    async def _start_eavesdropper(self, k: int) -> None:
        argv = eavesdrop_argv(
            self.url,
            RUN_ID,
            str(self.store),
            program=this_python(),
            continuous=True,
            keep_epochs=self.s.keep_epochs,
            events=True,
            live=False,
            username="eavesdropper",
            password_file=str(self.root / "secrets" / "eavesdropper.pw"),
            **({"config": str(self.root / "run.toml"), "drift": self.s.drift} if self.s.warm else {}),
        )
        self.eavesdropper = await Child.start(argv, log=self.logs / "eavesdropper.log")
        async with asyncio.timeout(60):
            await self.eavesdropper.subscribed.wait()
        self.lives.append(Incarnation("eavesdropper", self.eavesdropper.proc.pid, k))

    # The timeline --------------------------------------------------------------------------------
    async def __aenter__(self) -> Soak:
        self.logs.mkdir(parents=True, exist_ok=True)
        self._plan()
        await self._start_broker(0)
        await self._start_eavesdropper(0)
        for i in range(self.s.n):
            await self._start_node(i, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for _, child in self.children:
            await child.kill()
        if self.eavesdropper is not None:
            await self.eavesdropper.kill()
        if self.broker is not None and self.broker.returncode is None:
            self.broker.kill()
            await self.broker.wait()

    async def _until(self, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.time()))

    async def run(self, mid: float = 0.3, within: float = 120.0) -> None:
        """The epochs' values, faults (``mid`` x the period after an epoch's start) and samples; then
        wait (``within`` s) for the nodes to end and the eavesdropper to close what they ran."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._values())
            tg.create_task(self._samples())
            await self._faults(mid)
        async with asyncio.timeout(within):
            for _, child in self.children:
                await child.wait()
        await self._until_captured(30.0)

    async def _values(self) -> None:
        for k in range(1, self.s.epochs):
            await self._until(self.start(k) - self.s.every / 2)
            self._write_values(k)

    async def _samples(self) -> None:
        for k in range(self.s.epochs):
            await self._until(self.start(k) + 0.45 * self.s.every)
            self._sample(k)

    async def _faults(self, mid: float) -> None:
        back: dict[int, int] = {}  # an absent node -> the epoch it rejoins
        for k in range(self.s.epochs):
            await self._until(self.start(k) - self.s.every / 2)
            faults = [f for f in self.faults if f.epoch == k]
            for f in faults:
                if f.kind == "absent":  # stopped before the epoch reads its value: absent from it
                    await self.nodes[f.node].stop()
                    back[f.node] = k + f.length
                    self.fault_log.append(f"epoch {k}: node {f.node} stopped (SIGTERM) for {f.length}")
            await self._until(self.start(k) + mid * self.s.every)
            for f in faults:
                await self._strike(f, k)
            for i, due in list(back.items()):
                if due == k + 1:  # restarted during the epoch before: it joins the next start
                    await self._start_node(i, k + 1)
                    del back[i]
                    self.fault_log.append(f"epoch {k}: node {i} restarted (rejoins at {k + 1})")

    async def _until_captured(self, within: float) -> None:
        """Wait (at most ``within`` s) until the store has closed every epoch some node finished (an
        epoch no node ran never opens), then stop the eavesdropper (SIGTERM: it commits and ends)."""
        ran = {e for (e, _) in self._outputs()}
        for _ in range(int(within / 0.5)):  # polled: the store is another process's files
            if ran <= self._closed():
                break
            await asyncio.sleep(0.5)
        if self.eavesdropper is not None:
            await self.eavesdropper.stop(grace=30.0)

    def _closed(self) -> set[int]:
        if not (self.store / "epochs.sqlite").exists():
            return set()
        with EpochStore(self.store, read_only=True) as st:
            return {r.epoch for r in st.epochs() if r.state != "open"}

    async def _strike(self, f: Fault, k: int) -> None:
        if f.kind == "node":
            await self.nodes[f.node].kill()
            await asyncio.sleep(0.5)
            await self._start_node(f.node, k + 1)
            self.fault_log.append(f"epoch {k}: node {f.node} SIGKILLed mid-epoch and restarted")
        elif f.kind == "broker":
            await self._stop_broker()
            await asyncio.sleep(1.0)
            await self._start_broker(k + 1)
            self.fault_log.append(f"epoch {k}: broker stopped mid-epoch and started again")
        elif f.kind == "eavesdropper":
            assert self.eavesdropper is not None
            await self.eavesdropper.kill()
            await asyncio.sleep(1.0)
            await self._start_eavesdropper(k + 1)
            self.fault_log.append(f"epoch {k}: eavesdropper SIGKILLed mid-epoch and restarted")

    # The verdict ---------------------------------------------------------------------------------
    def _outputs(self) -> dict[tuple[int, int], EpochOutput]:
        got = {}
        for i in range(self.s.n):
            path = self.root / "state" / f"results-{i}.jsonl"
            for r in read_outputs(path) if path.exists() else []:
                got[(r.epoch, r.node)] = r
        return got

    def _killed_in(self, k: int) -> list[int]:
        return [f.node for f in self.faults if f.epoch == k and f.kind == "node"]

    def _verdicts(self, outputs: dict[tuple[int, int], EpochOutput]) -> list[EpochVerdict]:
        why: dict[int, dict[int, str]] = {i: {} for i in range(self.s.n)}
        for i, child in self.children:
            why[i].update(_reasons(child.lines))
        tol = 1e-9 * SPAN  # the plan's tolerance, a fraction of the range
        rows = []
        for k in range(self.s.epochs):
            present = sorted(i for (e, i) in outputs if e == k)
            killed = [self.truth[k][j] for j in self._killed_in(k)]
            error = 0.0 if present else math.inf
            for i, part in _components(present, self.edges).items():
                lo = max(self.truth[k][j] for j in part)
                hi = max([lo, *killed])  # a node killed mid-epoch may have passed its value on
                out = float(np.ravel([outputs[(k, i)].output])[0])
                error = max(error, lo - out, out - hi)
            missing = {
                i: why[i].get(k, "(no line: stopped, killed or skipped)")
                for i in range(self.s.n)
                if i not in present
            }
            iters = max((outputs[(k, i)].iterations for i in present), default=0)
            rows.append(EpochVerdict(k, present, error <= tol, error, iters, missing))
        return rows

    def report(self, started: float) -> SoakReport:
        """Judge the run (after :meth:`run`)."""
        outputs = self._outputs()
        with EpochStore(self.store, read_only=True) as st:
            rows = st.epochs()
            stored = {(r.epoch, r.node) for r in st.results()}
        attack = attack_epochs(self.store, drift=self.s.drift)
        rss = []
        for life in self.lives:
            base_at = max(20, life.since + 20)
            at = next((e for e in sorted(life.parts) if e >= base_at), None)
            last = max(life.parts, default=None)
            total = [life.parts[e]["VmRSS"] if e is not None else None for e in (at, last)]
            anon = [life.parts[e].get("RssAnon") if e is not None else None for e in (at, last)]
            rss.append((life.name, life.since, at, total[0], total[1], anon[0], anon[1]))
        kept = [b for e, b in self.store_bytes.items() if e >= self.s.keep_epochs]
        return SoakReport(
            epochs=self._verdicts(outputs),
            in_store=[r.epoch for r in rows if r.state != "open"],
            open_in_store=[r.epoch for r in rows if r.state == "open"],
            results_published=len(outputs),
            results_in_store=len(stored & set(outputs)),
            soundness=attack.interval_soundness(dict(enumerate(self.truth))),
            combined_consistent=all(s.consistent for s in attack.nodes),
            rss=rss,
            store_bytes_max=max(kept, default=0),
            store_bytes_end=folder_bytes(self.store),
            late_values=self.late_values,
            faults=self.fault_log,
            wall=time.time() - started,
            starts=sum((_starts(child.lines) for _, child in self.children), Counter()),
        )

    def _sample(self, k: int) -> None:
        for life in self.lives:
            parts = rss_parts(life.pid)
            if parts is not None:
                life.parts[k] = parts
                with (self.logs / "rss.csv").open("a") as out:  # every sample, for the curves
                    row = [life.name, str(life.since), str(k), *(str(parts.get(p, "")) for p in RSS_PARTS)]
                    out.write(",".join(row) + "\n")
        if self.store.exists():
            self.store_bytes[k] = folder_bytes(self.store)


@dataclass(frozen=True)
class EpochVerdict:
    """One epoch: the nodes that finished it, whether all are exact against the maximum of their
    values (an epoch a node was killed in: within [that, the maximum with the killed node's value]),
    and the nodes missing from it with why."""

    epoch: int
    present: list[int]
    exact: bool
    error: float  # the worst distance from the true aggregate (the allowed interval), value units
    iterations: int
    missing: dict[int, str]


@dataclass
class SoakReport:
    epochs: list[EpochVerdict]
    in_store: list[int]  # the epochs the store holds (closed or pruned)
    open_in_store: list[int]
    results_published: int  # (epoch, node) results the nodes wrote to their files
    results_in_store: int  # ... of which the store holds
    soundness: float
    combined_consistent: bool
    # name, since, base epoch, base, end, and the anonymous part (the heap) at the base and the end
    rss: list[tuple[str, int, int | None, int | None, int | None, int | None, int | None]]
    store_bytes_max: int
    store_bytes_end: int
    late_values: list[int]
    faults: list[str]
    wall: float
    starts: Counter[str]  # how the nodes started the epochs they finished (:func:`_starts`)


def _reasons(lines: list[str]) -> dict[int, str]:
    """Epoch -> why the node missed it, from its printed lines."""
    out = {}
    for line in lines:
        found = re.match(r"node \d+: epoch (\d+): missed \((.*)\)$", line)
        if found:
            out[int(found.group(1))] = found.group(2)
    return out


def _starts(lines: list[str]) -> Counter[str]:
    """How the node started the epochs it finished (``warm``, ``fell back``, ``cold``; ``read``: warm
    from the output the others published), from its printed lines."""
    out: Counter[str] = Counter()
    for line in lines:
        found = re.match(
            r"node \d+: epoch \d+: output .* iterations, (warm|fell back|cold)( from the published)?", line
        )
        if found:
            out[found.group(1)] += 1
            out["read"] += found.group(2) is not None
    return out


def _components(present: list[int], edges: list[tuple[int, int]]) -> dict[int, set[int]]:
    """Node -> the nodes of its connected part among ``present`` (the aggregate it must reach)."""
    part = {i: {i} for i in present}
    for a, b in edges:
        if a in part and b in part and part[a] is not part[b]:
            merged = part[a] | part[b]
            for j in merged:
                part[j] = merged
    return part


def _listening(port: int) -> bool:
    with contextlib.closing(socket.socket()) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
