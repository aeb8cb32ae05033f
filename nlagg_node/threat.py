"""The threat model as data: which initial duals the eavesdropper knows, and what that determines.

Protocol v1 publishes every z^(0) (:data:`AVERAGE_DUALS_PUBLIC`), so an eavesdropper replays the
public z-recursion and knows ``v_i^(t)`` of every node. In an average-consensus phase the x-update
``x_i = (s_i - v_i) / (1 + c d_i)`` is then a linear equation in s_i alone: the value used is
recovered exactly at the phase's first iteration. A node stays hidden only while some dual on
one of its edges is unknown (the unknown part never decays: for theta = 1/2 it persists in v_i).

The per-directed-edge ``known`` mask is the plug-in point for a protocol that hides z^(0) (sealed
initialization): the simulator, ``nlagg sim``'s leakage figures and the warnings all go through
:func:`known_duals` and :func:`solvable`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]

__all__ = ["AVERAGE_DUALS_PUBLIC", "known_duals", "solvable"]

AVERAGE_DUALS_PUBLIC = True
"""Protocol v1: every z^(0), the average group's included, is published in plaintext."""


def known_duals(group: str, n_directed_edges: int) -> BoolArray:
    """Which z_{i|j}^(0) of dual group ``group`` the eavesdropper knows, per directed edge."""
    del group  # protocol v1 publishes every group alike
    return np.full(n_directed_edges, AVERAGE_DUALS_PUBLIC, dtype=bool)


def solvable(src: IntArray, dst: IntArray, n_nodes: int, known: BoolArray) -> BoolArray:
    """Nodes whose value an average-consensus x determines: every dual on each of their edges known.

    Parameters
    ----------
    src, dst
        Directed edges (``EdgeLayout`` order); edge e carries z_{src|dst}.
    n_nodes
        Number of nodes (of all trials, for a batched layout).
    known
        Per directed edge, whether its z^(0) is known to the eavesdropper.
    """
    unknown = ~np.asarray(known, dtype=bool)
    hidden = np.zeros(n_nodes, dtype=bool)
    hidden[np.asarray(src)[unknown]] = True
    hidden[np.asarray(dst)[unknown]] = True
    return ~hidden
