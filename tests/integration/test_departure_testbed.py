"""Departures on a real Mosquitto: ``nlagg testbed --depart`` kills node processes; the survivors end
with their own aggregate, as the simulator (in-process: tests/unit/test_departure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adversary.attack import attack_transcript
from adversary.report import render_testbed_report
from nlagg_node.config import RunConfig
from nlagg_node.lab.testbed import run_testbed
from nlagg_node.sim import simulate


@pytest.mark.mosquitto
@pytest.mark.slow
@pytest.mark.parametrize("early", [False, True], ids=["fixed-schedule", "early-stop"])
async def test_testbed_ring_split_by_two_kills_reports_two_exact_components(
    tmp_path: Path, early: bool
) -> None:
    """``nlagg testbed --depart``: two node processes SIGKILLed at fixed iterations split a ring of 8;
    each component ends exact with its own maximum, bit for bit the simulator, and the eavesdropper's
    transcript and the attack know who left. With early stopping each half stops on its own."""
    cfg = RunConfig(
        early_stop=early, may_depart=early, op="max", n=8, graph="ring", trials=1, seed=3, t_max=1000,
        c=10.0, mu_z=30.0,
    )  # fmt: skip
    dep = {0: 200, 4: 300}
    summary = await run_testbed(cfg, departures=dep, out_dir=tmp_path / "run", broker_kind="mosquitto")
    sim = simulate(cfg, departures=dep)
    assert summary["departed"] == {"0": 200, "4": 300}
    assert summary["graph_split"]
    assert summary["exact"]
    assert [c["members"] for c in summary["components"]] == [[1, 2, 3], [5, 6, 7]]
    assert all(c["exact"] for c in summary["components"])
    assert [c["true_value"] for c in summary["components"]] == [
        sim.values[0, c].max() for c in ([1, 2, 3], [5, 6, 7])
    ]
    assert summary["final_x"] == {str(i): float(sim.output[0, i]) for i in summary["survivors"]}
    assert summary["messages_rejected"] == 0
    report = attack_transcript(tmp_path / "run" / "transcript.sqlite")
    assert report.extra["departed"] == {"0": 200, "4": 300}
    page = render_testbed_report(tmp_path / "run").read_text()
    assert "Departed for good: node 0 at t=200, node 4 at t=300" in page


@pytest.mark.mosquitto
@pytest.mark.slow
async def test_testbed_departure_planned_after_the_stop_does_not_happen(tmp_path: Path) -> None:
    """``nlagg testbed --depart 2@6000``: the run stops early before t = 6000, so node 2's process
    finishes instead of being killed; the summary says nobody left, as the simulator's trial does."""
    cfg = RunConfig(op="max", n=8, trials=1, seed=3, may_depart=True)
    sim = simulate(cfg, departures={2: 6000})
    assert sim.departures_of(0) == {}
    summary = await run_testbed(cfg, departures={2: 6000}, out_dir=tmp_path / "run", broker_kind="mosquitto")
    assert summary["departed"] == {}
    assert summary["survivors"] == list(range(cfg.n))
    assert summary["exact"]
    assert summary["iterations"] == int(sim.phase_iterations[0].sum())
    assert summary["final_x"] == {str(i): float(sim.output[0, i]) for i in range(cfg.n)}
