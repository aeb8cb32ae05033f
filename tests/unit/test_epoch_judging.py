"""How a continuous capture configures each epoch from the deployment's public config
(:class:`adversary.capture.epochconfig.EpochConfigs`) and summarises a warm run and an epoch's cold
rerun (:func:`adversary.capture.epochconfig.judge_warm`, :func:`adversary.capture.epochs.with_rerun`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from adversary.capture.epochconfig import EpochConfigs, judge_warm
from adversary.capture.epochs import EpochCapture, with_rerun
from adversary.epochs import epoch_summary
from adversary.transcript import EpochStore
from nlagg_node.config import RunConfig
from nlagg_node.epochplan import WARM_GAP, HeardOutput
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.wire import encode


def finding(node: int, lower: float | None, upper: float | None) -> dict[str, Any]:
    exposed = lower is not None and lower == upper
    return {
        "node": node,
        "status": "exposed" if exposed else "interval",
        "value": lower if exposed else None,
        "lower": lower,
        "upper": upper,
    }


def test_a_warm_runs_shell_exposures_expose_no_value_and_intervals_cover_the_shells_side() -> None:
    summary = {
        "value_range": [0.0, 100.0],
        "exposed": [0, 1],
        "nodes": [
            finding(0, 52.0, 52.0),
            finding(1, 70.0, 70.0),
            finding(2, 45.0, 58.0),
            finding(3, None, 20.0),
        ],
    }
    judged = judge_warm(summary, (50.0, 60.0))
    by_node = {f["node"]: f for f in judged["nodes"]}
    assert judged["exposed"] == [0]  # node 1's 70 lies beyond the band: a shell value
    assert (by_node[0]["lower"], by_node[0]["upper"]) == (52.0, 52.0)
    assert (by_node[1]["status"], by_node[1]["lower"], by_node[1]["upper"]) == ("interval", 60.0, None)
    assert (by_node[2]["lower"], by_node[2]["upper"]) == (None, 58.0)  # in the band, or below it
    assert (by_node[3]["lower"], by_node[3]["upper"]) == (None, 50.0)
    assert judged["band"] == [50.0, 60.0]


def test_a_rerun_epoch_keeps_the_reruns_output_and_both_runs_exposures() -> None:
    warm = {"exposed": [0, 2], "iterations": 40, "output": 71.0, "captured": 10, "rejected": 0}
    rerun = {"exposed": [2, 3], "iterations": 300, "output": 64.0, "captured": 30, "rejected": 0}
    epoch = with_rerun(warm, rerun)
    assert (epoch["exposed"], epoch["output"], epoch["iterations"]) == ([0, 2, 3], 64.0, 340)
    assert (epoch["captured"], epoch["warm"]) == (40, warm)


@pytest.mark.parametrize(("op", "lo", "hi"), [("max", -math.inf, 51.0), ("median", 49.0, 51.0)])
def test_the_band_of_a_warm_epoch_is_in_the_values_units(op: str, lo: float, hi: float) -> None:
    configs = EpochConfigs(RunConfig(op=op, n=4, graph="ring", value_range=(0.0, 100.0)), 0.01)
    assert configs.band(1, HeardOutput(0, 50.0)) == pytest.approx((lo, hi))
    assert configs.band(0, None) is None
    assert configs.band(1, None) is None  # no output of epoch 0 published: epoch 1 runs cold


@pytest.mark.parametrize(("gap", "widened"), [(1, 1.0), (3, 3.0), (WARM_GAP, 10.0), (WARM_GAP + 1, None)])
def test_a_warm_start_from_an_older_output_widens_the_band_by_the_epochs_between(
    gap: int, widened: float | None
) -> None:
    configs = EpochConfigs(RunConfig(op="median", n=4, graph="ring", value_range=(0.0, 100.0)), 0.01)
    band = configs.band(20, HeardOutput(20 - gap, 50.0))
    assert band == (None if widened is None else pytest.approx((50.0 - widened, 50.0 + widened)))


def test_the_deployments_retained_config_gives_every_epoch_its_derived_config(tmp_path: Path) -> None:
    cfg = RunConfig(op="median", n=4, graph="ring", value_range=(0.0, 100.0)).resolved()
    edges = run_edges(cfg)
    with EpochStore(tmp_path / "s", "P", "R") as store:
        capture = EpochCapture(
            MemoryTransport(MemoryBroker(), "eve"), store, summarize=epoch_summary, drift=0.01
        )
        status = b'{"v": 1, "node": 0, "state": "online"}'
        capture.handle("P/R/e0/node/0/status", status)  # epoch 0 opened before the deployment's config
        assert capture.current is not None
        assert capture.current.config is None
        capture.handle("P/R/config", encode(build_config_msg(cfg, "R", edges)), True)
        assert capture.current.config is not None  # derived now: epoch 0 runs cold, with cfg itself
        assert capture.current.config.run["c"] == cfg.c_value
        for i in range(3):  # a quorum of records (WARM_QUORUM): one or two would leave epoch 1 cold
            doc = {"v": 1, "node": i, "epoch": 0, "output": 50.0, "iterations": 90, "time": 1.0e9}
            capture.handle(f"P/R/results/{i}", json.dumps(doc).encode())
        capture.handle("P/R/e1/node/0/status", status)
        warm = capture.current.config
        assert warm is not None  # epoch 1 warm from epoch 0's published output: a prior at it
        assert warm.run["prior_median"] == 50.0
        configs = EpochConfigs(cfg, 0.01)
        assert warm.run["c"] == configs.message(1, HeardOutput(0, 50.0)).run["c"] != cfg.c_value
        capture.handle("P/R/e2/node/0/status", status)  # no node finished epoch 1: warm from epoch 0's
        later = capture.current.config
        assert later is not None
        assert later.run["prior_median"] == 50.0
        assert later.run["c"] == configs.message(2, HeardOutput(0, 50.0)).run["c"] != warm.run["c"]
        assert capture.stray == 0
