"""The in-process host with checkpoints: killed mid-run and restarted, it ends with the simulator's x's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.runtime.checkpoint import CheckpointStore
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.sim import simulate

RUN = "host-resume"


async def test_checkpointed_host_resumes_bit_for_bit(tmp_path: Path) -> None:
    """Trimmed mean (three dual groups); the host is cancelled in the second group."""
    cfg = RunConfig(op="trimmed-mean", n=7, k=1, trials=1, record="all", t_max=80, avg_t_max=60, seed=3)
    sim = simulate(cfg)
    values = sim.values[0]
    edges = run_edges(cfg)
    broker = MemoryBroker()

    def build(tr: MemoryTransport) -> list[Node]:
        return [
            Node(
                cfg, i, values[i], tr, run_id=RUN, edges=edges, own_transport=False,
                checkpoint=CheckpointStore(tmp_path, RUN, i),
            )
            for i in range(cfg.n)
        ]  # fmt: skip

    async with MemoryTransport(broker, "host-1") as tr:
        nodes = build(tr)
        run = asyncio.create_task(host_nodes(nodes, tr, "nlagg", RUN))
        async with asyncio.timeout(120):
            while True:
                if run.done() or min(nd.store.writes for nd in nodes if nd.store is not None) >= 120:
                    break
                await asyncio.sleep(0.005)
        assert not run.done()  # the crash hits a running network
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    async with MemoryTransport(broker, "host-2") as tr:
        nodes = build(tr)
        assert all(nd.resumed is not None for nd in nodes)
        results: list[NodeResult] = await host_nodes(nodes, tr, "nlagg", RUN)
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    assert np.array_equal(np.array([r.output for r in results]).reshape(sim.output[0].shape), sim.output[0])
