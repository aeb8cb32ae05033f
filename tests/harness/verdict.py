"""The one verdict of every harness: a run of real processes against the simulator's trial 0.

:class:`~tests.harness.faults.FaultBed` (a testbed under faults) and :class:`~tests.harness.planbed.PlanBed`
(a deployment plan) both end with :func:`judge`: the nodes' outputs, and every x, z^(0) and forwarded
state in the transcript, must be the simulator's bit for bit for the same config and seed (with the
departures the survivors report), and the transcript must hold each of them once.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adversary.attack import attack_transcript
from adversary.simulated import trial_x
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.schedule import plan_phases, sealed_groups_of
from nlagg_node.sim import SimResult, simulate

__all__ = [
    "TranscriptCheck",
    "Verdict",
    "assert_transcript_holds",
    "assert_transcript_is_simulation",
    "check_transcript",
    "judge",
]


@dataclass
class Verdict:
    """How a run of real processes compares with the simulator's run of the same config and seed."""

    completed: bool  # every node that did not depart finished with a result, nothing else went wrong
    identical: bool  # every node's output and every captured x / z^(0) equal the simulator's
    lost: int  # the run's x, z^(0) and corrupted nodes' forwarded states missing from the transcript
    extra: int  # valid x / z^(0) / forwarded-state rows beyond one per topic and iteration (kept forgeries)
    rejected_by_nodes: int  # messages the nodes refused (the sum of their results' ``rejected``)
    rejected_by_eavesdropper: int  # messages the eavesdropper refused (its ``finished`` event)
    precision: float | None = None  # of the attack on the transcript, scored with the true values
    detail: list[str] = field(default_factory=list)


def judge(
    cfg: RunConfig,
    transcript: Path,
    results: Mapping[int, Mapping[str, Any]],
    detail: list[str],
    *,
    eavesdropper: Mapping[str, Any],
    corrupt: Collection[int] = (),
    gone: Collection[int] = (),
    truth: Path | None = None,
) -> Verdict:
    """Compare a finished run with the simulator's trial 0 of ``cfg`` (``trials`` 1).

    Parameters
    ----------
    cfg : the run's resolved configuration.
    transcript : the eavesdropper's transcript of the run.
    results : each node's final result (its ``output``, ``rejected`` and ``departed`` fields).
    detail : what already went wrong (a node's exit code, a timeout); the verdict appends to it.
    eavesdropper : the eavesdropper's ``finished`` event (``rejected``: the messages it refused, each
        time it captured one); empty if it did not finish.
    corrupt : the nodes that forward their state to the adversary (one state per iteration each).
    gone : nodes killed for good; the survivors must report exactly these as departed.
    truth : where to write the true values and score the attack on the transcript (``precision``).
    """
    departed = {int(j): int(t) for r in results.values() for j, t in r.get("departed", {}).items()}
    if set(departed) != set(gone):
        detail.append(f"departures reported {departed}, nodes killed for good {sorted(gone)}")
    sim = simulate(cfg.model_copy(update={"record": "all"}), departures=departed)
    here = [i for i in range(cfg.n) if i not in departed]
    completed = len(results) == len(here) and not detail
    identical = completed and _outputs_match(sim, results, here)
    if completed and not identical:
        detail.append("node outputs differ from the simulator's")
    seen = check_transcript(sim, cfg.n, transcript, corrupt)
    detail.extend(seen.detail)
    if seen.lost:
        detail.append(f"{seen.lost} expected messages missing from the transcript")
    precision = None
    if truth is not None:
        values = {str(i): float(v) for i, v in enumerate(sim.values[0])}
        truth.write_text(json.dumps({"private_values": values}))
        precision = attack_transcript(transcript, truth=truth).precision
    return Verdict(
        completed=completed,
        identical=identical and seen.same,
        lost=seen.lost,
        extra=seen.extra,
        rejected_by_nodes=sum(int(r.get("rejected", 0)) for r in results.values()),
        rejected_by_eavesdropper=int(eavesdropper.get("rejected", 0)),
        precision=precision,
        detail=detail,
    )


