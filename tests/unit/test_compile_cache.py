"""Issue 33, item 7: the first simulation says it compiles kernels; it knows from numba's cache index."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from nlagg_node.compile_cache import is_cached

SOURCE = """
import numba

@numba.njit(cache=True)
def twice(x):
    return 2 * x

@numba.njit
def thrice(x):
    return 3 * x
"""


def test_a_kernel_is_cached_once_its_first_call_compiled_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fresh_kernels_33.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fresh_kernels_33")
    try:
        assert not is_cached(module.twice)
        assert module.twice(2) == 4
        assert is_cached(module.twice)
        assert module.thrice(2) == 6
        assert not is_cached(module.thrice)  # no disk cache at all
    finally:
        sys.modules.pop("fresh_kernels_33", None)
