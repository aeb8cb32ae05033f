"""The README's defaults table is what benchmarks/defaults_table.py measures: each figure measured
again at fewer trials (the same seed) lies within its binomial error of the committed one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.defaults_table import (
    README_TRIALS,
    DefaultsRow,
    measure_defaults,
    read_readme_rows,
    with_table,
)
from nlagg_node.defaults import OPERATORS

README = Path(__file__).resolve().parents[2] / "README.md"
TRIALS = 200
Z = 4.0  # standard errors: a figure that moved by more has drifted, not fluctuated


def _within_binomial_error(committed: float, measured: float) -> bool:
    """Two shares of trials, of README_TRIALS and TRIALS trials, agree within Z pooled standard errors
    (plus one trial's worth, so a share of 1.000 may meet one failure in the smaller run)."""
    pooled = (committed * README_TRIALS + measured * TRIALS) / (README_TRIALS + TRIALS)
    se = math.sqrt(pooled * (1 - pooled) * (1 / README_TRIALS + 1 / TRIALS))
    return abs(committed - measured) <= Z * se + 1 / TRIALS


def test_the_readme_table_lists_every_operator_once() -> None:
    rows = read_readme_rows(README.read_text())
    assert [r.op for r in rows] == list(OPERATORS)


def test_the_table_is_written_between_the_markers_only() -> None:
    text = README.read_text()
    rows = [DefaultsRow(op, 1.0, 0.5, 100.0) for op in OPERATORS]
    written = with_table(text, rows)
    assert read_readme_rows(written) == rows
    assert with_table(written, read_readme_rows(text)) == text


@pytest.mark.slow
@pytest.mark.parametrize("op", OPERATORS)
def test_each_readme_figure_is_measured_again(op: str) -> None:
    committed = next(r for r in read_readme_rows(README.read_text()) if r.op == op)
    measured = measure_defaults(op, TRIALS)
    assert _within_binomial_error(committed.exact, measured.exact), (committed, measured)
    assert _within_binomial_error(committed.leak, measured.leak), (committed, measured)
    assert committed.iterations is not None
    assert measured.iterations is not None
    # A median of iterations has no binomial error; a quarter apart is a changed protocol, not noise.
    assert measured.iterations == pytest.approx(committed.iterations, rel=0.25)
