"""The sweep runner: results in item order whatever the workers, and a failure ends the sweep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nlagg_node.sweep import run_sweep


def _square_slowly(item: tuple[int, str]) -> int:
    k, folder = item
    time.sleep(0.05)
    (Path(folder) / f"ran-{k}").touch()
    return k * k


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "two-workers"])
def test_results_come_back_in_item_order(tmp_path: Path, workers: int) -> None:
    items = [(k, str(tmp_path)) for k in range(12)]
    seen: list[int] = []
    out = run_sweep(_square_slowly, items, workers=workers, on_result=lambda i, _: seen.append(i))
    assert out == [k * k for k in range(12)]
    assert sorted(seen) == list(range(12))


def test_a_failing_callback_drops_the_jobs_not_started(tmp_path: Path) -> None:
    items = [(k, str(tmp_path)) for k in range(60)]

    def fail(i: int, r: int) -> None:
        raise RuntimeError(f"callback failed on job {i}")

    with pytest.raises(RuntimeError, match="callback failed"):
        run_sweep(_square_slowly, items, workers=2, on_result=fail)
    time.sleep(0.3)  # anything still running has finished by now
    ran = len(list(tmp_path.glob("ran-*")))
    assert 1 <= ran < 20
