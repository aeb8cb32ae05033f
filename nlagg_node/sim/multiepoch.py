"""Privacy over time: K epochs of a deployment in the batched simulator.

Every epoch is one run of :func:`~nlagg_node.sim.engine.simulate` on the same graphs (a deployment's
graph is fixed) with that epoch's values and fresh z^(0) (the nodes' generators of the epoch's seed,
:func:`~nlagg_node.epochplan.epoch_seed`). Every epoch decision is the epoch planner's
(:mod:`nlagg_node.epochplan`, the one the nodes follow): the values' bounded random walk
(:func:`~nlagg_node.epochplan.walk_values`), and for epoch ``k >= 1`` the warm start at epoch
``k - 1``'s published output unless ``warm`` is off; a node outside the warm start's band runs a
random shell value (its exposure reveals no value and is not counted), and a trial whose warm run's
output check fails (:meth:`~nlagg_node.warm.WarmStart.falls_back`) reruns the epoch cold: both runs'
exposures count. So one trial of K epochs is a testbed's K epochs with the same seed, bit for bit.
``values`` (``--values-file``) gives other paths than the walk, e.g. jumps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import BoolArray, FloatArray, IntArray
from ..config import RunConfig
from ..epochplan import (
    HeardOutput,
    Starter,
    epoch_start,
    published_output,
    shell_uniforms,
    used_values,
    walk_values,
    warms,
)
from ..errors import ConfigError
from ..valuechecks import check_values
from ..valuemap import scale_for
from ..verdict import ideal_ranks
from ..warm import WarmStart, warm_start
from .engine import EpochInputs, SimResult, simulate
from .values import read_value_rows

__all__ = ["EpochsResult", "read_epoch_values", "simulate_epochs"]

EpochProgress = Callable[[int, int], None]


def read_epoch_values(path: Path, n: int, epochs: int, trials: int) -> FloatArray:
    """``--values-file`` of a multi-epoch run, shape ``(K, B, n)``: one row per epoch (every trial
    alike), or one row per epoch per trial, epoch by epoch (rows ``k B .. k B + B - 1`` are epoch k's)."""
    rows = read_value_rows(path, n)
    if len(rows) == epochs:
        return np.repeat(rows[:, None, :], trials, axis=1)
    if len(rows) == epochs * trials:
        return rows.reshape(epochs, trials, n)
    why = f"{len(rows)} rows: give epochs={epochs} rows or epochs x trials={epochs * trials} rows"
    raise ConfigError("values_file", str(path), why)


@dataclass
class EpochsResult:
    """What K epochs produced. Shapes: K epochs, B trials, n nodes.

    ``rank[k, b, i]`` is node i's rank in epoch k (0 = largest value); it and ``ideal`` follow
    from the values and the config.
    """

    config: RunConfig
    drift: float
    warm: bool
    values: FloatArray  # (K, B, n) user units
    exposed: BoolArray  # (K, B, n): determined in the epoch (its warm run or its cold rerun)
    output: FloatArray  # (K, B) node 0's output (user units)
    exact: BoolArray  # (K, B) every node within the tolerance of the epoch's aggregate
    iterations: IntArray  # (K, B) iterations the epoch ran (warm run plus any cold rerun)
    fell_back: BoolArray  # (K, B) the warm run's output check failed and the epoch reran cold
    stray: (
        BoolArray  # (K, B) a non-aggregate value entered a certified candidate (SimResult.stray_candidates)
    )
    wall_seconds: float = 0.0
    rank: IntArray = field(init=False)  # (K, B, n)
    ideal: BoolArray = field(init=False)  # (K, B, n): the ideal world exposes it (it holds the output)

    def __post_init__(self) -> None:
        self.rank = np.argsort(np.argsort(-self.values, axis=2, kind="stable"), axis=2)
        self.ideal = _ideal_mask(self.config, self.rank)

    @property
    def epochs(self) -> int:
        return int(self.values.shape[0])

    def _by_rank(self, per_node: BoolArray, rank: IntArray) -> FloatArray:
        """Mean over trials of ``per_node`` (B, n) with column r the node of rank r."""
        order = np.argsort(rank, axis=1)
        return np.asarray(np.take_along_axis(per_node, order, axis=1).mean(axis=0), dtype=np.float64)

    def leakage_by_epoch(self) -> FloatArray:
        """``(K, n)``: per epoch, the fraction of trials exposing each rank (that epoch's ranks)."""
        return np.array([self._by_rank(self.exposed[k], self.rank[k]) for k in range(self.epochs)])

    def leakage_probability(self) -> FloatArray:
        """By rank, the mean over epochs of the per-epoch leakage probability."""
        return np.asarray(self.leakage_by_epoch().mean(axis=0), dtype=np.float64)

    def cumulative_leakage_probability(self) -> FloatArray:
        """By rank of the first epoch's values: the fraction of trials exposing the node in at
        least one of the K epochs."""
        return self._by_rank(np.asarray(self.exposed.any(axis=0), dtype=bool), self.rank[0])

    def cumulative_beyond_ideal(self) -> FloatArray:
        """By rank of the first epoch's values: the fraction of trials exposing the node in at
        least one epoch in which the ideal world did not (it did not hold that epoch's output)."""
        beyond = np.asarray((self.exposed & ~self.ideal).any(axis=0), dtype=bool)
        return self._by_rank(beyond, self.rank[0])

    def iterations_by_epoch(self) -> FloatArray:
        """Median over trials of each epoch's iterations."""
        return np.asarray(np.median(self.iterations, axis=1), dtype=np.float64)

    def summary(self) -> dict[str, Any]:
        """The multi-epoch figures of ``nlagg sim --epochs K --json``; with one trial (a deployment,
        what ``nlagg testbed --epochs K`` runs) also each epoch's output (node 0's, user units)."""
        one = {"output_by_epoch": _floats(self.output[:, 0])} if self.output.shape[1] == 1 else {}
        return {
            "epochs": self.epochs,
            "drift": self.drift,
            "warm_start": self.warm,
            "leakage_probability": _floats(self.leakage_probability()),
            "cumulative_leakage_probability": _floats(self.cumulative_leakage_probability()),
            "cumulative_beyond_ideal": _floats(self.cumulative_beyond_ideal()),
            "leakage_by_epoch": [_floats(row) for row in self.leakage_by_epoch()],
            "iterations_by_epoch": _floats(self.iterations_by_epoch()),
            "exact_fraction_by_epoch": _floats(self.exact.mean(axis=1)),
            "fallback_fraction_by_epoch": _floats(self.fell_back.mean(axis=1)),
            "stray_candidate_fraction": float(self.stray.mean()),
            **one,
            "wall_seconds": self.wall_seconds,
        }


def _floats(a: Any) -> list[float]:
    return [float(v) for v in np.asarray(a).ravel()]


def _exact(res: SimResult) -> BoolArray:
    """Per trial: every node within the tolerance of the epoch's aggregate (of the true values)."""
    from ..schedule import distance_to

    tol = res.config.tolerance * scale_for(res.config).span
    err = distance_to(res.output, res.truth_lo[:, None], res.truth_hi[:, None])
    return np.asarray(err.reshape(len(err), -1).max(axis=1) <= tol, dtype=bool)


@dataclass(frozen=True)
class _WarmEpoch:
    """Epoch k warm-started: its config (the warm start's ``c``), inputs, each trial's warm start,
    and the nodes outside the band (they run a shell value, so their exposures reveal no value)."""

    cfg: RunConfig
    inputs: EpochInputs
    starts: list[WarmStart]
    outside: BoolArray  # (B, n)


def _warm_epoch(
    cfg: RunConfig, k: int, values: FloatArray, last: FloatArray, drift: float, starter: Starter
) -> _WarmEpoch:
    """Epoch k warm-started at the outputs ``last`` (B, n) of epoch k - 1, each trial from their
    published output (:func:`~nlagg_node.epochplan.published_output`), as the nodes start it
    (:func:`~nlagg_node.epochplan.epoch_start`, shell values from
    :func:`~nlagg_node.epochplan.shell_uniforms`)."""
    held = [HeardOutput(k - 1, published_output([float(y) for y in row], cfg.n)) for row in last]
    plans = [epoch_start(cfg, k, h, drift, starter) for h in held]
    starts = [p.warm for p in plans]
    assert all(ws is not None for ws in starts)  # warms(cfg) and every trial holds an output
    proto = np.asarray(scale_for(cfg).to_protocol(values), dtype=np.float64)
    B, n = proto.shape
    draws = shell_uniforms(cfg.seed, k, B, n)
    used = np.stack([used_values(p, proto[b], draws[b]) for b, p in enumerate(plans)])
    warm = [ws for ws in starts if ws is not None]
    outside = np.array([[not ws.in_band(float(v)) for v in row] for ws, row in zip(warm, proto, strict=True)])
    inputs = EpochInputs(k, values, tuple(ws.init for ws in warm), used)
    return _WarmEpoch(plans[0].cfg, inputs, warm, outside.reshape(B, n))


@dataclass(frozen=True)
class _EpochRun:
    """One epoch's figures (:class:`EpochsResult`'s, for that epoch): B trials, n nodes."""

    exposed: BoolArray  # (B, n)
    output: FloatArray  # (B,)
    exact: BoolArray  # (B,)
    iterations: IntArray  # (B,)
    fell_back: BoolArray  # (B,)
    stray: BoolArray  # (B,)
    outputs: FloatArray  # (B, n) every node's (top-K: its first value): the next warm start's


def _first_values(res: SimResult) -> FloatArray:
    """Every node's output (B, n), a top-K output's first value."""
    return np.array(res.output.reshape(*res.output.shape[:2], -1)[:, :, 0], dtype=np.float64)


def _run_epoch(cfg: RunConfig, k: int, values: FloatArray, warm: _WarmEpoch | None) -> _EpochRun:
    """Epoch k with its ``values`` (B, n): cold, or ``warm``-started with a cold rerun of the trials
    whose warm output check fails (both runs' exposures and iterations count)."""
    B = len(values)
    if warm is None:
        res = simulate(cfg, epoch=EpochInputs(k, values))
        exposed = res.exposed
    else:
        res = simulate(warm.cfg, epoch=warm.inputs)
        exposed = res.exposed & ~warm.outside  # a shell value exposed reveals no value
    outputs = _first_values(res)
    output = outputs[:, 0].copy()
    exact = _exact(res)
    iterations = np.asarray(res.phase_iterations.sum(axis=1), dtype=np.int64)
    fell_back = np.zeros(B, dtype=bool)
    stray = res.stray_candidates()
    if warm is not None:
        proto_out = scale_for(cfg).to_protocol(output)
        fb = np.array([ws.falls_back(float(y)) for ws, y in zip(warm.starts, proto_out, strict=True)])
        if fb.any():
            cold = simulate(cfg, epoch=EpochInputs(k, values, rerun=True))
            exposed[fb] |= cold.exposed[fb]
            outputs[fb] = _first_values(cold)[fb]
            output[fb], exact[fb] = outputs[fb, 0], _exact(cold)[fb]
            iterations[fb] += cold.phase_iterations.sum(axis=1)[fb]
            stray[fb] |= cold.stray_candidates()[fb]
            fell_back = fb
    return _EpochRun(exposed, output, exact, iterations, fell_back, stray, outputs)


def _ideal_mask(cfg: RunConfig, rank: IntArray) -> BoolArray:
    ideal = ideal_ranks(cfg)
    return np.isin(rank, ideal) if ideal else np.zeros(rank.shape, dtype=bool)


def simulate_epochs(
    cfg: RunConfig,
    epochs: int,
    drift: float,
    *,
    warm: bool = True,
    values: FloatArray | None = None,
    progress: EpochProgress | None = None,
    starter: Starter = warm_start,
) -> EpochsResult:
    """Simulate ``epochs`` epochs of ``cfg.trials`` deployments.

    Parameters
    ----------
    cfg
        The run configuration of every epoch.
    epochs
        K >= 1.
    drift
        The declared drift D (a fraction of the value range, or value units without one): the
        random walk's step bound and the warm start's (:func:`nlagg_node.warm.warm_start`).
    warm
        Warm-start epochs ``k >= 1`` where :func:`warms` (the others run cold anyway); False runs
        every epoch cold (``--cold-start``).
    values
        ``(K, B, n)`` values in user units; default ``cfg.values_file``'s
        (:func:`read_epoch_values`), else :func:`walk_values`.
    progress
        Called as ``progress(done, K)`` after each epoch.
    starter
        Makes each warm start (:func:`~nlagg_node.warm.warm_start`; a benchmark passes a naive one).
    """
    started = time.perf_counter()
    cfg = cfg.resolved()
    if epochs < 1:
        raise ConfigError("epochs", epochs, "must be at least 1")
    if not (math.isfinite(drift) and drift >= 0.0):
        raise ConfigError("drift", drift, "must be a finite number >= 0")
    if values is not None:
        vals = np.asarray(values, dtype=np.float64)
    elif cfg.values_file is not None:
        vals = read_epoch_values(cfg.values_file, cfg.n, epochs, cfg.trials)
    else:
        vals = walk_values(cfg, epochs, drift)
    check_values(cfg, vals)
    warm = warm and warms(cfg)
    K = len(vals)
    runs: list[_EpochRun] = []
    for k in range(K):
        warm_k = _warm_epoch(cfg, k, vals[k], runs[-1].outputs, drift, starter) if warm and k > 0 else None
        runs.append(_run_epoch(cfg, k, vals[k], warm_k))
        if progress is not None:
            progress(k + 1, K)
    return EpochsResult(
        config=cfg,
        drift=drift,
        warm=warm,
        values=vals,
        exposed=np.stack([run.exposed for run in runs]),
        output=np.stack([run.output for run in runs]),
        exact=np.stack([run.exact for run in runs]),
        iterations=np.stack([run.iterations for run in runs]),
        fell_back=np.stack([run.fell_back for run in runs]),
        stray=np.stack([run.stray for run in runs]),
        wall_seconds=time.perf_counter() - started,
    )
