"""The threat model as data: which initial duals the eavesdropper knows, and what that determines.

An eavesdropper that knows every z^(0) of a dual group replays the public z-recursion and knows
``v_i^(t)`` of every node. In an average-consensus phase the x-update ``x_i = (s_i - v_i) / (1 + c
d_i)`` is then a linear equation in s_i alone: the value used is recovered exactly at the phase's
first iteration. A node stays hidden while some dual on one of its edges is unknown (the unknown
part never decays: for theta = 1/2 it persists in v_i).

Which duals are known depends on the initialization channel (``init_channel``, wire protocol v2):

* ``plain`` (protocol v1): every z^(0) is published, so every dual is known;
* ``sealed``: every z^(0) travels encrypted per edge (:mod:`nlagg_node.runtime.seal`); the
  adversary knows only the duals of the edges that touch a corrupted node (it forwards them);
* ``auto`` (the default): sealed for the dual groups whose privacy needs secret duals (the
  average-consensus group: ``--op average``, the trimmed mean's middle part, protected by subspace
  perturbation [Jane2020TIFS]), plain for the paper's nonlinear operators, as in its threat model.

A sealed group whose z^(0) is not random (``init none``, ``sigma_z = 0``) is known all the same:
the public configuration determines it. The simulator, ``nlagg sim``'s leakage figures and the
warnings all go through :func:`secret_groups`, :func:`known_duals` and :func:`solvable`.

Even with secret duals an average phase reveals one sum per honest connected component (the graph
without the corrupted nodes; paper Sec. V-C, [Jane2020TIFS]): with theta = 1/2, after one iteration
``a_ij z_{i|j} + a_ji z_{j|i} = -c (x_i + x_j)`` on every edge, and the unknown differences cancel
in the sum of a component's x-updates. A component whose other members are all known (corrupted,
exposed by a matching event, e.g. a trimmed extreme) therefore gives away its last member:
:func:`determined_by_sums`, the rule :mod:`adversary.linear` proves by exact rank tests.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Literal

import numpy as np

from .arrays import BoolArray, FloatArray, IntArray
from .departure import components

__all__ = [
    "InitChannel",
    "determined_by_sums",
    "group_sealed",
    "known_duals",
    "sealed_groups",
    "secret_groups",
    "solvable",
]

InitChannel = Literal["plain", "sealed", "auto"]


def group_sealed(channel: InitChannel, objective_kind: str) -> bool:
    """Whether a dual group whose phases have ``objective_kind`` exchanges its z^(0) sealed."""
    if channel == "auto":
        return objective_kind == "quadratic"
    return channel == "sealed"


def sealed_groups(channel: InitChannel, phases: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The dual groups exchanged sealed, from ``(group, objective kind)`` of every phase."""
    return frozenset(g for g, kind in phases if group_sealed(channel, kind))


def secret_groups(channel: InitChannel, phases: Iterable[tuple[str, str, bool]]) -> frozenset[str]:
    """The groups whose z^(0) an eavesdropper does not know: sealed, and random.

    ``phases`` gives ``(group, objective kind, random)`` per phase; ``random`` is whether the
    group's z^(0) has a random part (``sigma_z > 0``), without which the public config fixes it.
    """
    return frozenset(g for g, kind, rnd in phases if rnd and group_sealed(channel, kind))


def known_duals(secret: bool, src: IntArray, dst: IntArray, corrupted: Collection[int] = ()) -> BoolArray:
    """Which z_{i|j}^(0) of one dual group the adversary knows, per directed edge ``src -> dst``.

    All of them when the group is not ``secret``; else those on an edge with a corrupted end.
    """
    if not secret:
        return np.ones(len(src), dtype=bool)
    bad = np.zeros(int(max(np.max(src, initial=-1), np.max(dst, initial=-1))) + 1, dtype=bool)
    bad[[c for c in corrupted if c < len(bad)]] = True
    return np.asarray(bad[src] | bad[dst], dtype=bool)


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


def determined_by_sums(
    n: int, edges: IntArray, known: BoolArray, cuts: Sequence[Collection[int]] = ((),)
) -> BoolArray:
    """The values an average phase with secret duals determines, given those already ``known``.

    Parameters
    ----------
    n, edges
        The graph (canonical undirected edges).
    known
        ``(n,)`` values known before: corrupted nodes' and exposed ones.
    cuts
        One node set per stretch of the phase in which the same nodes ran: the corrupted nodes
        and those that had left. Each stretch reveals the sum of every connected component of
        the graph without its cut (a node that leaves during the phase starts a new stretch:
        the sums before and after differ by its value).

    Returns
    -------
    ``known`` plus every value in the span of the known values and the stretches' component
    sums (rank tested): with one stretch, the one unknown member of every component that has
    exactly one. A stretch counts from the phase's second iteration (the first one's sums still
    hold the unknown pair sums of z^(0)); a node leaving before it belongs to every cut.
    """
    rows: list[FloatArray] = [np.eye(n)[i] for i in np.flatnonzero(known)]
    for cut in cuts:
        gone = {int(c) for c in cut}
        for comp in components(n, edges, gone):
            row = np.zeros(n)
            row[comp] = 1.0
            rows.append(row)
    out = np.array(known, dtype=bool, copy=True)
    if not rows:
        return out
    # e_i lies in the span of the rows iff the orthonormal basis has unit norm in column i; the rows
    # are 0/1 vectors, so a relative rank tolerance of 1e-9 separates the singular values cleanly.
    _, sv, vt = np.linalg.svd(np.array(rows), full_matrices=False)
    basis = vt[: int((sv > 1e-9 * sv.max()).sum())]
    out |= np.abs(1.0 - (basis**2).sum(axis=0)) <= 1e-6
    return out
