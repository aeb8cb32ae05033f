"""Departures: nodes that leave a run for good, and what the others do about it (one rule, every runtime).

A node ``j`` *departs at* ``T`` when ``x_j^(T-1)`` is the last x it publishes (a battery ran
out, a Pi was unplugged, ``nlagg node --leave-after T``). Every neighbour of ``j`` then takes
the same decision without any extra message, because each of them waits for the same
``x_j^(T)`` and it never comes:

* iteration ``T`` runs as usual up to the z-update: ``x_i^(T)`` still uses the duals of the
  edge ``(i, j)``, and ``x_j^(T)`` is never needed for it;
* the z-update of iteration ``T`` drops both duals of the edge ``(i, j)`` instead of updating
  them (:func:`kept_edges`), and ``d_i`` shrinks by one; from ``T + 1`` on the edge is gone.

Dropping an edge at the z-update is the same as dropping it after the z-update (an edge's
z-update reads only that edge's duals and its two ends' x), so the simulator applies the rule
between two kernel calls (after iteration ``T``) and the node loop when it takes ``x^(T)``.

PDMM converges from any dual state, so the remaining nodes reach the aggregate of the nodes
that remain connected to them: one result per connected component of the surviving graph
(:func:`components`). A survivor whose neighbours have all departed is a component of its own;
its x is its value (``c d_i = 0``: both runtimes take ``s_i`` instead of dividing by zero).

In a continuous deployment a neighbour is also counted departed for the epoch when its session
flaps (:data:`FLAP_LIMIT`, :func:`flapped`): its last will has come that many times in one epoch's
run (its broker session taken over again and again by a holder of its password, issue 43, break 5).
Waiting for it would let one stolen password stall every epoch; counting it absent costs what its
own silence would (bounded influence), and it rejoins at the next epoch. A one-shot run does not
apply the rule (a departure there is for the whole run, and a few lost connections are survived).

Early stopping handles departures in a run with ``may_depart`` (:mod:`nlagg_node.termination`:
each component stops on its own, and a departure voids a stop it could have misled). The trimmed
mean (whose combination needs the number of nodes) does not handle departures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from .arrays import BoolArray, FloatArray, IntArray
from .errors import ConfigError
from .graphs import EdgeLayout

__all__ = [
    "FLAP_LIMIT",
    "announced",
    "check_departures",
    "components",
    "departure_defaults",
    "departure_refusal",
    "drop_pairs",
    "flapped",
    "kept_edges",
    "parse_departures",
    "survivors",
]


FLAP_LIMIT = 3
"""Last wills of one neighbour within one epoch's run after which it departs for the epoch: a lost
connection or two (Wi-Fi, a broker restart) are waited for; a session taken over every few tenths
of a second reaches this within a second."""


def flapped(wills: int, limit: int | None) -> bool:
    """Whether a neighbour whose last will has come ``wills`` times in this run departs for flapping
    (``limit``: :data:`FLAP_LIMIT` in an epoch of a continuous deployment, None: never)."""
    return limit is not None and wills >= limit


def parse_departures(spec: str | None, field: str = "depart") -> dict[int, int]:
    """``"3@500,7@1200"`` (node@iteration) -> ``{3: 500, 7: 1200}``; ``None`` or ``""`` -> ``{}``.

    Raises :class:`~nlagg_node.errors.ConfigError` naming ``field`` and the bad part.
    """
    out: dict[int, int] = {}
    if not spec:
        return out
    for part in spec.split(","):
        node, sep, at = part.strip().partition("@")
        if not sep or not node.strip().isdigit() or not at.strip().isdigit():
            raise ConfigError(field, part, "expected node@iteration, e.g. 3@500")
        j, t = int(node), int(at)
        if j in out:
            raise ConfigError(field, part, f"node {j} departs twice")
        out[j] = t
    return out


def departure_defaults(
    early_stop: bool | None, may_depart: bool | None, depart: str | None, op: str | None
) -> tuple[bool | None, bool | None]:
    """``early_stop`` and ``may_depart`` of a run given ``--depart`` (``None``: the config's own choice).

    Planned departures turn on ``may_depart`` (an early stop that survives them); a top-K run
    takes the fixed schedule, as its planned departures cannot follow phases that stop early. An
    explicit choice is kept (and refused later by :func:`check_departures` if it cannot work).
    """
    if not depart:
        return early_stop, may_depart
    if early_stop is None and op == "topk":
        early_stop = False
    return early_stop, True if may_depart is None else may_depart


def departure_refusal(op: str, early_stop: bool, may_depart: bool) -> str | None:
    """Why a run cannot go on once a node departs; None where it can (each component of the
    survivors to its own result). The one survival rule: the planner (:func:`check_departures`),
    the node loop (which fails the run at a departure) and the envelope of the honest x's (which
    widens by what departures may move) all ask it.

    An early-stopping run needs ``may_depart`` (its stop waits ``n - 1`` hops and a departure voids a
    stop it could mislead, :mod:`nlagg_node.termination`); the trimmed mean's combination needs every
    node (its n is fixed).
    """
    if early_stop and not may_depart:
        return "early stopping with departures needs --may-depart (or --no-early-stop)"
    if op == "trimmed-mean":
        return "the trimmed mean needs every node (its n is fixed)"
    return None


def check_departures(
    departures: Mapping[int, int], n: int, t_total: int, op: str, early_stop: bool, may_depart: bool
) -> None:
    """Refuse departures a run cannot have: unknown nodes, iterations outside ``1..t_total-1``,
    everyone leaving, early stopping without ``may_depart``, early-stopping top-K, the trimmed mean."""
    shown = ",".join(f"{j}@{t}" for j, t in departures.items())
    if not departures:
        return
    why = departure_refusal(op, early_stop, may_depart)
    if why is not None:
        raise ConfigError("depart", shown, why)
    if early_stop and op == "topk":
        raise ConfigError(
            "depart",
            shown,
            "planned departures in top-K need the fixed schedule (a phase that stops early would move"
            " them into the next one); add --no-early-stop",
        )
    for j, t in departures.items():
        if not 0 <= j < n:
            raise ConfigError("depart", f"{j}@{t}", f"node must lie in 0..{n - 1}")
        if not 1 <= t < t_total:
            raise ConfigError("depart", f"{j}@{t}", f"iteration must lie in 1..{t_total - 1}")
    if len(departures) >= n:
        raise ConfigError("depart", shown, "at least one node must stay")


def kept_edges(lo: IntArray, hi: IntArray, gone: Iterable[int]) -> BoolArray:
    """Which edges ``(lo[e], hi[e])`` survive when the nodes ``gone`` have departed.

    The one rule of a departure: an edge goes with either of its ends. The simulator
    (:mod:`nlagg_node.sim.departures`) and the adversary's replays (:mod:`adversary.live`,
    :mod:`adversary.linear`) apply it to their undirected pairs through :func:`drop_pairs`.
    """
    g = np.fromiter(gone, dtype=np.int64)
    return np.asarray(~(np.isin(lo, g) | np.isin(hi, g)), dtype=np.bool_)


def drop_pairs(
    layout: EdgeLayout, u: FloatArray, gone: Iterable[int]
) -> tuple[EdgeLayout, FloatArray, BoolArray]:
    """:func:`kept_edges` on an :class:`~nlagg_node.graphs.EdgeLayout` (every trial the same nodes).

    Returns the layout without the pairs of ``gone``, its signed duals ``u`` (both halves, the
    other edges in their order, so each node still adds its duals in the same order) and the
    kept mask over the old pairs.
    """
    h, n = layout.n_pairs, layout.n
    keep = kept_edges(layout.dst[:h] % n, layout.src[:h] % n, gone)  # first half: hi -> lo
    both = np.concatenate([keep, keep])
    src = layout.src[both]
    degree = np.bincount(src, minlength=layout.n_nodes).astype(np.float64)
    new = EdgeLayout(
        n=n, trials=layout.trials, src=src, dst=layout.dst[both], sign=layout.sign[both], degree=degree
    )
    return new, np.ascontiguousarray(u[both]), keep


def announced(departed: Iterable[Mapping[str, int] | None]) -> dict[int, int]:
    """The departures the nodes' statuses announce (``StatusMsg.departed`` of each), merged."""
    out: dict[int, int] = {}
    for d in departed:
        for j, t in (d or {}).items():
            out[int(j)] = min(int(t), out.get(int(j), int(t)))
    return out


def survivors(n: int, departed: Iterable[int]) -> list[int]:
    """The nodes that did not depart, ascending."""
    gone = set(departed)
    return [i for i in range(n) if i not in gone]


def components(n: int, edges: IntArray, departed: Iterable[int]) -> list[list[int]]:
    """Connected components of the surviving graph, each ascending, ordered by their smallest node."""
    gone = set(departed)
    parent = list(range(n))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in np.asarray(edges, dtype=np.int64).reshape(-1, 2).tolist():
        if a not in gone and b not in gone:
            parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        if i not in gone:
            groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda c: c[0])