def assert_transcript_is_simulation(cfg: RunConfig, db: Path) -> None:
    """A testbed run's transcript is the simulator's trial 0 of ``cfg`` (:func:`assert_transcript_holds`)."""
    assert_transcript_holds(simulate(cfg.model_copy(update={"trials": 1, "record": "all"})), db)


def assert_transcript_holds(sim: SimResult, db: Path, corrupt: Collection[int] | None = None) -> None:
    """The transcript at ``db`` is ``sim``'s trial 0 (recorded with ``record="all"``): every x (stop
    iterations included) and every plaintext z^(0), bit for bit; a sealed group's z^(0) never travel
    in plaintext. With ``corrupt`` (a capture of a whole run): also every state those nodes forward,
    one per x they publish, nobody else's, nothing twice, and no message the nodes would refuse."""
    seen = check_transcript(sim, sim.config.n, db, corrupt or ())
    assert seen.same, seen.detail
    assert seen.missing["x"] == 0
    resolved = sim.config.resolved()
    assert seen.z0_groups == sim.z0.keys() - sealed_groups_of(resolved, plan_phases(resolved))
    assert all(seen.missing[f"z0 {group}"] == 0 for group in seen.z0_groups)
    if corrupt is not None:
        assert (seen.missing["adv"], seen.extra, seen.invalid) == (0, 0, 0), seen


def _outputs_match(sim: SimResult, results: Mapping[int, Mapping[str, Any]], here: list[int]) -> bool:
    out = np.array([results[i]["output"] for i in here], dtype=float)
    return bool(np.array_equal(out.reshape(sim.output[0, here].shape), sim.output[0, here]))


@dataclass
class TranscriptCheck:
    """A transcript against the simulator's trial 0: what differs, what is missing, what is extra."""

    same: bool  # every captured x and z^(0) equals the simulator's (no x where the run published none)
    missing: dict[str, int]  # expected rows not captured: "x", "adv", and "z0 <group>" per dual group
    z0_groups: set[str]  # the dual groups whose z^(0) the transcript holds in plaintext
    extra: int  # valid x / z^(0) / forwarded-state rows beyond one per topic and iteration
    invalid: int  # rows stored as invalid (messages the nodes would not use)
    detail: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Every expected row the transcript lacks."""
        return sum(self.missing.values())


def check_transcript(sim: SimResult, n: int, path: Path, corrupt: Collection[int] = ()) -> TranscriptCheck:
    """Compare the transcript at ``path`` with trial 0 of ``sim`` (recorded with ``record="all"``).

    ``corrupt``: the nodes whose forwarded state is expected once per iteration they published an x.
    """
    with Transcript(path) as tr:
        x = tr.x(n, sim.t_total)
        z0 = tr.z0(n, sim.graphs[0])
        adv = {(s.node, s.t) for s in tr.adv_states()}
        counts = tr.valid_counts(sim.z0)
        invalid = len(tr.rejected())
    detail: list[str] = []
    want_x = trial_x(sim, 0)  # NaN where a departed node published nothing, or a phase stopped
    have = ~np.isnan(x)
    missing = {"x": int((~have & ~np.isnan(want_x)).sum())}  # a departed node's x's end at its departure
    if not np.array_equal(x[have], want_x[have]):
        detail.append("captured x's differ from the simulator's")
    n_z0 = 0
    for group, arr in sim.z0.items():
        got = z0.get(group, np.full_like(arr, np.nan))
        ok = ~np.isnan(got) & ~np.isnan(arr)
        missing[f"z0 {group}"] = int((np.isnan(got) & ~np.isnan(arr)).sum())
        n_z0 += int((~np.isnan(arr)).sum())
        if not np.array_equal(got[ok], arr[ok]):
            detail.append(f"captured z0 ({group}) differ from the simulator's")
    want_adv = {(i, int(t)) for i in corrupt for t in np.flatnonzero(~np.isnan(want_x[i]))}
    missing["adv"] = len(want_adv - adv)
    expected = {"x": int((~np.isnan(want_x)).sum()), "z0": n_z0, "adv": len(want_adv)}
    extra = sum(max(0, int(counts.get(k, 0)) - v) for k, v in expected.items())
    return TranscriptCheck(not detail, missing, set(z0), extra, invalid, detail)
