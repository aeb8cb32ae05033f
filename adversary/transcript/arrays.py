"""What the transcript attack reads from a transcript file: the public part of one run as arrays.

Besides the captured messages, the adversary knows what the public configuration fixes (a sealed
dual group without a random part) and what the corrupted nodes forwarded; :func:`public_z0` and
:func:`load_transcript_arrays` put the three together. Ground truth for scoring is read by
:func:`read_truth`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.config import RunConfig
from nlagg_node.departure import announced
from nlagg_node.errors import ConfigError
from nlagg_node.schedule import Phase, Schedule
from nlagg_node.valuemap import ValueScale

if TYPE_CHECKING:
    from nlagg_node.runtime.wire import StatusMsg

__all__ = ["TranscriptData", "first_matches", "load_transcript_arrays", "public_z0", "read_truth"]


class TranscriptData(TypedDict):
    """What the attack reads from a transcript file (:func:`load_transcript_arrays`)."""

    cfg: RunConfig
    run_id: str
    n: int
    edges: IntArray
    phases: list[Phase]
    cs: list[float]  # c of every phase
    theta: float
    z0: dict[str, FloatArray]  # per dual group, EdgeLayout order
    x: FloatArray  # (n, T), NaN where not captured; T: up to the last iteration captured
    t_total: int  # the run's iterations (its config's schedule)
    corrupted: dict[int, float]  # corrupted node -> its forwarded s_i, in the user's units
    statuses: dict[int, StatusMsg]
    departed: dict[int, int]  # node -> the iteration it left at (its neighbours' statuses)
    scale: ValueScale  # the run's public value range (x and z0 are on the protocol's scale)
    finals: FloatArray | None  # a certified run: each candidate its node ended a phase with (n, T), else None
    ends: list[dict[int, int]] | None  # early stopping: per phase, node -> its last iteration (PhaseEnds)


def load_transcript_arrays(path: str | Path) -> TranscriptData:
    """Read what the attack needs from a transcript file (``adversary.transcript.writer`` format)."""
    from nlagg_node.protocol import RunShape
    from nlagg_node.runtime.public import config_from_msg
    from nlagg_node.schedule import phase_c, plan_phases
    from nlagg_node.valuemap import scale_for

    from ..live import forwarded_z0
    from ..rules import PhaseEnds
    from .writer import Transcript

    p = Path(path)
    with Transcript.open_read_only(p) as tr:
        msg = tr.config()
        if msg is None:
            raise ConfigError("transcript", str(p), "holds no run configuration (no config message)")
        cfg, edges = config_from_msg(msg)
        phases = plan_phases(cfg)
        t_total = Schedule.of(phases).t_total
        scale = scale_for(cfg)
        states = tr.adv_states()
        corrupted = {m.node: scale.user_float(float(m.s)) for m in states}
        # What the wire showed, what the config fixes, and what the corrupted nodes forwarded.
        z0 = forwarded_z0(cfg.n, edges, phases, public_z0(cfg, edges, phases, tr.z0(cfg.n, edges)), states)
        shape = RunShape(cfg, edges)
        # Where the x's a node halted with say it ended each phase: the rules' record, read again.
        ends = PhaseEnds(shape).note_stops(tr.x_stops(cfg.n, t_total)).by_phase if cfg.early_stop else None
        return {
            "scale": scale,
            "cfg": cfg,
            "run_id": tr.run_id,
            "n": cfg.n,
            "edges": edges,
            "phases": phases,
            "cs": [phase_c(cfg, ph) for ph in phases],
            "theta": cfg.theta,
            "z0": z0,
            "x": tr.x(cfg.n)[:, :t_total],  # sized by what was captured, not by the config's t_total
            "t_total": t_total,
            "corrupted": corrupted,
            "statuses": (statuses := tr.statuses()),
            "departed": announced(st.departed for st in statuses.values()),
            "finals": tr.x_finals(cfg.n, t_total, shape.reach) if cfg.certified else None,
            "ends": ends,
        }


def public_z0(
    cfg: RunConfig, edges: IntArray, phases: Sequence[Phase], captured: Mapping[str, FloatArray]
) -> dict[str, FloatArray]:
    """The captured z^(0), plus those the public configuration fixes: a sealed group without a
    random part (``init none``, ``sigma_z = 0``) is ``a_ij`` times its mean on every edge."""
    from nlagg_node.graphs import EdgeLayout
    from nlagg_node.schedule import sealed_groups_of, secret_groups_of

    layout = EdgeLayout.from_graphs(cfg.n, [edges])
    out = {g: np.asarray(z, dtype=np.float64).copy() for g, z in captured.items()}
    fixed = sealed_groups_of(cfg, list(phases)) - secret_groups_of(cfg, list(phases))
    for ph in phases:
        if ph.group in fixed and ph.group not in out:
            mean = 0.0 if ph.init.kind == "zero" else ph.init.mean_per_sign()
            out[ph.group] = layout.sign * mean
    return out


def read_truth(path: Path) -> dict[str, Any]:
    """A ground-truth JSON object (a testbed summary.json), or a one-line error naming the file."""
    from nlagg_node.inputs import parse_document, read_input_text

    doc = parse_document(read_input_text(path, "truth"), "JSON", "truth", path)
    if not isinstance(doc, dict):
        raise ConfigError("truth", str(path), "expected a JSON object (a testbed summary.json)")
    return doc


def first_matches(x: FloatArray, s: FloatArray) -> IntArray:
    """First t with ``x_i^(t) = s_i`` per node (-1 if none)."""
    eq = x == s[:, None]
    return np.asarray(np.where(eq.any(axis=1), eq.argmax(axis=1), -1), dtype=np.int64)
