"""Warm starts in the node runtime over the in-memory transport (docs/continuous.md, "Warm starts"):
drifting values run warm and exact in fewer iterations, a jump beyond the drift falls back to a cold
rerun and stays exact, a node that missed an epoch runs the next warm from the output the others
published, and a warm run is the simulator's warm epoch bit for bit."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.epochplan import WARM_GAP, HeardOutput, epoch_start, published_output, walk_values
from nlagg_node.errors import ConfigError
from nlagg_node.runtime.epochdriver import EpochClock, EpochOutcome, run_epoch, run_epochs
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import node_will, run_edges
from nlagg_node.runtime.outputs import EpochOutput, results_topic
from nlagg_node.runtime.result import NodeResult
from nlagg_node.sim.engine import EpochInputs, simulate
from nlagg_node.sim.multiepoch import simulate_epochs
from nlagg_node.valuemap import scale_for
from nlagg_node.warm import warm_start
from tests.harness.load import contention, stretched

PREFIX, RUN = "farm", "greenhouse"
RANGE = (0.0, 40.0)
DRIFT = 0.005  # of the range: 0.2 value units per epoch
CFG = RunConfig(op="max", n=5, graph="complete", may_depart=True, seed=3, value_range=RANGE)


def walk(epochs: int, n: int, jump_at: int | None = None) -> np.ndarray:
    """Values that drift by at most DRIFT of the range per epoch (pinned); from ``jump_at`` on every
    value is 8 units (40 drifts) higher."""
    rng = np.random.default_rng(11)
    steps = rng.uniform(-1.0, 1.0, (epochs, n)) * DRIFT * (RANGE[1] - RANGE[0])
    steps[0] = rng.uniform(10.0, 30.0, n)
    values = np.cumsum(steps, axis=0)
    if jump_at is not None:
        values[jump_at:] += 8.0
    return values


async def deployment(
    cfg: RunConfig,
    values: np.ndarray,
    drift: float | None,
    missing: dict[int, int] | None = None,
    period: float = 4.0,
    broker: MemoryBroker | None = None,
    seed: int | Literal["config"] | None = None,
) -> list[list[EpochOutcome]]:
    """Every node runs ``len(values)`` epochs; node j of ``missing`` {j: k} cannot read its value in k;
    ``seed``: the nodes' (None: OS entropy; ``"config"``: the run's, the simulator's streams).

    A node sitting an epoch out listens until the next epoch's join window: ``period`` leaves the
    run time to finish before then (all nodes share one Python thread here), stretched with the
    join window by the machine's contention, as a cold epoch overran 4 s on a busy machine."""
    edges = run_edges(cfg)
    broker = MemoryBroker() if broker is None else broker
    load = contention()
    clock = EpochClock(
        origin=time.time() + 0.2,
        period=stretched(period, load),
        epochs=len(values),
        join=stretched(1.2, load),
    )

    async def node(i: int) -> list[EpochOutcome]:
        async def value_for(k: int) -> float:
            if (missing or {}).get(i) == k:
                raise ConfigError("value", "sensor", "no reading")
            return float(values[k, i] / RANGE[1])  # protocol units

        async def transport_for(k: int, run: str) -> MemoryTransport:
            return MemoryTransport(broker, f"n{i}", will=node_will(f"{PREFIX}/{RUN}", run, i, shared=True))

        out = run_epochs(
            cfg,
            i,
            value_for,
            transport_for,
            clock,
            deployment=(PREFIX, RUN),
            to_user=lambda x: x * RANGE[1],
            drift=drift,
            edges=edges,
            seed=seed,
        )
        return [o async for o in out]

    return list(await asyncio.gather(*(node(i) for i in range(cfg.n))))


def outputs(runs: list[list[EpochOutcome]], k: int) -> list[float]:
    got = []
    for r in runs:
        o = next(o for o in r if o.epoch == k)
        if o.output is not None:
            assert isinstance(o.output.output, float)
            got.append(o.output.output)
    return got


def iterations(runs: list[list[EpochOutcome]], k: int) -> int:
    return max(o.output.iterations for r in runs for o in r if o.epoch == k and o.output is not None)


TOL = CFG.tolerance * (RANGE[1] - RANGE[0]) * 10


class RetainLog(MemoryBroker):
    """A broker that remembers every topic a retained message (a clear too) was published on."""

    def __init__(self) -> None:
        super().__init__()
        self.retained_topics: set[str] = set()

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        if retain:
            self.retained_topics.add(topic)
        super().route(topic, payload, retain)


