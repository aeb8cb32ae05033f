"""Sweeps on a Dask cluster: `experiment --scheduler` gives the local run's numbers, and a missing
scheduler is one line naming the address."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from distributed import LocalCluster
from typer.testing import CliRunner

from nlagg_node.cli import _register, app
from nlagg_node.errors import ConfigError
from nlagg_node.sweep import run_sweep


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A local Dask scheduler with two worker threads-in-process (no process of its own to start)."""
    cluster = LocalCluster(  # type: ignore[no-untyped-call]
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    with cluster:
        yield str(cluster.scheduler_address)


def _panels(doc: dict[str, object]) -> list[dict[str, object]]:
    """The panels' numbers, without their timings."""
    panels = doc["panels"]
    assert isinstance(panels, list)
    return [{k: v for k, v in panel.items() if k != "seconds"} for panel in panels]


def test_experiment_on_the_scheduler_equals_the_local_run(tmp_path: Path, scheduler: str) -> None:
    _register()
    runner = CliRunner()
    args = ["experiment", "min", "--trials", "30", "--seed", "2", "--quiet"]
    local = runner.invoke(app, [*args, "--out", str(tmp_path / "local")])
    remote = runner.invoke(app, [*args, "--out", str(tmp_path / "dask"), "--scheduler", scheduler])
    assert local.exit_code == 0, local.output
    assert remote.exit_code == 0, remote.output
    a = json.loads((tmp_path / "local" / "min.json").read_text())
    b = json.loads((tmp_path / "dask" / "min.json").read_text())
    assert _panels(a) == _panels(b)


def test_tune_on_the_scheduler_equals_the_local_run(tmp_path: Path, scheduler: str) -> None:
    _register()
    runner = CliRunner()
    args = ["tune", "--op", "max", "--n", "6", "--trials", "12", "--budget", "400", "--json"]
    local = runner.invoke(app, [*args, "--out", str(tmp_path / "local.toml")])
    remote = runner.invoke(app, [*args, "--out", str(tmp_path / "dask.toml"), "--scheduler", scheduler])
    assert local.exit_code == 0, local.output
    assert remote.exit_code == 0, remote.output
    a, b = json.loads(local.stdout), json.loads(remote.stdout)  # stderr says what it is doing
    assert [_numbers(e) for e in a["evaluated"]] == [_numbers(e) for e in b["evaluated"]]
    assert (tmp_path / "local.toml").read_text() == (tmp_path / "dask.toml").read_text()


def _numbers(evaluation: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in evaluation.items() if k != "seconds"}


def test_results_come_back_in_item_order(scheduler: str) -> None:
    seen: list[int] = []
    out = run_sweep(abs, [-k for k in range(9)], scheduler=scheduler, on_result=lambda i, _: seen.append(i))
    assert out == list(range(9))
    assert sorted(seen) == list(range(9))


def test_an_unreachable_scheduler_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^scheduler='tcp://127.0.0.1:9': no Dask scheduler answered"):
        run_sweep(abs, [1, 2], scheduler="tcp://127.0.0.1:9")
