"""What a testbed run reports: the JSON shapes (TypedDicts) and the code that fills them.

The summary (``nlagg testbed --json``, ``summary.json``) joins three parts: what the nodes computed
(:class:`RunOutcome`, checked against the ground truth that only the testbed holds), what the
eavesdropper captured (:class:`CaptureOutcome`) and how the run was set up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from ..arrays import FloatArray, IntArray
from ..config import RunConfig
from ..departure import components, survivors
from ..private import write_private
from ..runtime.public import run_edges
from ..schedule import Schedule, distance_to, plan_phases
from ..sim.output import Manifest, package_versions
from ..valuemap import scale_for
from ..verdict import Verdict, ideal_nodes, verdict

__all__ = [
    "CaptureOutcome",
    "Component",
    "Departures",
    "ExposureCheck",
    "NodeReport",
    "RunOutcome",
    "TestbedSummary",
    "capture_outcome",
    "departure_outcome",
    "run_outcome",
    "write_outputs",
]


class NodeReport(TypedDict):
    """One node's result: the JSON line ``nlagg node --json`` prints, or a hosted node's result."""

    node: int
    output: list[float]  # the k values of top-K, else one value
    seconds: float
    rejected: int  # messages the node refused
    finals: NotRequired[list[float]]  # final x of every phase
    iterations: NotRequired[int]
    rounds_per_second: NotRequired[float]
    duplicates: NotRequired[int]
    departed: NotRequired[dict[str, int]]  # neighbours that departed: {str(j): T} (nlagg_node.departure)
    left_at: NotRequired[int]  # this node left the run at T (no output)


class RunOutcome(TypedDict):
    """What the nodes computed, against the ground truth (values and target held by the testbed)."""

    run_id: str
    op: str
    n: int
    graph: str
    edges: int
    seed: int
    true_value: float | list[float]  # a list for top-K, or when the target is an interval
    true_interval: list[list[float]]
    final_x: dict[str, float | list[float]]  # node id -> output
    exact: bool  # every output within `tolerance` of the aggregate
    tolerance: float  # the run's precision, a fraction of hi - lo of the value range (1 without one)
    mse: float
    value_range: list[float] | None  # the public range (values and outputs are in its units)
    private_values: dict[str, float]
    corrupted: list[int]
    iterations: int
    rounds_per_second: float
    node_wall_seconds: float
    messages_rejected_by_nodes: int


class ExposureCheck(TypedDict):
    """An honest node's value as the eavesdropper exposed it live, checked against the truth."""

    t: int
    value: float
    how: str
    correct: bool
    verdict: Verdict  # unavoidable or beyond the ideal world (nlagg_node.verdict)


class CaptureOutcome(TypedDict):
    """What the eavesdropper captured."""

    messages_captured: int
    messages_rejected: int
    final_x_captured: dict[str, list[float] | None]
    exposed_nodes: list[int]
    exposures: dict[str, ExposureCheck]


class Component(TypedDict):
    """One connected part of the surviving graph and what its nodes computed."""

    members: list[int]
    true_value: float | list[float]
    exact: bool  # every member within `tolerance` of the component's own aggregate
    converged_fraction: float  # the share of its members that are
    max_error: float  # the worst member's distance from it (value units)


class Departures(TypedDict):
    """Who left the run (``nlagg testbed --depart``, :mod:`nlagg_node.departure`)."""

    departed: dict[str, int]  # node -> the iteration it departed at (its last x was x^(t-1))
    survivors: list[int]
    components: list[Component]
    graph_split: bool


class TestbedSummary(RunOutcome, CaptureOutcome, Departures):
    """``nlagg testbed --json`` and ``summary.json``."""

    broker: str  # mosquitto, amqtt or external
    broker_url: str
    in_process: bool
    eavesdropper_nice: int
    wall_seconds: float
    transcript: str | None  # kept only with --out


