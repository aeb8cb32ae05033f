"""Summaries, recorded arrays and replayable manifests of simulator runs."""

from __future__ import annotations

import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from ..arrays import BoolArray, IntArray
from ..inputs import make_output_dir
from ..verdict import ideal_ranks
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
    ideal_world: list[
        float
    ]  # by rank: 1 where every exact protocol exposes the value too (nlagg_node.verdict)
    converged_fraction: float  # trials whose every phase settles within `tolerance`
    tolerance: float  # a fraction of the value range (1 without one)
    iterations_to_converge: float | None  # median over converged trials
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
    warnings: NotRequired[list[str]]  # one line per operator/init choice that exposes values by construction


def summarize(result: SimResult) -> SimSummary:
    """The JSON summary of a run (``nlagg sim --json``)."""
    cfg = result.config
    conv = result.converged_iterations
    ok = conv >= 0
    out = _summary(result, conv, ok)
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
        "converged_fraction": float(ok.mean()),
        "tolerance": cfg.tolerance,
        "iterations_to_converge": float(np.median(conv[ok])) if ok.any() else None,
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
