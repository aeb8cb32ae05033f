"""A continuous capture of a deployment that publishes no per-epoch config, through Mosquitto: the
epoch testbed's eavesdropper (``nlagg eavesdrop --continuous --config --drift``, a child process)
derives each epoch's configuration from the deployment's public config, epoch k-1's published
output and the declared drift (:class:`adversary.capture.epochconfig.EpochConfigs`), and captures a
warm epoch that fell back together with its cold rerun; ``nlagg attack STORE --drift`` then reports
every epoch, its exposures the true values, its combined intervals sound.

The declared drift is 0 and the values are drawn afresh each epoch, so a warm epoch falls back
whenever its output moves (the median's always, the max's when it rises): pinned seeds."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from adversary.transcript import EpochStore
from nlagg_node.config import RunConfig
from nlagg_node.lab.epochtestbed import epoch_values, run_epoch_testbed
from tests.harness.load import stretched

pytestmark = pytest.mark.mosquitto
ENTRY = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]


def exposures_are_true(summary: dict[str, Any], truth: list[float]) -> None:
    """Every node a run's summary counts exposed was exposed at its own value."""
    found = {int(f["node"]): f for f in summary.get("nodes", [])}
    for i in summary["exposed"]:
        assert found[i]["value"] == pytest.approx(truth[i], abs=1e-6), (i, found[i])


@pytest.mark.parametrize(("op", "seed"), [("median", 4), ("max", 4)], ids=["median", "max"])
async def test_three_epochs_with_a_fallback_captured_with_derived_configs(
    mosquitto_url: str, tmp_path: Path, op: str, seed: int
) -> None:
    cfg = RunConfig(op=op, n=5, graph="complete", value_range=(0.0, 100.0), seed=seed)
    summary = await run_epoch_testbed(
        cfg,
        3,
        stretched(20.0),  # ~12 s of iterations idle: a busy machine gets longer epochs, not skipped ones
        run_id="R",
        prefix="P",
        broker_url=mosquitto_url,
        in_process=True,
        out_dir=tmp_path,
        capture=True,
        drift=0.0,
    )
    rows = summary["epochs"]
    assert all(r["exact"] for r in rows), rows
    starts = [r["start"] for r in rows]
    assert starts[0] == "cold", starts
    assert "fell back" in starts, starts  # a forced cold rerun
    assert "capture" in summary
    captured = summary["capture"]
    assert [e["epoch"] for e in captured["epochs"]] == [0, 1, 2]
    assert [e["error"] for e in captured["epochs"]] == [None] * 3
    assert all(e["complete"] for e in captured["epochs"])
    assert captured["interval_soundness"] == 1.0

    store = tmp_path / "epochs"
    proc = await asyncio.create_subprocess_exec(
        *ENTRY, "attack", str(store), "--drift", "1", "--json", stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    assert proc.returncode == 0
    report = json.loads(stdout)
    assert [e["epoch"] for e in report["epochs"]] == [0, 1, 2]
    assert [e["error"] for e in report["epochs"]] == [None] * 3
    assert [e["exposed"] for e in report["epochs"]] == [e["exposed"] for e in captured["epochs"]]
    for k, e in enumerate(report["epochs"]):
        assert e["output"] == pytest.approx(rows[k]["output"], abs=1e-6)

    with EpochStore(store, read_only=True) as st:
        closed = {r.epoch: r.summary or {} for r in st.epochs()}
        reruns = [st.transcript_path(k, rerun=True).is_file() for k in range(3)]
    for k, row in enumerate(rows):
        s, truth = closed[k], [float(v) for v in epoch_values(cfg, k)]
        assert s["rejected"] == 0, s  # no honest x outside the envelope, warm or cold
        assert ("warm" in s) == (row["start"] == "fell back"), (k, row["start"])
        assert reruns[k] == (row["start"] == "fell back")
        exposures_are_true(s, truth)
        if "warm" in s:  # the warm run's exposures (both runs are seen) are counted with the rerun's
            exposures_are_true(s["warm"], truth)
            assert set(s["warm"]["exposed"]) <= set(s["exposed"])
