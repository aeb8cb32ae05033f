"""Inputs the user names: devices, FIFOs, oversized files, bombs and huge integers get one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytest

from nlagg_node.errors import ConfigError
from nlagg_node.inputs import MAX_NESTING, parse_document, read_input_text


def test_a_device_is_refused_before_it_is_read() -> None:
    with pytest.raises(ConfigError, match="not a regular file"):
        read_input_text(Path("/dev/zero"), "values_file")


def test_a_fifo_without_a_writer_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "values"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_input_text(fifo, "values_file")


def test_a_file_over_the_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.csv"
    big.write_bytes(b"1\n" * 600)
    with pytest.raises(ConfigError, match="larger than the 1000-byte cap") as err:
        read_input_text(big, "values_file", max_bytes=1000)
    assert "values_file" in str(err.value)


@pytest.mark.parametrize(
    ("text", "kind", "why"),
    [
        ("[" * 5000 + "]" * 5000, "JSON", "nested deeper"),
        ("a = " + "[" * 5000 + "]" * 5000, "TOML", "nested deeper"),
        ('{"n": ' + "9" * 5000 + "}", "JSON", "digits"),
        ("n = " + "9" * 5000, "TOML", "digits"),
        ("n = ", "TOML", "not valid TOML"),
    ],
    ids=["json-bomb", "toml-bomb", "json-huge-int", "toml-huge-int", "toml-syntax"],
)
def test_hostile_documents_get_one_line(text: str, kind: Literal["TOML", "JSON"], why: str) -> None:
    with pytest.raises(ConfigError, match=why) as err:
        parse_document(text, kind, "config", "run.toml")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ('a = "[[[["\nb = [[1], [2]]', "TOML", {"a": "[[[[", "b": [[1], [2]]}),
        ('{"s": "]]\\"[[", "v": [' + "[" * (MAX_NESTING - 2) + "]" * (MAX_NESTING - 2) + "]}", "JSON", None),
    ],
    ids=["brackets-in-strings", "at-the-nesting-limit"],
)
def test_legitimate_documents_parse(text: str, kind: Literal["TOML", "JSON"], expected: object) -> None:
    doc = parse_document(text, kind, "config", "run.toml")
    assert isinstance(doc, dict)
    if expected is not None:
        assert doc == expected
