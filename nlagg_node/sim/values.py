"""Private values of the Monte Carlo trials."""

from __future__ import annotations

import numpy as np

from ..arrays import FloatArray
from ..rng import rng_for_each


def draw_values(dist: str, seed: int, trials: int, n: int) -> FloatArray:
    """Private values, one row per trial, from the stream ``(seed, "values", trial)``.

    ``normal``: s_i ~ N(0, 1) i.i.d. (the paper's setup). ``uniform``: U(0, 1).
    ``bimodal`` (the paper's prior-informed median experiment): floor(n/2) values
    from N(-5, 1), floor(n/2) from N(5, 1) and, for odd n, one from N(0, 1), placed
    on the nodes in random order.
    """
    out = np.empty((trials, n))
    half = n // 2
    centers = np.concatenate([np.full(half, -5.0), np.full(half, 5.0), np.zeros(n - 2 * half)])
    for b, rng in enumerate(rng_for_each(seed, ("values",), np.arange(trials)[:, None])):
        if dist == "normal":
            out[b] = rng.standard_normal(n)
        elif dist == "uniform":
            out[b] = rng.random(n)
        elif dist == "bimodal":
            out[b] = rng.permutation(centers + rng.standard_normal(n))
        else:
            raise ValueError(f"values={dist!r}: use normal, uniform or bimodal")
    return out
