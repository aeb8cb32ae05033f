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
from typing import Any

import numpy as np
from numpy.typing import NDArray


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


# Many streams at once ----------------------------------------------------------------------
# numpy's SeedSequence hash (numpy/random/bit_generator.pyx, fixed by numpy's stream
# compatibility policy), vectorized over streams: the simulator needs one generator per
# (trial, node), 15 000 for a typical run, and hashing each in Python costs most of a
# run's setup.
_M32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = np.uint64(0x43B0D7E5), np.uint64(0x931E8875)
_INIT_B, _MULT_B = np.uint64(0x8B51F9DD), np.uint64(0x58F38DED)
_MIX_L, _MIX_R, _XSHIFT = np.uint64(0xCA01F9DD), np.uint64(0x4973F715), np.uint64(16)
_POOL = 4


def _words(value: int) -> list[int]:
    """SeedSequence's split of a non-negative int into 32-bit words, least significant first."""
    if value == 0:
        return [0]
    out = []
    while value > 0:
        out.append(value & 0xFFFFFFFF)
        value >>= 32
    return out


class _PCG64Words(np.random.bit_generator.ISeedSequence):
    """A seed sequence whose ``generate_state(4, uint64)`` is known already (computed in bulk)."""

    def __init__(self, words: NDArray[np.uint64]) -> None:
        self.words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> NDArray[Any]:
        if n_words != 4 or np.dtype(dtype) != np.uint64:  # pragma: no cover - PCG64 asks for exactly this
            raise ValueError("only PCG64's 4 x uint64 seeding words are precomputed")
        return self.words


def _pcg64_words(seed: int, prefix: list[int], index: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``SeedSequence(seed, spawn_key=(*prefix, *row)).generate_state(4, uint64)`` for every row."""
    m = index.shape[0]
    run = _words(seed)
    run += [0] * (_POOL - len(run))  # with a spawn key, the run entropy is padded to the pool size
    entropy = [np.full(m, w, dtype=np.uint64) for w in run + [w for p in prefix for w in _words(p)]]
    entropy += [index[:, j] for j in range(index.shape[1])]
    const = _INIT_A

    def hashmix(value: NDArray[np.uint64]) -> NDArray[np.uint64]:
        nonlocal const
        value = (value ^ const) & _M32
        const = (const * _MULT_A) & _M32
        value = (value * const) & _M32
        return value ^ (value >> _XSHIFT)

    def mix(x: NDArray[np.uint64], y: NDArray[np.uint64]) -> NDArray[np.uint64]:
        r = (_MIX_L * x - _MIX_R * y) & _M32
        return r ^ (r >> _XSHIFT)

    pool = [hashmix(entropy[i]) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, len(entropy)):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    const = _INIT_B
    out32 = []
    for i in range(8):
        value = (pool[i % _POOL] ^ const) & _M32
        const = (const * _MULT_B) & _M32
        value = (value * const) & _M32
        out32.append(value ^ (value >> _XSHIFT))
    return np.stack([out32[2 * j] | (out32[2 * j + 1] << np.uint64(32)) for j in range(4)], axis=1)


def rng_for_each(
    seed: int | None, stream: tuple[int | str, ...], index: NDArray[np.integer]
) -> list[np.random.Generator]:
    """``[rng_for(seed, *stream, *row) for row in index]``, bit for bit, hashed in bulk.

    Parameters
    ----------
    seed
        The run seed (``None``: fresh OS entropy for each generator).
    stream
        The keys common to all streams, e.g. ``("node",)``.
    index
        ``(M, K)`` non-negative integers: the remaining keys of each stream, e.g. ``(trial, node)``.
    """
    rows = np.asarray(index, dtype=np.int64).reshape(len(index), -1)
    if seed is None:
        return [np.random.default_rng() for _ in range(len(rows))]
    prefix = [_key(p) for p in stream]
    if seed < 0 or (rows.size and (rows.min() < 0 or rows.max() > 0xFFFFFFFF)):
        return [rng_for(seed, *stream, *map(int, row)) for row in rows]
    words = _pcg64_words(seed, prefix, rows.astype(np.uint64))
    return [np.random.Generator(np.random.PCG64(_PCG64Words(w))) for w in words]  # type: ignore[arg-type]
