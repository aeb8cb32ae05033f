"""The measured figures of the README and the docs are what their scripts measure
(benchmarks/doc_figures.py writes every block): the README's defaults table and docs/reference.md's
iterations run measured again at fewer trials, each figure within its binomial error, and at the
page's trials, equal; every other block measured again as its group writes it (those that run the
documented commands as processes: tests/integration/test_doc_commands.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.defaults_table import (
    README_SIZES,
    README_TRIALS,
    DefaultsRow,
    measure_defaults,
    measure_seeds,
    read_ran,
    read_readme_rows,
    seeds_block,
    table_block,
)
from benchmarks.doc_figures import COMMAND_GROUPS, GROUPS, PAGES, between, block_names, markers, with_block
from nlagg_node.defaults import OPERATORS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TRIALS = 200
Z = 4.0  # standard errors: a figure that moved by more has drifted, not fluctuated


def _within_binomial_error(committed: float, measured: float) -> bool:
    """Two shares of trials, of README_TRIALS and TRIALS trials, agree within Z pooled standard errors
    (the table rounds to 3 places: half a unit of the last place is allowed on top)."""
    pooled = (committed * README_TRIALS + measured * TRIALS) / (README_TRIALS + TRIALS)
    se = math.sqrt(pooled * (1 - pooled) * (1 / README_TRIALS + 1 / TRIALS))
    return abs(committed - measured) <= Z * se + 0.0005


def test_the_readme_table_lists_every_operator_once_per_network_size() -> None:
    rows = read_readme_rows(README.read_text())
    assert [(r.n, r.op) for r in rows] == [(n, op) for n in README_SIZES for op in OPERATORS]


def test_the_table_is_written_between_the_markers_only() -> None:
    text = README.read_text()
    rows = [DefaultsRow(op, 1.0, 0.5, 100.0, n=n) for n in README_SIZES for op in OPERATORS]
    written = with_block(text, table_block(rows), "defaults")
    assert read_readme_rows(written) == rows
    assert with_block(written, table_block(read_readme_rows(text)), "defaults") == text


def test_every_block_in_the_pages_names_the_group_that_writes_it() -> None:
    found = [(page, name) for page in PAGES for name in block_names(page.read_text())]
    assert len(found) >= len(GROUPS)
    for page, name in found:
        text = page.read_text()
        group = text.split(f"<!-- {name}:begin (python benchmarks/doc_figures.py ", 1)[1].split(" ", 1)[0]
        assert group in GROUPS, (page.name, name)
        begin, end = markers(name, group)
        assert (text.count(begin), text.count(end)) == (1, 1), (page.name, name)
        assert between(text, name), (page.name, name)
        # A line that starts with a comment is raw HTML in CommonMark: an inline block's figures on it
        # would not render as Markdown.
        assert f"\n{begin}\n" in text or f"\n{begin}" not in text, (page.name, name)


@pytest.mark.slow
@pytest.mark.parametrize("op", OPERATORS)
def test_each_readme_figure_is_measured_again(op: str) -> None:
    committed = next(r for r in read_readme_rows(README.read_text()) if (r.op, r.n) == (op, 15))
    measured = measure_defaults(op, TRIALS)
    assert _within_binomial_error(committed.exact, measured.exact), (committed, measured)
    assert _within_binomial_error(committed.leak, measured.leak), (committed, measured)
    assert committed.iterations is not None
    assert measured.iterations is not None
    # A median of iterations has no binomial error; a quarter apart is a changed protocol, not noise.
    assert measured.iterations == pytest.approx(committed.iterations, rel=0.25)
    ran, cap = read_ran((ROOT / "docs" / "reference.md").read_text())[op]
    assert measured.cap == cap
    assert measured.ran == pytest.approx(ran, rel=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("n", list(README_SIZES), ids=[f"n={n}" for n in README_SIZES])
@pytest.mark.parametrize("op", OPERATORS)
def test_each_readme_row_is_what_the_script_writes(op: str, n: int) -> None:
    # The same seed and trials reproduce the run: a figure typed by hand ("about 0.01" where 0.019 was
    # measured) fails here even where the binomial error above is too wide to tell.
    committed = next(r for r in read_readme_rows(README.read_text()) if (r.op, r.n) == (op, n))
    assert measure_defaults(op, README_SIZES[n], n=n).line() == committed.line()


@pytest.mark.slow
def test_the_readme_leakage_over_seeds_is_what_the_script_writes() -> None:
    seed0 = [r for r in read_readme_rows(README.read_text()) if r.n == 15]
    block = seeds_block(seed0 + measure_seeds())
    assert between(README.read_text(), block.name) == block.text


@pytest.mark.slow
@pytest.mark.parametrize("group", [g for g in GROUPS if g != "defaults" and g not in COMMAND_GROUPS])
def test_each_doc_block_is_what_its_group_writes(group: str) -> None:
    # Deterministic runs (seed 0, the pages' trials): a figure typed by hand, or one the code no longer
    # prints, differs from what the group measures now.
    for block in GROUPS[group]():
        assert between(block.page.read_text(), block.name) == block.text, block
