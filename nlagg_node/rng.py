"""The one seed helper: every random draw in nlagg goes through :func:`rng_for`.

A run is identified by one integer seed. Each consumer (graph sampling, private
values, a node's z^(0), a node's DP noise) gets its own independent stream,
derived from the seed and a tuple of keys with :class:`numpy.random.SeedSequence`.
The streams do not depend on the number of trials or on which process draws them,
so the simulator's trial 0 and a networked testbed with the same seed draw
exactly the same numbers.
"""

from __future__ import annotations

import zlib

import numpy as np


def _key(part: int | str) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode())
    if part < 0:
        raise ValueError(f"stream key must be non-negative, got {part}")
    return int(part)


def rng_for(seed: int | None, *stream: int | str) -> np.random.Generator:
    """Return the generator of one named stream of a run.

    Parameters
    ----------
    seed
        The run seed. ``None`` draws fresh OS entropy (a device in the field).
    *stream
        Keys naming the stream, e.g. ``("z0", trial, node)``.
    """
    if seed is None:
        return np.random.default_rng()
    keys = tuple(_key(p) for p in stream)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=keys))
