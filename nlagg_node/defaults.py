"""The defaults every command states, in plain Python: ``nlagg --help`` reads them without loading
pydantic or numpy (:mod:`nlagg_node.config` re-exports them and builds the validated model on them).
"""

from __future__ import annotations

OPERATORS: tuple[str, ...] = ("max", "min", "topk", "median", "quantile", "trimmed-mean", "average")

DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
"""The broker every command connects to when none is given (the testbed starts its own instead)."""

# Per-operator defaults, measured on RGG n = 15 (docs/reference.md, "Defaults: privacy against
# convergence time").
# c sets the step (larger = slower, smaller oscillations); mu_z / c is where x starts.
# Max, min, top-K and the trimmed mean share one setting; the others are their own.
_EXTREMES: dict[str, float | int] = {"c": 100.0, "mu_z": 300.0, "sigma_z": 1.0, "t_max": 7000}
_AVERAGE: dict[str, float | int] = {"c": 1.0, "mu_z": 0.0, "sigma_z": 100.0, "t_max": 400}
_ORDER = ("max", "min", "topk", "median", "quantile", "trimmed-mean", "average")  # as the help lists them
_OWN: dict[str, dict[str, float | int]] = {
    "median": {"c": 10.0, "mu_z": 30.0, "sigma_z": 0.0, "t_max": 6000},
    "quantile": {"c": 10.0, "mu_z": 30.0, "sigma_z": 0.0, "t_max": 7000},
    "average": _AVERAGE,
}
OPERATOR_DEFAULTS: dict[str, dict[str, float | int]] = {op: dict(_OWN.get(op, _EXTREMES)) for op in _ORDER}

# Without a value range the values are taken as the paper's N(0, 1), and a one-sided start mu_z / c
# must lie above (below) every node's value, or that node refuses the run. The calibrated start 3
# is the level the largest of 15 values exceeds with probability 2%; a larger network raises it to
# the level the largest of n values exceeds with probability START_RISK / n (0.3% at n = 100,
# 0.03% at n = 1000), never below 3: n <= 15 keeps the calibrated defaults (docs/reference.md,
# "Defaults at any n").
START_RISK = 0.31

# Iterations to converge grow with n (max, RGG, seed 0, the certified stop: a median 2315 at n = 15,
# 4393 at n = 200, 6807 at n = 1000, where t_max = 7000 left 9 of 20 trials short), so the cap t_max
# grows as (n / 15)^(1/3), rounded up to 100: 7000 up to n = 15, 16,600 at n = 200, 28,400 at 1000.
# Early stopping ends a phase when it is done; t_max only bounds the runs that are not.
T_MAX_GROWTH = 1.0 / 3.0

# With a declared value_range the protocol runs on values in [0, 1] (nlagg_node.valuechecks); these are
# calibrated there (uniform values over the range, RGG n = 15; docs/experiments.md). Gaps between
# neighbouring values are about 1/n of the range, so c is larger than for N(0, 1) values. One-sided
# starts sit at the range's midpoint +- mu_z / c: mu_z / c = 0.6 starts x 10% of the range beyond it.
_NORMALIZED_EXTREMES: dict[str, float | int] = {"c": 1000.0, "mu_z": 600.0, "sigma_z": 1.0, "t_max": 7000}
# The median's and the quantile's:
_NORMALIZED_CENTRE: dict[str, float | int] = {"c": 30.0, "mu_z": 18.0, "sigma_z": 0.0, "t_max": 6000}
_NORMALIZED_OWN = {"median": _NORMALIZED_CENTRE, "quantile": _NORMALIZED_CENTRE, "average": _AVERAGE}
NORMALIZED_DEFAULTS: dict[str, dict[str, float | int]] = {
    op: dict(_NORMALIZED_OWN.get(op, _NORMALIZED_EXTREMES)) for op in _ORDER
}

# Early stopping's window W per operator (docs/protocol.md, "Early stopping"): W = 100 keeps every
# one-phase operator as exact as the fixed schedule (1000 trials, seed 0, defaults); a multi-phase
# operator can stop a phase on a plateau and carry the error into the next one, and needs W = 200
# (top-K) or 400 (trimmed mean) to match it. Top-K at 400 was as exact as at 200 (seeds 0-3, 1000
# trials each) and ran 16% more iterations.
STOP_WINDOW: dict[str, int] = {
    "max": 100,
    "min": 100,
    "topk": 200,
    "median": 100,
    "quantile": 100,
    "trimmed-mean": 400,
    "average": 100,
}

# What ``--init proposed`` means per operator: the dual initialization with the least measured
# leakage among those exact at the defaults (docs/experiments.md, "Default initializations").
# ``prior`` starts x near the public prior median (the range's midpoint, or --prior-median); the
# median's and quantiles' sigma_z is 0: with z^(0) public the dual noise only moves the start off the
# prior (0.3475 against 0.3335 worst leakage over 2000 trials).
PROPOSED_INIT: dict[str, str] = {
    "max": "from-above",
    "min": "from-below",
    "topk": "from-above",
    "median": "prior",
    "quantile": "prior",
    "trimmed-mean": "from-above",
    "average": "symmetric",
}

RUN_DEFAULTS: dict[str, str | int | float] = {
    "op": "max",
    "n": 15,
    "graph": "rgg",
    "trials": 1000,
    "theta": 0.5,
    "init": "proposed",
    "seed": 0,
    "k": 3,
    "quantile": 0.5,
    "tolerance": 1e-9,
}
"""Defaults of :class:`nlagg_node.config.RunConfig` that the help texts state (a test keeps them equal)."""
