"""The docs' example commands print what the docs say they print: each block a group of
benchmarks/doc_figures.py writes by running the documented commands (in an empty folder, as processes)
is what they print today. The other groups' blocks: tests/unit/test_doc_figures.py."""

from __future__ import annotations

import pytest

from benchmarks.doc_figures import COMMAND_GROUPS, GROUPS, between


@pytest.mark.slow
@pytest.mark.parametrize("group", COMMAND_GROUPS)
def test_each_command_block_is_what_its_commands_print(group: str) -> None:
    for block in GROUPS[group]():
        assert between(block.page.read_text(), block.name) == block.text, block
