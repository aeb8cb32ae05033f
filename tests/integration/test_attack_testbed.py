"""The transcript attack on a testbed run through a real Mosquitto (simulated: tests/unit/test_attack.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adversary.attack import attack_transcript
from nlagg_node.config import RunConfig


@pytest.mark.mosquitto
@pytest.mark.parametrize("op", ["max", "min", "median"], ids=["max", "min", "median"])
async def test_testbed_transcript_precision_and_recall(op: str, mosquitto_url: str, tmp_path: Path) -> None:
    from nlagg_node.lab.testbed import run_testbed

    cfg = RunConfig(op=op, n=6, c=10.0, mu_z=60.0, t_max=700, seed=4)
    summary = await run_testbed(cfg, broker_url=mosquitto_url, in_process=True, corrupt={0}, out_dir=tmp_path)
    report = attack_transcript(tmp_path / "transcript.sqlite")
    assert report.truth_note.startswith("ground truth from")
    assert report.precision == 1.0
    assert report.interval_soundness == 1.0
    assert report.recall == 1.0
    assert sorted(report.exposed) == sorted(summary["exposed_nodes"])
