"""One run, three drivers: the simulator, the node loop (in-memory transport) and the adversary's replay.

Each scenario runs ``simulate`` and the networked nodes over one in-memory broker, with the
eavesdropper capturing the transcript and replaying it live. Step by step they must agree: every
node's x at every iteration it ran (the nodes' own records, the captured x's and the simulator's
trajectory), where each node stopped each phase (the simulator's counts, the nodes' and the
replay's stops learned from the x's fields), the departures, the finals, and the exposures the
replay finds against the simulator's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from adversary.capture.eavesdropper import Eavesdropper
from adversary.simulated import trial_x
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import NodeResult, build_config_msg, run_edges
from nlagg_node.runtime.wire import encode, topics
from nlagg_node.sim import SimResult, simulate
from tests.harness.departures import RUN, run_with_departures


@dataclass(frozen=True)
class Scenario:
    op: str
    early_stop: bool
    t_max: int
    departures: dict[int, int]
    extra: tuple[tuple[str, object], ...] = ()

    def config(self) -> RunConfig:
        return RunConfig.model_validate(
            {
                "op": self.op, "n": 7, "graph": "rgg", "trials": 1, "record": "all", "seed": 11,
                "t_max": self.t_max, "early_stop": self.early_stop,
                "may_depart": self.early_stop and bool(self.departures), **dict(self.extra),
            }
        )  # fmt: skip


SCENARIOS = [
    pytest.param(Scenario("max", False, 60, {}), id="max-fixed"),
    pytest.param(Scenario("max", True, 2000, {}), id="max-early-stop"),
    pytest.param(Scenario("median", False, 80, {2: 30}), id="median-fixed-departure"),
    pytest.param(Scenario("max", True, 2000, {3: 40}), id="max-early-stop-departure"),
    pytest.param(Scenario("topk", False, 40, {}, (("k", 2),)), id="topk-fixed"),
    pytest.param(Scenario("topk", True, 1500, {}, (("k", 2),)), id="topk-early-stop"),
    pytest.param(Scenario("trimmed-mean", True, 1500, {}), id="trimmed-mean-early-stop"),
]


async def drive(
    cfg: RunConfig, departures: dict[int, int], db: Path
) -> tuple[list[NodeResult], Eavesdropper]:
    """The nodes over one in-memory broker, captured by an eavesdropper that replays live."""
    broker = MemoryBroker()
    async with MemoryTransport(broker, "launcher") as launcher:
        config = build_config_msg(cfg, RUN, run_edges(cfg))
        await launcher.publish(topics("nlagg", RUN).config, encode(config), retain=True)
    eve = MemoryTransport(broker, "eve")
    await eve.connect()
    with Transcript(db, run_id=RUN) as transcript:
        eaves = Eavesdropper(eve, transcript, complete_grace=0.5)
        task = asyncio.create_task(eaves.run())
        await eaves.subscribed.wait()
        results = await run_with_departures(cfg, departures, killed=False, broker=broker)
        async with asyncio.timeout(30):
            await task
    await eve.close()
    return results, eaves


def expected_x(sim: SimResult, departures: dict[int, int]) -> np.ndarray:
    """The simulator's x's as ``(n, T)``, NaN where a node published nothing (stopped or departed)."""
    x = trial_x(sim, 0)
    for j, t in sim.departures_of(0).items():
        x[j, t:] = np.nan
    return x


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_the_three_drivers_agree_step_by_step(scenario: Scenario, tmp_path: Path) -> None:
    cfg = scenario.config()
    sim = simulate(cfg, departures=scenario.departures)
    db = tmp_path / "run.sqlite"
    results, eaves = await drive(cfg, scenario.departures, db)
    happened = sim.departures_of(0)
    x = expected_x(sim, scenario.departures)
    # The node loop: every x it ran, and where it stopped, as the simulator.
    ran = sim.node_iterations[0].sum(axis=1)
    for r in results:
        mine = x[r.node][np.isfinite(x[r.node])]
        if r.node in happened:
            assert r.left_at == happened[r.node]
            continue
        assert r.iterations == ran[r.node]
        assert np.array_equal(r.x, mine)
        assert np.array_equal(np.ravel(r.output), np.ravel(sim.output[0, r.node]))
    # The transcript holds exactly those x's, no more.
    with Transcript.open_read_only(db) as tr:
        assert np.array_equal(tr.x(cfg.n, x.shape[1]), x, equal_nan=True)
    # The replay: the same departures and stops, and the simulator's exposures.
    replay = eaves.replay
    assert replay is not None
    assert (eaves.missing, eaves.rejected) == ((0, 0), 0)
    assert replay.departed == happened
    if cfg.early_stop:  # each node's stop in each phase that ended early, from its x's fields
        starts = np.cumsum([0] + [p.t_len for p in sim.phases]).tolist()
        for p, halted in enumerate(replay.halted):
            last = starts[p + 1] - 1  # a phase run to its end needs no stop
            early = {i: int(starts[p] + sim.node_iterations[0, i, p]) - 1 for i in range(cfg.n)}
            assert {i: t for i, t in halted.items() if t < last} == {
                i: t for i, t in early.items() if t < last and i not in happened
            }
        assert any(replay.halted)
    assert np.array_equal(replay.result().first, sim.first_match[0])