def retained_of(n: int) -> set[str]:
    """The retained topics a deployment's nodes touch, however many epochs and reruns: each node's
    status on the topic every epoch shares, and its results (Mosquitto never frees a topic level)."""
    return {f"{PREFIX}/{RUN}/node/{i}/status" for i in range(n)} | {
        results_topic(PREFIX, RUN, i) for i in range(n)
    }


def test_drifting_values_run_warm_exact_and_in_fewer_iterations() -> None:
    values = walk(4, CFG.n)
    broker = RetainLog()
    warm = asyncio.run(deployment(CFG, values, DRIFT, broker=broker))
    assert broker.retained_topics == retained_of(CFG.n)
    cold = asyncio.run(deployment(CFG, values, None))
    for k in range(4):
        assert outputs(warm, k) == pytest.approx([values[k].max()] * CFG.n, abs=TOL)
        assert [o.start for r in warm for o in r if o.epoch == k] == ["cold" if k == 0 else "warm"] * CFG.n
    for k in range(1, 4):
        assert iterations(warm, k) < iterations(cold, k)


def test_a_jump_beyond_the_drift_reruns_the_epoch_cold_and_stays_exact() -> None:
    values = walk(3, CFG.n, jump_at=2)
    broker = RetainLog()
    runs = asyncio.run(deployment(CFG, values, DRIFT, broker=broker))
    assert [o.start for r in runs for o in r if o.epoch == 2] == ["fell back"] * CFG.n
    assert broker.retained_topics == retained_of(CFG.n)  # the rerun's too
    assert outputs(runs, 2) == pytest.approx([values[2].max()] * CFG.n, abs=TOL)


@pytest.mark.parametrize("jump_at", [None, 2], ids=["drifting", "then-a-jump"])
def test_a_node_that_missed_an_epoch_runs_the_next_warm_from_the_published_output(
    jump_at: int | None,
) -> None:
    values = walk(4, CFG.n, jump_at)
    late = int(np.argmin(values[1]))
    runs = asyncio.run(deployment(CFG, values, DRIFT, {late: 1}))
    assert runs[late][1].start == "missed"
    back = runs[late][2]  # it holds no output of epoch 1: it reads the one the others published
    assert back.read is not None
    assert back.read.output == pytest.approx(values[1][np.arange(CFG.n) != late].max(), abs=TOL)
    assert [r[2].start for r in runs] == ["warm" if jump_at is None else "fell back"] * CFG.n
    assert {r[3].start for r in runs} == {"warm"}
    for k in range(4):
        present = [i for i in range(CFG.n) if not (i == late and k == 1)]
        assert outputs(runs, k) == pytest.approx([values[k, present].max()] * len(present), abs=TOL)


@pytest.mark.parametrize("op", ["max", "median"], ids=["max", "median"])
def test_a_warm_run_is_the_simulators_warm_epoch_bit_for_bit(op: str) -> None:
    cfg = CFG.model_copy(update={"op": op, "trials": 1})
    values = walk(2, cfg.n)
    last = float(values[0].max() if op == "max" else np.median(values[0]))
    ws = warm_start(op, last, drift=DRIFT, c=cfg.c_value, sigma_z=cfg.sigma_z_value, value_range=RANGE)
    warm_cfg = cfg.model_copy(update={"c": ws.c})
    used = np.array([ws.used_value(v / RANGE[1], 0.5) for v in values[1]])
    sim = simulate(warm_cfg, epoch=EpochInputs(0, values[1][None], (ws.init,), used[None]))
    broker, edges = MemoryBroker(), run_edges(cfg)

    async def node(i: int) -> NodeResult:
        transport = MemoryTransport(broker, f"n{i}")
        result, _, _ = await run_epoch(
            warm_cfg,
            i,
            float(used[i]),
            transport,
            deployment=(PREFIX, RUN),
            epoch=1,
            join_by=time.time() + 5.0,
            record=lambda r: EpochOutput(node=r.node, epoch=1, output=0.0, iterations=0, time=0.0),
            edges=edges,
            first_init=ws.init,
        )
        return result

    async def everyone() -> list[NodeResult]:
        return list(await asyncio.gather(*(node(i) for i in range(cfg.n))))

    results = asyncio.run(everyone())
    assert [scale_for(cfg).user_float(r.output[0]) for r in results] == sim.output.ravel().tolist()
    assert {r.iterations for r in results} == {int(sim.phase_iterations.sum())}


