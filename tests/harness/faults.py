"""A testbed that can be hurt: kill/restart nodes, restart the broker, kill the eavesdropper, inject junk.

Used by ``tests/integration/test_faults.py`` and ``benchmarks/soak.py``. Everything runs as in a real
deployment: a private Mosquitto with persistence (stopped and started again on the same port), ``nlagg
eavesdrop`` and one ``nlagg node --state-dir`` process per node. :meth:`FaultBed.verdict` compares
the outcome with the simulator's trial of the same config and seed: every node's output, every x and
z^(0) in the transcript, and the corrupted nodes' forwarded states (one per iteration each).

Examples
--------
>>> async with FaultBed(cfg, tmp_path) as bed:                      # doctest: +SKIP
...     await bed.start_nodes()
...     await bed.wait_progress(0.4)
...     await bed.kill_node(2); await bed.restart_node(2)
...     verdict = await bed.finish()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from nlagg_node.argv import node_argv, this_python
from nlagg_node.config import RunConfig
from nlagg_node.lab.children import Child, start_eavesdropper
from nlagg_node.runtime.brokers import BrokerHandle, start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.wire import WireError, encode, split_x_batch, topics
from nlagg_node.sim.values import run_values
from tests.harness.verdict import Verdict, judge

__all__ = ["FaultBed", "hostile_messages"]


def hostile_messages(prefix: str, run_id: str, node: int, peer: int) -> list[tuple[str, bytes]]:
    """Garbage on the run's topics: every kind a node and the eavesdropper must reject, none accepted.

    ``node``/``peer`` are two neighbours. A second, different x for an iteration already taken is
    not among them: that is an equivocation, which ends the run (:mod:`nlagg_node.protocol.equivocation`).
    """
    t = topics(prefix, run_id)
    x = t.x(node)
    return [
        (x, b"{not json"),
        (x, b'{"v":2,"node":%d,"t":1,"phase":"max","x":1.0}' % node),
        (x, b'{"v":1,"node":%d,"t":1,"phase":"max","x":NaN}' % node),
        (x, b'{"v":1,"node":%d,"t":1,"phase":"max","x":1e999}' % node),
        (x, b'{"v":1,"node":%d,"t":1,"phase":"max","x":Infinity}' % node),
        (x, b'{"v":1,"node":%d,"t":0,"phase":"max","x":12345.5}' % peer),  # claims another sender
        (x, b'{"v":1,"node":%d,"t":0,"phase":"max","x":1.0,"extra":1}' % node),
        (x, b'{"v":1,"node":%d,"t":1,"phase":"max","x":"%s"}' % (node, b"9" * (1 << 20))),  # > 1 MiB
        (f"{t.base}/node/{node}/y", b'{"v":1}'),
        (f"{t.base}/nodes/{node}/x", b'{"v":1}'),
        (f"{t.base}/node/0{node}/x", b'{"v":1,"node":%d,"t":1,"phase":"max","x":1.0}' % node),
        (t.z0(peer, node), b'{"v":1,"from":%d,"to":%d,"group":"nope","z":1.0}' % (peer, node)),
        (t.status(node), b'{"v":1,"node":%d,"state":"sleeping"}' % node),
        (t.adv(node), b'{"v":1,"node":%d,"t":0,"s":1.0,"z":{},"z_in":{},"more":0}' % node),
    ]


class FaultBed:
    """One run of ``cfg`` (trial 0 of its seed) over a restartable private Mosquitto, with faults on demand.

    Parameters
    ----------
    cfg : the run; ``trials`` is forced to 1.
    workdir : broker files, node logs, checkpoints, transcript.
    corrupt : nodes that forward their state to the adversary.
    neighbour_timeout : seconds a node waits at a barrier (a killed neighbour must be back within it).
    """

    def __init__(
        self,
        cfg: RunConfig,
        workdir: Path,
        *,
        run_id: str = "faults",
        prefix: str = "nlagg",
        corrupt: set[int] | None = None,
        neighbour_timeout: float = 30.0,
    ) -> None:
        self.cfg = cfg.resolved().model_copy(update={"trials": 1})
        self.workdir = workdir
        self.run_id = run_id
        self.prefix = prefix
        self.corrupt = set(corrupt or set())
        self.neighbour_timeout = neighbour_timeout
        self.values = run_values(self.cfg, 1)[0]
        self.edges = run_edges(self.cfg)
        self.t_total = sum(int(p["t_len"]) for p in build_config_msg(self.cfg, run_id, self.edges).phases)
        self.db = workdir / "transcript.sqlite"
        self.nodes: dict[int, Child] = {}
        self.eavesdropper: Child | None = None
        self.broker: BrokerHandle | None = None
        self._broker_cm: AbstractAsyncContextManager[BrokerHandle] | None = None
        self.restarts: dict[str, int] = {"node": 0, "broker": 0, "eavesdropper": 0}
        self.gone: set[int] = set()  # nodes killed for good (they depart, issue 16)
        self._seen_x: set[tuple[str, int]] = set()  # (topic, t) of the x's published so far
        self._watcher: asyncio.Task[None] | None = None

    # Broker -----------------------------------------------------------------------------------
    async def _start_broker(self, port: int | None) -> None:
        bdir = self.workdir / "broker"
        bdir.mkdir(parents=True, exist_ok=True)
        cm = start_mosquitto(
            port=port,
            workdir=bdir,
            extra_lines=[
                "persistence true",
                f"persistence_location {bdir}/",
                "autosave_interval 0",
                # As root, Mosquitto drops to user 'mosquitto', which may not write into bdir.
                *(["user root"] if os.geteuid() == 0 else []),
            ],
        )
        self.broker = await cm.__aenter__()
        self._broker_cm = cm

    async def _stop_broker(self) -> None:
        cm, self._broker_cm = self._broker_cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)  # SIGTERM: Mosquitto saves its sessions and queues

    async def restart_broker(self, pause: float = 0.5) -> None:
        """Stop Mosquitto (it saves the persistent sessions), wait ``pause`` s, start it on the same port."""
        assert self.broker is not None
        port = self.broker.port
        await self._stop_broker()
        await asyncio.sleep(pause)
        await self._start_broker(port)
        self.restarts["broker"] += 1

    async def kill_broker(self, pause: float = 0.5) -> None:
        """SIGKILL Mosquitto (no persistence flush: sessions, queues and retained messages are gone),
        wait ``pause`` s, start it on the same port. The nodes must recover on their own."""
        assert self.broker is not None
        assert self.broker.pid is not None
        port = self.broker.port
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.broker.pid, signal.SIGKILL)
        await self._stop_broker()
        for stale in (self.workdir / "broker").glob("mosquitto.db*"):
            stale.unlink()  # what an earlier clean stop saved is not what a crash leaves
        await asyncio.sleep(pause)
        await self._start_broker(port)
        self.restarts["broker"] += 1

    @property
    def url(self) -> str:
        assert self.broker is not None
        return self.broker.url

    # Lifecycle --------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self._start_broker(None)
        cfg_msg = build_config_msg(self.cfg, self.run_id, self.edges)
        async with MqttTransport(self.url, client_id=f"nlagg-{self.run_id}-launcher") as tr:
            await tr.publish(topics(self.prefix, self.run_id).config, encode(cfg_msg), retain=True)
        self.cfg_path = self.workdir / "run-config.json"
        self.cfg_path.write_text(json.dumps({"config": self.cfg.model_dump(mode="json")}))
        await self.start_eavesdropper()
        ready = asyncio.Event()
        self._watcher = asyncio.create_task(self._watch(ready))
        async with asyncio.timeout(30):
            await ready.wait()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        for proc in [*self.nodes.values(), *([self.eavesdropper] if self.eavesdropper else [])]:
            await proc.kill()
        await self._stop_broker()

    # Eavesdropper -----------------------------------------------------------------------------
    async def start_eavesdropper(self) -> None:
        """``nlagg eavesdrop`` (same client id every time: the broker keeps its session)."""
        log = self.workdir / "eavesdropper.log"
        self.eavesdropper = await start_eavesdropper(
            self.url, self.run_id, self.prefix, self.db, log=log, verbose=True
        )

    async def kill_eavesdropper(self) -> None:
        assert self.eavesdropper is not None
        await self.eavesdropper.kill()

    async def restart_eavesdropper(self) -> None:
        await self.kill_eavesdropper()
        await self.start_eavesdropper()
        self.restarts["eavesdropper"] += 1

    # Nodes ------------------------------------------------------------------------------------
    def node_command(self, i: int) -> list[str]:
        return node_argv(
            i,
            str(self.cfg_path),
            self.url,
            value=float(self.values[i]),
            run_id=self.run_id,
            prefix=self.prefix,
            neighbour_timeout=self.neighbour_timeout,
            seed=self.cfg.seed,
            state_dir=str(self.workdir / "state"),
            as_json=True,
            corrupt=i in self.corrupt,
            program=this_python(),
        )

    async def start_nodes(self) -> None:
        for i in range(self.cfg.n):
            self.nodes[i] = await Child.start(self.node_command(i), log=self.workdir / f"node-{i}.log")

    async def kill_node(self, i: int) -> None:
        """SIGKILL: no clean disconnect, no last words (the broker publishes the will)."""
        await self.nodes[i].kill()

    async def kill_for_good(self, i: int) -> None:
        """SIGKILL, never restarted: its neighbours count it as departed and finish without it."""
        await self.nodes[i].kill()
        self.gone.add(i)

    async def restart_node(self, i: int) -> None:
        """The same command again: it resumes from its checkpoint."""
        self.nodes[i] = await Child.start(self.node_command(i), log=self.workdir / f"node-{i}.log")
        self.restarts["node"] += 1

    async def inject(self, messages: list[tuple[str, bytes]]) -> None:
        async with MqttTransport(self.url, client_id=f"nlagg-{self.run_id}-intruder") as tr:
            for topic, payload in messages:
                await tr.publish(topic, payload, qos=1)

    async def progress(self) -> float:
        """Fraction of the run's x messages the nodes have published (0..1), as a live subscriber
        sees them. Not the transcript's count: under load the capture lags far behind the nodes, and
        a fault meant for a running network could then hit one whose nodes have all finished."""
        return len(self._seen_x) / (self.cfg.n * self.t_total)

    async def _watch(self, ready: asyncio.Event) -> None:
        names = topics(self.prefix, self.run_id)
        client = f"nlagg-{self.run_id}-watcher"
        async with MqttTransport(self.url, client_id=client, clean_session=True) as tr:
            await tr.subscribe(names.x("+"), names.x_batches, qos=0)  # a host's x's come coalesced
            ready.set()
            async for msg in tr.messages():
                with contextlib.suppress(ValueError, KeyError, TypeError, WireError):
                    batch = split_x_batch(msg.topic, msg.payload, self.prefix, self.run_id)
                    if batch is not None:
                        self._seen_x.update((it.topic, it.msg.t) for it in batch[0])
                    else:
                        self._seen_x.add((msg.topic, int(json.loads(msg.payload)["t"])))

    async def wait_progress(self, fraction: float, within: float = 120.0) -> None:
        """Wait until the nodes have published ``fraction`` of the run's x's (fails after ``within`` s)."""
        async with asyncio.timeout(within):
            while await self.progress() < fraction:
                if self._watcher is not None and self._watcher.done():
                    self._watcher.result()  # raises what ended it
                    raise RuntimeError("the x watcher stopped before the run's end")
                if any(p.returncode not in (None, 0) for p in self.nodes.values()):
                    return  # a node died on its own: finish() reports it
                await asyncio.sleep(0.02)

    # Outcome ----------------------------------------------------------------------------------
    async def finish(self, within: float = 180.0) -> Verdict:
        """Wait for every node and the eavesdropper, then compare with the simulator."""
        results: dict[int, dict[str, Any]] = {}
        detail: list[str] = []
        try:
            async with asyncio.timeout(within):
                for i, proc in self.nodes.items():
                    rc = await proc.wait()
                    if i in self.gone:
                        continue
                    if rc != 0:
                        detail.append(f"node {i} exited with {rc}")
                    elif proc.events:
                        results[i] = proc.events[-1]
                if self.eavesdropper is not None:
                    if detail:  # a node failed: the capture cannot complete, stop it
                        await self.eavesdropper.kill()
                    else:
                        await self.eavesdropper.wait()
        except TimeoutError:
            detail.append(f"not finished within {within:g} s")
        return self.verdict(results, detail)

    def verdict(self, results: dict[int, dict[str, Any]], detail: list[str]) -> Verdict:
        """Against the simulator's run; with nodes killed for good, the one with the departures the
        survivors report (``departed`` of their results). A transcript that lacks messages comes
        with the capture's own account: how it ended, and its log's warnings (its reconnections)."""
        finished = (self.eavesdropper.last_event("finished") if self.eavesdropper else None) or {}
        verdict = judge(
            self.cfg, self.db, results, detail, eavesdropper=finished, corrupt=self.corrupt, gone=self.gone
        )
        if verdict.lost:
            verdict.detail.extend(self._capture_account(finished))
        return verdict

    def _capture_account(self, finished: dict[str, Any]) -> list[str]:
        if self.eavesdropper is None:
            return ["no eavesdropper ran"]
        if not finished:
            head = f"the eavesdropper ended without its summary (exit code {self.eavesdropper.returncode})"
        else:
            missing = {k: finished.get(k) for k in ("missing_x", "missing_z0", "missing_adv")}
            head = f"the eavesdropper stopped with complete={finished.get('complete')}, missing {missing}"
        log = self.workdir / "eavesdropper.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        warnings = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
        return [head, *[f"eavesdropper.log: {line}" for line in warnings[-20:]]]
