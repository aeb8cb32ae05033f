"""Where each phase of an early-stopping run ended, read from its captured x's alone.

With early stopping (:mod:`nlagg_node.termination`) a phase ends before its ``t_len``; where
departures split the graph, each connected component ends it at its own iteration. The offline
attack (:func:`adversary.live.replay_exposures`, :func:`adversary.attack.attack_arrays`) and the
transcript's completeness check need those ends from a transcript's ``(n, T)`` x's (NaN where
nothing was captured): :func:`phase_spans` per phase, :func:`node_ends` per node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from nlagg_node.arrays import FloatArray, IntArray
from nlagg_node.departure import components
from nlagg_node.schedule import Phase, Schedule

__all__ = ["iterations_run", "node_ends", "node_iterations_run", "phase_spans"]


def phase_spans(phases: Sequence[Phase], x: FloatArray) -> list[tuple[int, int]]:
    """``[start, end)`` of the iterations each phase of an early-stopping run ran, from its
    ``(n, T)`` x's: up to the phase's last iteration with any x (every node skipped the rest);
    ``end == start`` for a phase without any."""
    any_x = np.asarray(np.isfinite(x).any(axis=0), dtype=bool)
    spans: list[tuple[int, int]] = []
    schedule = Schedule.of(phases)
    for p in range(len(phases)):
        start = schedule.start(p)
        seen = np.flatnonzero(any_x[start : schedule.end(p)])
        spans.append((start, start + int(seen[-1]) + 1 if len(seen) else start))
    return spans


def iterations_run(phases: Sequence[Phase], x: FloatArray) -> list[int]:
    """The iterations an early-stopping run ran (:func:`phase_spans`), in order."""
    return [t for start, end in phase_spans(phases, x) for t in range(start, end)]


def node_ends(
    phases: Sequence[Phase],
    x: FloatArray,
    edges: IntArray | None = None,
    departed: Mapping[int, int] | None = None,
    known: Sequence[Mapping[int, int]] | None = None,
) -> IntArray:
    """``(phases, n)``: where each node's part of each phase of an early-stopping run ended
    (exclusive; the phase's start where the node ran none of it), from its ``(n, T)`` x's.

    ``known``: per phase, node -> the last iteration it ran, where the x it halted with was read
    (:attr:`adversary.rules.PhaseEnds.by_phase`: its stop fields through the protocol's
    :func:`~nlagg_node.protocol.halt_span`, the rule itself). Such an end is the node's; the rest
    of this function infers the others from the x's alone (a run whose fields were not kept, or a
    node whose halting x the capture lost).

    A node ends a phase after its last x there. With ``edges`` a node's end is its connected
    component's: the nodes of a component stop together (:mod:`nlagg_node.termination`), so an x
    the capture lost at the end of one node's part is a gap, not a stop. A node that departs at T
    (``departed``) runs its phase up to T; the components are those of the nodes still there at the
    end of the phase (:func:`nlagg_node.departure.components`). Without departures a connected graph
    is one component: every node ends where the phase's span does (:func:`phase_spans`).
    """
    n = x.shape[0]
    gone = dict(departed or {})
    finite = np.isfinite(x)
    out = np.zeros((len(phases), n), dtype=np.int64)
    schedule = Schedule.of(phases)
    for p in range(len(phases)):
        start = schedule.start(p)
        seg = finite[:, start : schedule.end(p)]
        width = seg.shape[1]
        has = seg.any(axis=1)
        last = width - 1 - np.argmax(seg[:, ::-1], axis=1) if width else np.zeros(n, dtype=np.int64)
        end = np.where(has, start + last + 1, start).astype(np.int64)
        for i, halted in (known[p] if known is not None else {}).items():
            end[i] = halted + 1
        if edges is not None:
            span_end = int(end.max()) if n else start
            here = {j: at for j, at in gone.items() if 0 <= j < n and at <= max(span_end - 1, start)}
            for comp in components(n, edges, here):
                end[comp] = end[comp].max()
            for j, at in here.items():
                end[j] = min(max(at, start), start + width)  # it ran up to T (or none of this phase)
        out[p] = end
    return out


def node_iterations_run(phases: Sequence[Phase], x: FloatArray, ends: IntArray | None = None) -> IntArray:
    """``(n,)``: the iterations each node of an early-stopping run ran (:func:`node_ends`), in all."""
    ends = node_ends(phases, x) if ends is None else ends
    starts = np.asarray(Schedule.of(phases).starts[:-1], dtype=np.int64)
    return np.asarray((ends - starts[:, None]).sum(axis=0), dtype=np.int64)