@pytest.mark.parametrize(
    ("op", "jump_at"),
    [("max", None), ("median", None), ("max", 2)],
    ids=["max-certified", "median-shells", "max-falls-back"],
)
def test_a_deployment_of_epochs_is_the_simulators_epochs_of_one_trial_bit_for_bit(
    op: str, jump_at: int | None
) -> None:
    """One epoch planner (nlagg_node.epochplan): the walk, warm starts, shells, reruns and streams
    of ``nlagg testbed --epochs K`` are ``nlagg sim --epochs K --trials 1``'s."""
    cfg = CFG.model_copy(update={"op": op, "trials": 1})
    epochs = 3
    values = walk_values(cfg, epochs, DRIFT)[:, 0]
    if jump_at is not None:
        values[jump_at:] = np.minimum(values[jump_at:] + 8.0, RANGE[1])
    sim = simulate_epochs(cfg, epochs, DRIFT, values=values[:, None, :])
    runs = asyncio.run(deployment(cfg, values, DRIFT, period=6.0, seed="config"))
    starts = [
        ["fell back" if sim.fell_back[k, 0] else "warm" if k else "cold"] * cfg.n for k in range(epochs)
    ]
    assert [[r[k].start for r in runs] for k in range(epochs)] == starts
    node_0 = [runs[0][k].output for k in range(epochs)]  # a tolerance stop's outputs differ by node
    assert [None if o is None else o.output for o in node_0] == sim.output[:, 0].tolist()
    assert [iterations(runs, k) for k in range(epochs)] == sim.iterations[:, 0].tolist()
    shells = [  # nodes that ran a shell value in a warm epoch
        i
        for k in range(1, epochs)
        for i, v in enumerate(values[k])
        if (ws := epoch_start(cfg, k, HeardOutput(k - 1, float(sim.output[k - 1, 0])), DRIFT).warm)
        and not ws.in_band(scale_for(cfg).protocol_float(float(v)))
    ]
    assert bool(shells) == (op == "median" or jump_at is not None)
    assert sim.fell_back[:, 0].tolist() == [k == jump_at for k in range(epochs)]


@pytest.mark.parametrize(
    ("held", "drift"),
    [
        (HeardOutput(11, 24.0), DRIFT),
        (HeardOutput(9, 24.0), 3 * DRIFT),
        (HeardOutput(12 - WARM_GAP, 24.0), WARM_GAP * DRIFT),
        (HeardOutput(11 - WARM_GAP, 24.0), None),
        (HeardOutput(12, 24.0), None),
        (HeardOutput(11, None), None),
        (None, None),
    ],
    ids=["epoch-before", "older", "oldest", "too-old", "same-epoch", "top-k", "nothing"],
)
def test_a_published_output_up_to_the_gap_back_starts_warm_with_the_drift_of_the_epochs_between(
    held: HeardOutput | None, drift: float | None
) -> None:
    got = epoch_start(CFG, 12, held, DRIFT)
    assert (None if got.warm is None else got.warm.drift) == (None if drift is None else pytest.approx(drift))


def test_an_epoch_no_node_finished_is_bridged_warm_from_the_one_before() -> None:
    values = walk(3, CFG.n)
    runs = asyncio.run(deployment(CFG, values, DRIFT, dict.fromkeys(range(CFG.n), 1)))
    assert {r[1].start for r in runs} == {"missed"}
    assert {r[2].start for r in runs} == {"warm"}  # from epoch 0's output, with twice the drift
    assert outputs(runs, 2) == pytest.approx([values[2].max()] * CFG.n, abs=TOL)


@pytest.mark.parametrize(
    ("published", "output"),
    [
        ([], None),
        ([3.0], None),  # one record: it could be a forger's (issue 43, break 6), cold
        ([3.0, -99.0], None),  # two: the lower middle would be the forger's, cold
        ([3.0, 3.0 + 1e-12, 3.0], 3.0),
        ([3.0, 99.0, 3.0 - 1e-12], 3.0),
        ([3.0, -99.0, 3.0 + 1e-12], 3.0),
    ],
    ids=["none", "one", "two", "within-tolerance", "one-false-record-above", "one-false-record-below"],
)
def test_the_published_output_is_the_median_of_a_quorum_of_records(
    published: list[float], output: float | None
) -> None:
    assert published_output(published, n=6) == output
