"""Streams hashed in bulk (``rng_for_each``) are bit for bit the streams of ``rng_for``."""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node.rng import rng_for, rng_for_each


@pytest.mark.parametrize(
    ("seed", "stream", "index"),
    [
        (0, ("node",), [(b, i) for b in range(4) for i in range(15)]),
        (7, ("node",), [(0, 0), (3, 2), (999, 14)]),
        (2**40 + 3, ("node",), [(1, 2)]),
        (12345, ("values",), [(b,) for b in range(10)]),
        (5, (), [(2**32 + 1, 0)]),
    ],
    ids=["seed-0-grid", "sparse", "seed-above-32-bits", "one-key", "key-above-32-bits"],
)
def test_each_stream_equals_rng_for(
    seed: int, stream: tuple[int | str, ...], index: list[tuple[int, ...]]
) -> None:
    gens = rng_for_each(seed, stream, np.array(index))
    for row, gen in zip(index, gens, strict=True):
        ref = rng_for(seed, *stream, *row)
        assert gen.bit_generator.state == ref.bit_generator.state
        assert np.array_equal(gen.standard_normal(5), ref.standard_normal(5))
