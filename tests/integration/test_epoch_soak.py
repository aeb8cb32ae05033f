"""A short soak of a continuous deployment (``benchmarks/soak_epochs.py`` runs 200 epochs): the
plan's files on Mosquitto, ten node processes and the continuous eavesdropper, one node SIGKILLed
mid-epoch and restarted, the eavesdropper SIGKILLed mid-epoch and restarted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness.epochsoak import Fault, Soak, SoakSettings
from tests.harness.load import contention, stretched

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]


async def test_six_epochs_stay_exact_complete_and_sound_across_restarts(tmp_path: Path) -> None:
    load = contention()  # a busy machine gets longer epochs, not skipped ones
    settings = SoakSettings(
        epochs=6,
        every=stretched(10.0, load),
        lead=stretched(15.0, load),
        keep_epochs=2,
        faults=(Fault(1, "eavesdropper"), Fault(3, "node", node=1)),
    )
    started = time.time()
    async with Soak(settings, tmp_path) as bed:
        await bed.run(within=stretched(180.0, load))
        report = bed.report(started)
    ran = [e for e in report.epochs if e.present]
    assert [e.epoch for e in ran if not e.exact] == [], report.epochs
    # The epochs the faults cannot reach run (one may be skipped where a loaded machine overruns).
    assert len({0, 1, 2, 5} & {e.epoch for e in ran}) >= 3, report.epochs
    assert report.starts["warm"] > 0  # the plan's default: warm starts from the published outputs
    captured = set(report.in_store) | set(report.open_in_store)  # the last may still be open
    assert {e.epoch for e in ran} <= captured  # every epoch that ran was captured
    assert report.results_in_store == report.results_published  # and every result its nodes wrote
    assert report.soundness == 1.0
    assert report.combined_consistent
