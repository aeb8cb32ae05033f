"""Intervals combined across epochs under a declared drift (adversary.epochs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adversary.epochs import attack_epochs, combine_intervals
from adversary.simulated import simulate_transcript
from adversary.transcript import EpochStore
from nlagg_node.config import RunConfig
from nlagg_node.rng import rng_for

INF = np.inf


def test_each_epoch_is_cut_by_the_others_widened_by_the_drift_per_epoch() -> None:
    # Node 0: exposed at 5.0 in epoch 0, unbounded in epoch 1, [4, 9] in epoch 3 (epoch 2 missing).
    # Node 1: nothing anywhere stays unbounded.
    lower = np.array([[5.0, -INF], [-INF, -INF], [4.0, -INF]])
    upper = np.array([[5.0, INF], [INF, INF], [9.0, INF]])
    lo, hi = combine_intervals([0, 1, 3], lower, upper, drift=1.0)
    assert lo[:, 0].tolist() == [5.0, 4.0, 4.0]  # epoch 3: max(4, 5 - 3)
    assert hi[:, 0].tolist() == [5.0, 6.0, 8.0]  # epoch 1: 5 + 1; epoch 3: min(9, 5 + 3)
    assert np.isinf(lo[:, 1]).all()
    assert np.isinf(hi[:, 1]).all()
    lo, hi = combine_intervals([0, 1, 3], lower, upper, drift=0.0)
    assert (lo[2, 0], hi[2, 0]) == (5.0, 5.0)  # no drift: epoch 3's value is epoch 0's
    lower[2, 0] = 6.0
    lo, hi = combine_intervals([0, 1, 3], lower, upper, drift=0.0)
    assert lo[0, 0] > hi[0, 0]  # 6 <= s(3) contradicts s(0) = 5 without drift


def test_combining_refuses_epochs_out_of_order() -> None:
    with pytest.raises(ValueError, match="ascending"):
        combine_intervals([1, 0], np.zeros((2, 1)), np.ones((2, 1)), 0.1)


# The max's intervals all end near its output, which moves with the drift: combining narrows
# none of them there; the median's neighbours' intervals lie apart and do narrow.
@pytest.mark.parametrize(
    ("op", "n", "t_max", "narrows"),
    [("median", 11, 400, True), ("max", 10, 2500, False)],
    ids=["median", "max"],
)
def test_combined_intervals_contain_a_random_walk_within_the_drift(
    op: str, n: int, t_max: int, narrows: bool, tmp_path: Path
) -> None:
    epochs, drift, span = 6, 0.02, 100.0
    rng = rng_for(7, "walk", op)
    s = rng.uniform(10.0, 90.0, n)
    store = EpochStore(tmp_path / "store", "P", "R")
    truth = []
    for k in range(epochs):
        if k:
            s = np.clip(s + rng.uniform(-drift * span, drift * span, n), 0.0, span)
        truth.append(s.copy())
        (tmp_path / f"v{k}.txt").write_text(" ".join(repr(float(v)) for v in s))
        cfg = RunConfig(
            op=op,
            n=n,
            seed=20 + k,
            t_max=t_max,
            early_stop=False,
            value_range=(0.0, span),
            values_file=tmp_path / f"v{k}.txt",
        )
        simulate_transcript(cfg, store.transcript_path(k), run_id=f"e{k}", prefix="P/R")
        store.open_epoch(k)  # open: the attack runs on its transcript
    store.close()
    alone = attack_epochs(tmp_path / "store")  # no drift: each epoch's own intervals
    report = attack_epochs(tmp_path / "store", drift=drift)
    assert report.drift_units == pytest.approx(drift * span)
    assert report.interval_soundness(dict(enumerate(truth))) == 1.0
    assert all(node.consistent for node in report.nodes)
    assert attack_epochs(tmp_path / "store", drift=0.0).interval_soundness(dict(enumerate(truth))) < 1.0
    narrowed = [
        (c["lower"], c["upper"]) != (o["lower"], o["upper"])
        for node, own in zip(report.nodes, alone.nodes, strict=True)
        for c, o in zip(node.combined, own.combined, strict=True)
    ]
    assert any(narrowed) == narrows  # other epochs narrowed some interval
    exposed = [set(e.exposed) for e in report.epochs]
    assert report.cumulative == {
        i: min(k for k, e in enumerate(exposed) if i in e) for i in set().union(*exposed)
    }
