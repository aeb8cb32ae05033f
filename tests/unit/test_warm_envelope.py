"""Bounded influence over warm-started epochs: the envelope of a warm epoch's configuration
(:func:`nlagg_node.epochplan.epoch_config`, what the nodes and a continuous capture judge
with) holds every honest x of the warm run, its z^(0) drawn from the warm start.

The simulator runs the warm epochs (the same math as every runtime) with pinned seeds and last
outputs spread over the declared range, near its ends too (a median's prior far from the range's
midpoint, a max's start near the top); the envelope is a proven bound: the ratio must stay below 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node.config import RunConfig
from nlagg_node.epochplan import HeardOutput, epoch_config
from nlagg_node.protocol import RunShape
from nlagg_node.rng import rng_for
from nlagg_node.sim import simulate
from nlagg_node.sim.engine import EpochInputs
from nlagg_node.valuemap import scale_for
from nlagg_node.warm import warm_start

RANGE = (0.0, 100.0)
TRIALS = 12


@pytest.mark.parametrize("drift", [0.005, 0.1], ids=["drift-0.005", "drift-0.1"])
@pytest.mark.parametrize("op", ["max", "min", "median"])
def test_no_honest_warm_x_leaves_the_envelope_of_the_epochs_config(op: str, drift: float) -> None:
    cfg = RunConfig(op=op, n=15, trials=TRIALS, seed=2, record="all", value_range=RANGE).resolved()
    rng = rng_for(cfg.seed, "test", "warm-envelope")
    values = rng.uniform(*RANGE, (TRIALS, cfg.n))
    last = np.linspace(0.5, 99.5, TRIALS)  # the previous outputs, over the whole range
    starts = [
        warm_start(op, float(y), drift=drift, c=cfg.c_value, sigma_z=cfg.sigma_z_value, value_range=RANGE)
        for y in last
    ]
    proto = np.asarray(scale_for(cfg).to_protocol(values), dtype=np.float64)
    u = rng.random(proto.shape)
    used = np.array(
        [
            [ws.used_value(float(v), float(w)) for v, w in zip(row, us, strict=True)]
            for ws, row, us in zip(starts, proto, u, strict=True)
        ]
    )
    inputs = EpochInputs(1, values, tuple(ws.init for ws in starts), used)
    res = simulate(cfg.model_copy(update={"c": starts[0].c}), epoch=inputs)
    worst = 0.0
    for b in range(TRIALS):
        run_cfg = epoch_config(cfg, 1, HeardOutput(0, float(last[b])), drift)
        assert run_cfg.c_value == starts[b].c
        env = RunShape(run_cfg, res.graphs[b]).envelope
        assert env is not None
        phase = np.searchsorted(np.asarray(env.schedule.starts), res.recorded_t, side="right") - 1
        radius = np.asarray(env.radius)[phase][:, None] * np.asarray(env.scale)[None, :]
        x = res.recorded_x[:, b, :]
        beyond = np.maximum(x - env.s_hi, env.s_lo - x)
        worst = max(worst, float(np.nanmax(beyond / radius)))
    assert worst < 1.0, f"an honest warm x lay {worst:.3g} radii beyond the values' range"


@pytest.mark.parametrize("op", ["max", "min", "median", "quantile"])
def test_a_warm_epochs_config_describes_its_init_and_a_rerun_runs_cold(op: str) -> None:
    cfg = RunConfig(op=op, n=15, value_range=RANGE, seed=2)
    held = HeardOutput(0, 3.0)  # near the range's low end
    warm = epoch_config(cfg, 1, held, 0.01)
    ws = warm_start(op, 3.0, drift=0.01, c=cfg.c_value, sigma_z=cfg.sigma_z_value, value_range=RANGE)
    init = RunShape(warm, np.array([[0, 1]])).phases[0].init
    if op in ("median", "quantile"):
        same = ("kind", "sigma_z", "c", "prior_median")  # the prior at the last output: the warm init
        assert [getattr(init, f) for f in same] == [getattr(ws.init, f) for f in same]
        assert init.mean_per_sign() == ws.init.mean_per_sign()
    else:  # one-sided: the config's init bounds the warm init's dual means (docs/protocol.md)
        assert init.mu_z >= abs(ws.init.mean_per_sign() + ws.c / 2.0)
    assert epoch_config(cfg, 1, held, 0.01, rerun=True) == cfg.resolved()
    assert epoch_config(cfg, 0, None, 0.01) == cfg.resolved()  # epoch 0 runs cold
    assert epoch_config(cfg, 1, HeardOutput(0, None), 0.01) == cfg.resolved()  # no output of k-1
    assert epoch_config(cfg, 1, held, None) == cfg.resolved()  # --cold-start
