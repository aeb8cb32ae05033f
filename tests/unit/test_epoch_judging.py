"""How a continuous capture summarises a warm run and an epoch's cold rerun
(:func:`adversary.capture.epochconfig.judge_warm`, :func:`adversary.capture.epochs.with_rerun`)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from adversary.capture.epochconfig import EpochConfigs, judge_warm
from adversary.capture.epochs import with_rerun
from nlagg_node.config import RunConfig


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
    assert configs.band(1, 50.0) == pytest.approx((lo, hi))
    assert configs.band(0, None) is None
    assert configs.band(1, None) is None  # no output of epoch 0 published: epoch 1 runs cold
