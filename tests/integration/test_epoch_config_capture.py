"""A continuous capture of a deployment that publishes no per-epoch config: each epoch's
configuration is derived from the deployment's public config, epoch k-1's published output and the
declared drift (:class:`adversary.capture.epochconfig.EpochConfigs`), and a warm epoch that fell
back is captured with its cold rerun."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adversary.capture import run_epoch_eavesdropper
from adversary.capture.epochconfig import EpochConfigs
from adversary.epochs import attack_epochs, epoch_summary
from adversary.transcript import EpochStore
from nlagg_node.config import RunConfig
from nlagg_node.lab.epochs import epoch_values, run_epoch_testbed

pytestmark = pytest.mark.mosquitto


async def test_three_epochs_with_a_fallback_judged_with_derived_configs(
    mosquitto_url: str, tmp_path: Path
) -> None:
    # Declared drift 0 and values drawn afresh each epoch: every warm median falls back and reruns.
    cfg = RunConfig(op="median", n=5, graph="complete", value_range=(0.0, 100.0), seed=4, trials=1)
    store = tmp_path / "store"
    capture = asyncio.create_task(
        run_epoch_eavesdropper(
            mosquitto_url,
            "R",
            store,
            summarize=epoch_summary,
            prefix="P",
            live=False,
            epochs=3,
            stop_after=150.0,
            configs=EpochConfigs(cfg.resolved(), 0.0),
        )
    )
    await asyncio.sleep(1.0)  # subscribed
    summary = await run_epoch_testbed(
        cfg, 3, 8.0, run_id="R", prefix="P", broker_url=mosquitto_url, in_process=True
    )
    done = await capture
    rows = summary["epochs"]
    assert all(r["exact"] for r in rows), rows
    starts = [r["start"] for r in rows]
    assert starts[0] == "cold", starts
    assert "fell back" in starts, starts
    assert done.reruns > 0
    with EpochStore(store, read_only=True) as st:
        closed = {r.epoch: r.summary for r in st.epochs()}
    assert sorted(closed) == [0, 1, 2]
    for k, row in enumerate(rows):
        s = closed[k]
        assert s is not None
        assert "error" not in s, s
        assert s["complete"], s
        assert s["rejected"] == 0, s  # every honest x inside the envelope
        assert ("warm" in s) == (row["start"] == "fell back"), (k, row["start"], sorted(s))
        assert s["output"] == pytest.approx(row["output"], abs=1e-6)
    # The values were drawn afresh (they moved by up to the whole range): combined under drift 1.
    report = attack_epochs(store, drift=1.0)
    assert [e.epoch for e in report.epochs] == [0, 1, 2]
    assert all(e.error is None and e.complete for e in report.epochs)
    assert [e.exposed for e in report.epochs] == [(closed[k] or {})["exposed"] for k in range(3)]
    truth = {k: epoch_values(cfg, k) for k in range(3)}
    assert report.interval_soundness(truth) == 1.0