def run_outcome(
    cfg: RunConfig,
    run_id: str,
    values: FloatArray,
    truth_lo: FloatArray,
    truth_hi: FloatArray,
    results: list[NodeReport],
    corrupt: set[int],
    node_wall: float,
    node_truth: tuple[FloatArray, FloatArray] | None = None,
) -> RunOutcome:
    """What the nodes computed, checked against the ground truth.

    With departures, ``results`` holds the survivors only and ``node_truth`` each node's truth
    ``(n, k)`` (its component's aggregate, :func:`~nlagg_node.sim.departures.survivor_truth`).
    """
    planned = Schedule.of(plan_phases(cfg)).t_total  # every iteration, unless phases stopped early
    t_total = max((int(r.get("iterations", planned)) for r in results), default=planned)
    lo, hi = np.ravel(truth_lo[0]), np.ravel(truth_hi[0])
    outputs = {r["node"]: [float(v) for v in r["output"]] for r in results}
    nodes = sorted(outputs)
    span = scale_for(cfg).span
    if node_truth is None:
        err = np.array([distance_to(np.array(outputs[i]), lo, hi) for i in nodes]) / span
    else:
        err = np.array(
            [distance_to(np.array(outputs[i]), *(np.ravel(a[i]) for a in node_truth)) for i in nodes]
        )
        err = err / span
    slowest = max(float(r["seconds"]) for r in results)
    single = cfg.op != "topk"
    return {
        "run_id": run_id,
        "op": cfg.op,
        "n": cfg.n,
        "graph": cfg.graph,
        "edges": len(run_edges(cfg)),
        "seed": cfg.seed,
        "true_value": float(lo[0]) if single and lo[0] == hi[0] else [float(v) for v in lo],
        "true_interval": [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)],
        "final_x": {str(i): (outputs[i][0] if single else outputs[i]) for i in nodes},
        "exact": bool((err <= cfg.tolerance).all()),
        "tolerance": cfg.tolerance,
        "mse": float(((err * span) ** 2).sum(axis=1).mean()),
        "value_range": list(cfg.value_range) if cfg.value_range is not None else None,
        "private_values": {str(i): float(values[i]) for i in range(cfg.n)},
        "corrupted": sorted(corrupt),
        "iterations": t_total,
        "rounds_per_second": t_total / slowest if slowest > 0 else 0.0,
        "node_wall_seconds": node_wall,
        "messages_rejected_by_nodes": sum(r["rejected"] for r in results),
    }


def departure_outcome(
    cfg: RunConfig,
    departed: dict[int, int],
    edges: IntArray,
    node_truth: tuple[FloatArray, FloatArray],
    outputs: dict[int, list[float]],
) -> Departures:
    """Who left, who stayed, and each connected part of the survivors with its own exact result."""
    comps = components(cfg.n, edges, departed)
    span = scale_for(cfg).span
    out: list[Component] = []
    for comp in comps:
        lo, hi = np.ravel(node_truth[0][comp[0]]), np.ravel(node_truth[1][comp[0]])
        errs = [float(distance_to(np.array(outputs[i]), lo, hi).max()) for i in comp if i in outputs]
        within = [e / span <= cfg.tolerance for e in errs]
        true: float | list[float] = (
            float(lo[0]) if cfg.op != "topk" and lo[0] == hi[0] else [float(v) for v in lo]
        )
        out.append(
            {
                "members": comp,
                "true_value": true,
                "exact": bool(within) and all(within),
                "converged_fraction": sum(within) / len(comp),
                "max_error": max(errs, default=0.0),
            }
        )
    return {
        "departed": {str(j): t for j, t in sorted(departed.items())},
        "survivors": survivors(cfg.n, departed),
        "components": out,
        "graph_split": len(comps) > 1,
    }


def capture_outcome(
    cfg: RunConfig,
    values: FloatArray,
    corrupt: set[int],
    exposures: list[dict[str, Any]],
    captured: dict[int, list[float] | None],
    stored: int,
    finished: dict[str, Any],
) -> CaptureOutcome:
    """What the eavesdropper got, checked against the ground truth."""
    honest = [e for e in exposures if int(e["node"]) not in corrupt]
    allowed = ideal_nodes(cfg, values)
    tol = 1e-9 * scale_for(cfg).span  # exposures arrive mapped back to the user's units
    return {
        "messages_captured": stored,
        "messages_rejected": int(finished.get("rejected", 0)),
        "final_x_captured": {str(i): captured.get(i) for i in range(cfg.n)},
        "exposed_nodes": sorted({int(e["node"]) for e in honest}),
        "exposures": {
            str(e["node"]): {
                "t": int(e["t"]),
                "value": float(e["value"]),
                "how": str(e["how"]),
                "correct": bool(abs(float(e["value"]) - float(values[int(e["node"])])) <= tol),
                "verdict": verdict(exposed=True, ideal=int(e["node"]) in allowed),
            }
            for e in honest
        },
    }


def write_outputs(out: Path, cfg: RunConfig, summary: TestbedSummary) -> None:
    """``summary.json`` and ``manifest.json`` (the config and seed that replay the run) into ``out``."""
    write_private(out / "summary.json", json.dumps(summary, indent=2))  # it holds the private values
    manifest: Manifest = {
        "kind": "nlagg-testbed",
        "config": cfg.model_dump(mode="json"),
        "seed": cfg.seed,
        "run_id": summary["run_id"],
        "corrupted": summary["corrupted"],
        "in_process": summary["in_process"],
        "broker": summary["broker"],
        "versions": package_versions(),
        "replay": "nlagg sim --config manifest.json --trials 1 --record all  (same numbers, bit for bit)",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
