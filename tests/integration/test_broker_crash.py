"""A broker SIGKILLed mid-run (no persistence: every session, queue and retained message is gone) and
restarted on the same port: every node reconnects, republishes what its neighbours may have missed and
finishes with the simulator's numbers, without a manual restart.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from subprocess import DEVNULL, PIPE

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.runtime.brokers import free_port, mosquitto_binary
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.runtime.wire import XMsg, decode, split_x_batch, topics
from nlagg_node.sim import simulate

pytestmark = pytest.mark.mosquitto

ENTRY = (sys.executable, "-c", "from nlagg_node.cli import main; main()")
CFG = RunConfig(op="max", n=6, trials=1, record="all", t_max=400, seed=4, c=10.0, mu_z=30.0)


class Mosquitto:
    """A Mosquitto process this test may SIGKILL and start again on the same port (no persistence)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\npersistence false\n"
        )
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> None:
        exe = mosquitto_binary()
        assert exe is not None
        self.proc = await asyncio.create_subprocess_exec(
            exe, "-c", str(self.conf), stdout=DEVNULL, stderr=DEVNULL, start_new_session=True
        )
        async with asyncio.timeout(20):
            while True:
                try:
                    _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.02)
                    continue
                writer.close()
                return

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


@asynccontextmanager
async def mosquitto(workdir: Path) -> AsyncIterator[Mosquitto]:
    broker = Mosquitto(workdir)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def wait_for_iteration(url: str, run_id: str, t_min: int) -> None:
    """Return once some node has published an x of iteration ``t_min`` or later."""
    names = topics("nlagg", run_id)
    async with MqttTransport(url, client_id=f"watch-{run_id}", clean_session=True) as tr:
        await tr.subscribe(names.x("+"), names.x_batches)  # in-process, a host's x's come coalesced
        async for raw in tr.messages():
            batch = split_x_batch(raw.topic, raw.payload, "nlagg", run_id)
            msgs = (
                [it.msg for it in batch[0]]
                if batch is not None
                else [decode(raw.topic, raw.payload, "nlagg", run_id)[1]]
            )
            if any(isinstance(msg, XMsg) and msg.t >= t_min for msg in msgs):
                return


async def crash_and_restart(broker: Mosquitto, run_id: str) -> None:
    await wait_for_iteration(broker.url, run_id, CFG.t_max_value // 3)
    await broker.kill()
    await asyncio.sleep(0.5)
    await broker.start()


async def test_nodes_survive_a_broker_sigkill_in_process(tmp_path: Path) -> None:
    sim = simulate(CFG)
    values, edges = sim.values[0], run_edges(CFG)
    async with mosquitto(tmp_path) as broker, MqttTransport(broker.url, client_id="crash-host") as tr:
        nodes = [
            Node(CFG, i, values[i], tr, run_id="crash-ip", edges=edges, own_transport=False, corrupt=i == 2)
            for i in range(CFG.n)
        ]
        async with asyncio.TaskGroup() as tg:
            run = tg.create_task(host_nodes(nodes, tr, "nlagg", "crash-ip"))
            tg.create_task(crash_and_restart(broker, "crash-ip"))
        results: list[NodeResult] = run.result()
        assert tr.session_losses == 1  # the crash hit the run, and it went on
    ran = int(sim.phase_iterations[0].sum())  # max's certified stop, the simulator's iteration
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:ran, 0, :])
    assert np.array_equal(np.array([r.output for r in results]).ravel(), sim.output[0].ravel())


async def test_node_processes_survive_a_broker_sigkill(tmp_path: Path) -> None:
    sim = simulate(CFG)
    cfg_file = tmp_path / "run.json"
    cfg_file.write_text(json.dumps({"config": CFG.model_dump(mode="json")}))
    async with mosquitto(tmp_path) as broker:
        procs = [
            await asyncio.create_subprocess_exec(
                *ENTRY, "node", "--id", str(i), "--config", str(cfg_file),
                "--value", repr(float(sim.values[0][i])), "--broker", broker.url,
                "--run-id", "crash-p", "--seed", str(CFG.seed), "--json", stdout=PIPE, stderr=PIPE,
            )
            for i in range(CFG.n)
        ]  # fmt: skip
        try:
            await crash_and_restart(broker, "crash-p")
            async with asyncio.timeout(240):
                outs = [await proc.communicate() for proc in procs]
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    for proc, (stdout, stderr) in zip(procs, outs, strict=True):
        log = stderr.decode(errors="replace")
        assert proc.returncode == 0, log[-2000:]
        result = json.loads(stdout.decode().strip().splitlines()[-1])
        assert result["output"] == sim.output[0][result["node"]].ravel().tolist()
        assert "lost the session" in log


async def test_a_publish_while_the_broker_is_down_waits_for_it(tmp_path: Path) -> None:
    """A QoS 1 publish made while the connection is lost is queued and acknowledged once the broker
    is back (the epochs soak: a node's status publish during a broker restart used to raise
    paho's RuntimeError and end the node's process)."""
    async with mosquitto(tmp_path) as broker, MqttTransport(broker.url, client_id="watcher") as watcher:
        await watcher.subscribe("soak/#")
        async with MqttTransport(broker.url, client_id="publisher") as tr:
            await broker.kill()
            await asyncio.sleep(0.2)  # the loss is seen: paho is not connected
            sent = asyncio.create_task(tr.publish("soak/status", b"running", qos=1, retain=True))
            await asyncio.sleep(0.5)
            assert not sent.done()
            await broker.start()
            async with asyncio.timeout(30):
                await sent
                async for msg in watcher.messages():
                    assert (msg.topic, msg.payload) == ("soak/status", b"running")
                    break
