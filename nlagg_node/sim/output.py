"""Summaries, recorded arrays and replayable manifests of simulator runs."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from ..arrays import BoolArray, FloatArray, IntArray
from ..inputs import make_output_dir
from ..schedule import Schedule, distance_to
from ..threat import determined_by_sums
from ..valuemap import scale_for
from ..verdict import ideal_ranks
from .departures import survivor_truth
from .engine import SimResult

_PACKAGES = ("nlagg", "numpy", "scipy", "networkx", "pydantic")


def package_versions() -> dict[str, str]:
    """Versions of the packages whose behaviour determines a run's numbers."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


class SimSummary(TypedDict):
    """``nlagg sim --json`` and ``summary.json`` of a simulator run."""

    op: str
    n: int
    graph: str
    trials: int
    t_max: int  # iterations per phase
    t_total: int  # iterations over all phases
    c: float
    mu_z: float
    sigma_z: float
    theta: float
    init: str
    seed: int
    value_range: list[float] | None  # the public range; values and mse are in its units
    values: str  # the distribution, or the values file's name
    mse: float  # mean over trials, at the final iterate
    mse_max: float
    leakage_probability: list[float]  # by rank, rank 0 = largest value: every value the view determines
    matching_probability: list[float]  # by rank: matching events x_i^(t) = s_i alone
    # By rank: 1 where every exact protocol exposes the value too (nlagg_node.verdict).
    ideal_world: list[float]
    # By rank: every value the transcript determines, with the average phase's component sums
    # (a component whose other members are exposed gives away the last; nlagg_node.threat), and
    # the corrupted nodes' values (at least: their duals may give away more, which `nlagg attack` finds).
    determined_probability: list[float]
    corrupted: list[int]  # the nodes determined_probability counts as corrupted (sim --corrupt)
    determined_mean: float  # values determined per trial, on average
    # Trials whose every phase settles within `tolerance`; where departures split the graph, the
    # trials whose every survivor ends within `tolerance` of its own component's aggregate.
    converged_fraction: float
    tolerance: float  # a fraction of the value range (1 without one)
    iterations_to_converge: float | None  # median over converged trials
    max_error: float  # worst final distance of a node's output from its exact aggregate (value units)
    unconverged_trials: list[TrialError]  # trials not within `tolerance` (the 20 worst), worst first
    unconverged_count: int
    early_stop: bool  # phases end once the network is quiet (t_max a cap)
    iterations_run: float  # median over trials of the iterations every phase ran
    wall_seconds: float
    transcript: NotRequired[str]  # with --transcript: the simulated transcript's path
    final_x: NotRequired[
        dict[str, float | list[float] | None]
    ]  # one trial: each node's output (None: departed)
    departed: NotRequired[dict[str, int]]  # --depart: node -> the iteration it left at
    # Early stopping, several trials: the share of trials in which each planned departure happened
    # (where its component had stopped before, the node finished the run instead).
    departed_fraction: NotRequired[dict[str, float]]
    survivors: NotRequired[list[int]]
    components: NotRequired[list[list[int]]]  # trial 0's connected parts of the survivors
    per_component: NotRequired[list[ComponentResult]]  # trial 0's components, judged on their own
    warnings: NotRequired[list[str]]  # one line per operator/init choice that exposes values by construction


class TrialError(TypedDict):
    """A trial that did not end within the tolerance, and its worst node's final error."""

    trial: int
    error: float


class ComponentResult(TypedDict):
    """One connected part of the survivors, judged against its own aggregate."""

    members: list[int]
    exact: bool  # every member within `tolerance` of the component's aggregate in every trial
    converged_fraction: float  # trials in which every member ends within `tolerance` of it
    max_error: float  # worst final distance over trials and members (value units)


UNCONVERGED_LISTED = 20
"""How many of the trials not within the tolerance the summary lists (the worst)."""


def final_errors(result: SimResult) -> FloatArray:
    """``(B, n)``: each node's final distance from its exact aggregate, in the user's units.

    With departures a survivor is judged against its own component's aggregate (NaN for a node
    that left); top-K takes the worst of its k values.
    """
    cfg = result.config
    if result.departed:
        lo, hi = survivor_truth(cfg, result.values, result.components)
    elif result.output.ndim == 3:
        lo, hi = result.truth_lo[:, None, :], result.truth_hi[:, None, :]
    else:
        lo, hi = result.truth_lo[:, None], result.truth_hi[:, None]
    err = distance_to(result.output, lo, hi)
    if err.ndim == 3:
        err = np.where(np.isnan(err).any(axis=2), np.nan, np.nanmax(err, axis=2, initial=0.0))
    return np.asarray(err, dtype=np.float64)


