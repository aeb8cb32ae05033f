"""Private values of the Monte Carlo trials: drawn from a distribution or read from a file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..arrays import FloatArray
from ..errors import ConfigError
from ..inputs import read_input_text
from ..rng import rng_for_each

if TYPE_CHECKING:
    from ..config import RunConfig


def draw_values(
    dist: str | None, seed: int, trials: int, n: int, value_range: tuple[float, float] | None = None
) -> FloatArray:
    """Private values, one row per trial, from the stream ``(seed, "values", trial)``.

    ``normal``: s_i ~ N(0, 1) i.i.d. (the paper's setup). ``uniform``: U(0, 1).
    ``uniform-range``: U(lo, hi) over the declared ``value_range``.
    ``bimodal`` (the paper's prior-informed median experiment): floor(n/2) values
    from N(-5, 1), floor(n/2) from N(5, 1) and, for odd n, one from N(0, 1), placed
    on the nodes in random order. ``None`` (an unset ``values``) is ``uniform-range`` when a
    range is given and ``normal`` otherwise.
    """
    if dist is None:
        dist = "normal" if value_range is None else "uniform-range"
    if dist == "uniform-range" and value_range is None:
        raise ConfigError("values", dist, "needs value_range = [LO, HI]")
    out = np.empty((trials, n))
    half = n // 2
    centers = np.concatenate([np.full(half, -5.0), np.full(half, 5.0), np.zeros(n - 2 * half)])
    for b, rng in enumerate(rng_for_each(seed, ("values",), np.arange(trials)[:, None])):
        if dist == "normal":
            out[b] = rng.standard_normal(n)
        elif dist == "uniform":
            out[b] = rng.random(n)
        elif dist == "uniform-range":
            assert value_range is not None
            lo, hi = value_range
            out[b] = lo + (hi - lo) * rng.random(n)
        elif dist == "bimodal":
            out[b] = rng.permutation(centers + rng.standard_normal(n))
        else:
            raise ConfigError("values", dist, "use normal, uniform, uniform-range or bimodal")
    return out


_SEPARATORS = re.compile(r"[,;\s]+")


def read_value_rows(path: Path, n: int) -> FloatArray:
    """Every row of n values of a CSV or whitespace-separated file, shape ``(rows, n)``.

    n lines of one value are one row. Blank lines and lines starting with ``#`` are skipped.
    """
    rows: list[list[float]] = []
    for number, line in enumerate(read_input_text(path, "values_file").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            row = [float(tok) for tok in _SEPARATORS.split(text) if tok]
        except ValueError:
            raise ConfigError("values_file", f"{path}:{number}", f"not a number in {text[:60]!r}") from None
        if not all(np.isfinite(row)):
            raise ConfigError("values_file", f"{path}:{number}", "values must be finite numbers")
        rows.append(row)
    if not rows:
        raise ConfigError("values_file", str(path), "holds no values")
    if all(len(r) == 1 for r in rows) and len(rows) == n:
        rows = [[r[0] for r in rows]]  # one value per line: one row
    bad = [len(r) for r in rows if len(r) != n]
    if bad:
        raise ConfigError("values_file", str(path), f"a row holds {bad[0]} values, expected n={n}")
    return np.asarray(rows, dtype=np.float64)


def read_values_file(path: Path, n: int, trials: int) -> FloatArray:
    """Values from a CSV or whitespace-separated file, shape ``(trials, n)``.

    One row of n values per trial, or a single row (or n lines of one value) reused for
    every trial. Blank lines and lines starting with ``#`` are skipped.
    """
    rows = read_value_rows(path, n)
    if len(rows) == 1:
        return np.tile(rows[0], (trials, 1))
    if len(rows) != trials:
        raise ConfigError("values_file", str(path), f"{len(rows)} rows: give one row or trials={trials} rows")
    return rows


def run_values(cfg: RunConfig, trials: int | None = None) -> FloatArray:
    """The private values of a run in the user's units, shape ``(trials, n)``.

    From ``cfg.values_file`` when given, else drawn from ``cfg.values_value`` with the run
    seed. Every value is checked against the declared ``value_range``.
    """
    from ..valuechecks import check_values

    b = cfg.trials if trials is None else trials
    if cfg.values_file is not None:
        s = read_values_file(cfg.values_file, cfg.n, b)
    else:
        s = draw_values(cfg.values_value, cfg.seed, b, cfg.n, cfg.value_range)
    check_values(cfg, s)
    return s
