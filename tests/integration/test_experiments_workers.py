"""Experiments in worker processes give the numbers of one process (the experiments themselves:
tests/unit/test_experiments.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adversary.analysis.experiments import run_all


@pytest.mark.slow
def test_numbers_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    def numbers(workers: int) -> list[dict[str, object]]:
        out = tmp_path / f"workers-{workers}"
        run_all(trials=30, out=out, names=["min", "quantile"], seed=3, workers=workers)
        docs = [json.loads((out / f"{name}.json").read_text()) for name in ("min", "quantile")]
        for doc in docs:
            doc.pop("wall_seconds")
            for panel in doc["panels"]:
                panel.pop("seconds")
        return docs

    assert numbers(1) == numbers(2)
