"""Early stopping (issue 15) on Mosquitto: the nodes stop where the simulator does (the rule itself:
tests/unit/test_termination.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adversary.simulated import simulate_transcript
from adversary.transcript import Transcript
from nlagg_node import load_config, simulate
from nlagg_node.lab.testbed import run_testbed

WINDOW = 20


@pytest.mark.mosquitto
@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"op": "max", "t_max": 3000}, id="max"),
        pytest.param({"op": "topk", "k": 2, "t_max": 2500}, id="topk"),
        pytest.param(
            {"op": "max", "t_max": 3000, "tolerance": 1e-6, "stop_rule": "tolerance"}, id="max-to-1e-6"
        ),
    ],
)
async def test_testbed_stops_where_the_simulator_does(
    params: dict[str, Any], mosquitto_url: str, tmp_path: Path
) -> None:
    """The nodes on Mosquitto publish the simulator's x's bit for bit and stop at its iteration."""
    cfg = load_config(n=8, trials=1, seed=21, early_stop=True, stop_window=WINDOW, **params)
    summary = await run_testbed(cfg, broker_url=mosquitto_url, in_process=True, out_dir=tmp_path)
    sim = simulate(cfg.model_copy(update={"record": "all"}))
    with Transcript(tmp_path / "transcript.sqlite") as tr:
        x = tr.x(cfg.n, sim.t_total)
    start = 0
    for p, phase in enumerate(sim.phases):
        ran = int(sim.phase_iterations[0, p])
        seg = x[:, start : start + phase.t_len]
        np.testing.assert_array_equal(seg[:, :ran], sim.recorded_x[start : start + ran, 0].T)
        assert np.isnan(seg[:, ran:]).all()  # nothing published after the stop
        start += phase.t_len
    assert sim.phase_iterations[0].sum() < sim.t_total
    assert summary["iterations"] == sim.phase_iterations[0].sum()
    assert summary["exact"]  # within the run's tolerance
    assert summary["tolerance"] == cfg.tolerance
    if cfg.tolerance > 1e-9:  # a looser precision stops sooner, and ends farther than 1e-9 away
        precise = simulate(cfg.model_copy(update={"tolerance": 1e-9}))
        assert sim.phase_iterations[0].sum() < precise.phase_iterations[0].sum()
        assert np.abs(sim.output[0] - sim.truth_lo[0]).max() > 1e-9
    finals = np.array([summary["final_x"][str(i)] for i in range(cfg.n)]).reshape(sim.output[0].shape)
    np.testing.assert_array_equal(finals, sim.output[0])
    # nlagg sim --transcript writes the same x messages, byte for byte (quiet counters and stops too)
    simulate_transcript(cfg, tmp_path / "sim.sqlite")
    assert _x_payloads(tmp_path / "sim.sqlite") == _x_payloads(tmp_path / "transcript.sqlite")


def _x_payloads(path: Path) -> list[tuple[str, bytes]]:
    """Every valid x message of a transcript file: (node/i/x, payload), sorted."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT topic, payload FROM messages WHERE valid = 1 AND kind = 'x'").fetchall()
    return sorted(("/".join(str(t).split("/")[-3:]), bytes(p)) for t, p in rows)