def _converged(result: SimResult, err: FloatArray) -> BoolArray:
    """Per trial: the kernel's verdict, or, where departures split the graph, every survivor
    within the tolerance of its own component's aggregate at the end."""
    ok = result.converged_iterations >= 0
    if result.departed and any(len(c) > 1 for c in result.components):
        tol = result.config.tolerance * scale_for(result.config).span
        ok = np.asarray(np.nan_to_num(err, nan=0.0).max(axis=1, initial=0.0) <= tol, dtype=bool)
    return ok


def _per_component(result: SimResult, err: FloatArray) -> list[ComponentResult]:
    tol = result.config.tolerance * scale_for(result.config).span
    out: list[ComponentResult] = []
    for members in result.components[0]:
        worst = np.nan_to_num(err[:, members], nan=0.0).max(axis=1, initial=0.0)
        within = worst <= tol
        out.append(
            {
                "members": list(members),
                "exact": bool(within.all()),
                "converged_fraction": float(within.mean()),
                "max_error": float(worst.max(initial=0.0)),
            }
        )
    return out


def determined(result: SimResult, corrupted: Sequence[int] = ()) -> BoolArray:
    """``(B, n)``: values the transcript determines: exposed (matching event or solved) and the
    ``corrupted`` nodes' own, plus, for an operator with an average phase, the last unknown member of
    an honest component (:func:`nlagg_node.threat.determined_by_sums`, the corrupted nodes cut out).

    A lower bound with corrupted nodes: the simulator's exposures are the eavesdropper's, and a
    corrupted node's duals can give away more (``nlagg attack`` on ``sim --transcript`` finds it)."""
    known = result.exposed.copy()
    known[:, list(corrupted)] = True
    avg = [k for k, p in enumerate(result.phases) if p.objective.kind == "quadratic"]
    if not avg:
        return known
    schedule = Schedule.of(result.phases)
    t0, t1 = schedule.start(avg[0]), schedule.end(avg[0])
    out = known.copy()
    n = result.config.n
    for b, edges in enumerate(result.graphs):
        gone = result.departures_of(b) if result.departed else {}
        # One stretch from the phase's second iteration, and a new one at every departure in it.
        starts = [t0 + 1, *sorted({t for t in gone.values() if t0 + 1 < t < t1})]
        cuts = [[*corrupted, *(j for j, t in gone.items() if t <= at)] for at in starts]
        out[b] = determined_by_sums(n, edges, known[b], cuts)
    return out


def summarize(result: SimResult, corrupted: Sequence[int] = ()) -> SimSummary:
    """The JSON summary of a run (``nlagg sim --json``); ``corrupted`` counts in ``determined_*``."""
    cfg = result.config
    conv = result.converged_iterations
    err = final_errors(result)
    ok = _converged(result, err)
    out = _summary(result, conv, ok)
    worst = np.nan_to_num(err, nan=0.0).max(axis=1, initial=0.0)
    out["max_error"] = float(worst.max(initial=0.0))
    bad = sorted(np.flatnonzero(~ok).tolist(), key=lambda b: -worst[b])
    out["unconverged_count"] = len(bad)
    out["unconverged_trials"] = [{"trial": b, "error": float(worst[b])} for b in bad[:UNCONVERGED_LISTED]]
    known = determined(result, corrupted)
    out["corrupted"] = sorted(corrupted)
    out["determined_probability"] = [float(p) for p in result.by_rank(known).mean(axis=0)]
    out["determined_mean"] = float(known.sum(axis=1).mean())
    if cfg.trials == 1:
        out["final_x"] = {
            str(i): None if np.isnan(v).any() else (float(v) if v.ndim == 0 else [float(a) for a in v])
            for i, v in enumerate(result.output[0])
        }
    if result.departed:
        gone = result.departures_of(0) if cfg.trials == 1 else result.departed  # one trial: what happened
        out["departed"] = {str(j): t for j, t in sorted(gone.items())}
        out["survivors"] = [i for i in range(cfg.n) if i not in gone]
        out["components"] = result.components[0]
        out["per_component"] = _per_component(result, err)
        if cfg.trials > 1 and result.departed_in:
            out["departed_fraction"] = {
                str(j): float(np.mean([j in d for d in result.departed_in])) for j in sorted(result.departed)
            }
    return out


