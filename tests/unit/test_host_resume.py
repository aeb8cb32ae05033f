"""The in-process host with checkpoints: killed mid-run and restarted, it ends with the simulator's x's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.runtime.checkpoint import CheckpointStore
from nlagg_node.runtime.hosted import host_nodes
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.sim import simulate
from tests.harness.crash import crash_when

RUN = "host-resume"


@pytest.mark.parametrize(
    ("params", "crash_after"),
    [
        pytest.param({"op": "trimmed-mean", "k": 1, "t_max": 80, "avg_t_max": 60}, 120, id="trimmed-mean"),
        pytest.param(
            {"op": "topk", "k": 2, "t_max": 1500, "early_stop": True, "stop_window": 20},
            300,
            id="topk-early-stop",
        ),
        pytest.param(
            {"op": "topk", "k": 2, "t_max": 1500, "early_stop": True, "stop_window": 20},
            700,
            id="topk-early-stop-2",
        ),
        pytest.param(
            {"op": "max", "t_max": 3000, "stop_window": 20}, 250, id="max-certified"
        ),  # candidates from t = 244, the certified stop at 271
    ],
)
async def test_checkpointed_host_resumes_bit_for_bit(
    params: dict[str, Any], crash_after: int, tmp_path: Path
) -> None:
    """The host is cancelled mid-run (trimmed mean: in its second dual group; top-K with early
    stopping: in its first phase, or in its second after the first stopped early; max: while its
    nodes' candidates spread) and restarted."""
    cfg = RunConfig(n=7, trials=1, record="all", seed=3, **params)
    sim = simulate(cfg)
    # The x's each node published: every phase up to its stop.
    starts = np.cumsum([0] + [p.t_len for p in sim.phases])
    runs = [sim.recorded_x[s : s + r, 0, :] for s, r in zip(starts, sim.phase_iterations[0], strict=False)]
    expected = np.concatenate(runs)
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
        stores = [nd.store for nd in nodes if nd.store is not None]
        await crash_when(run, lambda: min(st.writes for st in stores) >= crash_after)
    async with MemoryTransport(broker, "host-2") as tr:
        nodes = build(tr)
        assert all(nd.resumed is not None for nd in nodes)
        results: list[NodeResult] = await host_nodes(nodes, tr, "nlagg", RUN)
    assert np.array_equal(np.array([r.x for r in results]).T, expected)
    assert all(r.iterations == sim.phase_iterations[0].sum() and r.rejected == 0 for r in results)
    assert np.array_equal(np.array([r.output for r in results]).reshape(sim.output[0].shape), sim.output[0])
