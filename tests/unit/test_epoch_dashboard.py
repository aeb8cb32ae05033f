"""The dashboard of an epoch store: the live epoch, the output series, cumulative exposure (its
HTTP stream: tests/integration/test_epoch_dashboard_http.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adversary.reporting.dashboard import EpochDashboardState
from adversary.transcript import EpochStore
from adversary.transcript.store import Result
from tests.harness.epochs import add_epoch


def caught_up(state: EpochDashboardState) -> None:
    state.poll()
    while state.more:
        state.poll()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EpochStore]:
    with EpochStore(tmp_path / "store", "P", "R") as st:
        yield st


def test_it_follows_the_newest_epoch_and_plots_every_epoch(store: EpochStore) -> None:
    summaries = [add_epoch(store, k, close=k < 2) for k in range(3)]
    store.add_result(Result(0, 3, 1.5, 150, 0.0))
    store.add_result(Result(0, 4, 2.5, 150, 0.0))
    state = EpochDashboardState(store.folder)
    caught_up(state)
    doc = state.snapshot()
    assert doc["epoch"] == 2
    assert doc["run_id"] == "P/R, epoch 2"
    assert doc["config"]["n"] == 8  # the live epoch's own page, as for one run
    series = doc["epochs"]["series"]
    assert [e["epoch"] for e in series] == [0, 1, 2]
    assert [e["exposed"] for e in series] == [s["exposed"] for s in summaries]  # the live one from its replay
    assert [e["output"] for e in series[:2]] == [s["output"] for s in summaries[:2]]
    assert [e["published"] for e in series] == [2.0, None, None]
    first: dict[str, int] = {}
    for k, s in enumerate(summaries):
        for i in s["exposed"]:  # type: ignore[attr-defined]
            first.setdefault(str(i), k)
    assert doc["epochs"]["cumulative"] == first
    assert first  # some node was exposed, or the check above proves nothing
    version = state.version
    add_epoch(store, 3, close=False)
    caught_up(state)
    assert state.version > version
    assert state.snapshot()["epoch"] == 3
    state.close()


def test_a_store_without_epochs_yet_is_shown_waiting(store: EpochStore) -> None:
    state = EpochDashboardState(store.folder)
    caught_up(state)
    doc = state.snapshot()
    assert (doc["epoch"], doc["epochs"]["series"], "config" in doc) == (None, [], False)
    state.close()