def _summary(result: SimResult, conv: IntArray, ok: BoolArray) -> SimSummary:
    cfg = result.config
    return {
        "op": cfg.op,
        "n": cfg.n,
        "graph": cfg.graph,
        "trials": cfg.trials,
        "t_max": cfg.t_max_value,
        "t_total": result.t_total,
        "c": cfg.c_value,
        "mu_z": cfg.mu_z_value,
        "sigma_z": cfg.sigma_z_value,
        "theta": cfg.theta,
        "init": cfg.init,
        "seed": cfg.seed,
        "value_range": list(cfg.value_range) if cfg.value_range is not None else None,
        "values": cfg.values_file.name if cfg.values_file is not None else cfg.values_value,
        "mse": float(result.mse.mean()),
        "mse_max": float(result.mse.max()),
        "leakage_probability": [float(p) for p in result.leakage_probability()],
        "matching_probability": [float(p) for p in result.matching_probability()],
        "ideal_world": [float(r in ideal_ranks(cfg)) for r in range(cfg.n)],
        "determined_probability": [],
        "corrupted": [],
        "determined_mean": 0.0,
        "converged_fraction": float(ok.mean()),
        "tolerance": cfg.tolerance,
        "iterations_to_converge": float(np.median(conv[conv >= 0])) if (conv >= 0).any() else None,
        "max_error": 0.0,
        "unconverged_trials": [],
        "unconverged_count": 0,
        "early_stop": cfg.early_stop,
        "iterations_run": float(np.median(result.phase_iterations.sum(axis=1))),
        "wall_seconds": result.wall_seconds,
    }


class Manifest(TypedDict):
    """``manifest.json`` of a run: the config and seed that replay it, and the package versions."""

    kind: str  # nlagg-sim or nlagg-testbed
    config: dict[str, Any]  # RunConfig fields
    seed: int
    versions: dict[str, str]
    replay: str  # the command that replays it
    phases: NotRequired[list[dict[str, Any]]]  # simulator: name, t_len and group of each phase
    run_id: NotRequired[str]  # testbed
    corrupted: NotRequired[list[int]]
    in_process: NotRequired[bool]
    broker: NotRequired[str]


def manifest(result: SimResult) -> Manifest:
    """Everything needed to replay the run exactly: ``nlagg sim --config manifest.json``."""
    return {
        "kind": "nlagg-sim",
        "config": result.config.model_dump(mode="json"),
        "seed": result.config.seed,
        "phases": [{"name": p.name, "t_len": p.t_len, "group": p.group} for p in result.phases],
        "versions": package_versions(),
        "replay": "nlagg sim --config manifest.json --json",
    }


def write_run(result: SimResult, out: Path, summary: SimSummary | None = None) -> None:
    """Write ``summary.json``, ``arrays.npz`` and ``manifest.json`` into ``out``."""
    make_output_dir(out, "out")
    (out / "summary.json").write_text(json.dumps(summary or summarize(result), indent=2))
    (out / "manifest.json").write_text(json.dumps(manifest(result), indent=2))
    offsets = np.cumsum([0] + [len(g) for g in result.graphs])
    arrays: dict[str, Any] = {f"z0_{g}": z for g, z in result.z0.items()}
    arrays.update(
        values=result.values,
        used_values=result.used_values,
        rank=result.rank,
        output=result.output,
        truth_lo=result.truth_lo,
        truth_hi=result.truth_hi,
        mse=result.mse,
        matched=result.matched,
        first_match=result.first_match,
        exposed=result.exposed,
        first_exposed=result.first_exposed,
        converged_iterations=result.converged_iterations,
        phase_iterations=result.phase_iterations,
        recorded_t=result.recorded_t,
        recorded_x=result.recorded_x,
        graph_edges=np.concatenate(result.graphs),
        graph_offsets=offsets,
    )
    np.savez_compressed(out / "arrays.npz", **arrays)
