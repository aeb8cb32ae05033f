"""The default stop rule (the certified stop of max and min), written as a plain per-node loop
straight from docs/protocol.md ("Early stopping" and "The certified stop", steps 1-5).

Deliberately naive and independent of ``nlagg_node`` (no import from it: dicts per node, the
formulas of the document inlined), so that it checks the node's state machine
(:class:`nlagg_node.protocol.PhaseNode`) and the simulator's kernel rather than sharing their code.
No departures: a connected graph whose nodes all stay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceStop:
    """What the rule says of one phase.

    Attributes
    ----------
    published : per phase-local iteration, per node, ``(k, e, cand)`` as the node publishes it with
        its x (``e`` and ``cand`` None while unknown); None once the node has ended the phase.
    stop : per node, the phase-local iteration after which it ends the phase (None: it never does).
    output : per node, its final of the phase: ``sign b_i`` at its stop, else its last x.
    """

    published: list[list[tuple[int, int | None, float | None] | None]]
    stop: list[int | None]
    output: list[float]


def certified_stop(
    x: Sequence[Sequence[float]],
    edges: Sequence[tuple[int, int]],
    values: Sequence[float],
    sign: float,
    window: int,
    diameter: int,
) -> ReferenceStop:
    """Run the certified stop along one phase's x's (``x[t][i]``, phase-local t from 0).

    ``values``: each node's value as its x-update uses it; ``sign``: +1 for max, -1 for min;
    ``window``: W; ``diameter``: D, the graph's diameter.
    """
    n = len(values)
    nbrs: dict[int, list[int]] = {i: [] for i in range(n)}
    for one, other in edges:
        nbrs[int(one)].append(int(other))
        nbrs[int(other)].append(int(one))
    # The state each node keeps: pin run r, candidate b (signed; -inf: none), counter k, stop e.
    r = {i: 0 for i in range(n)}
    b = {i: -math.inf for i in range(n)}
    k = {i: 0 for i in range(n)}
    e: dict[int, float] = {i: math.inf for i in range(n)}
    running = {i: True for i in range(n)}
    published: list[list[tuple[int, int | None, float | None] | None]] = []
    stop: list[int | None] = [None] * n
    output = [float(x[-1][i]) if len(x) else math.nan for i in range(n)]
    for t, row in enumerate(x):
        if not any(running.values()):
            break
        # Every node reads its neighbours' b, k and e of iteration t - 1 (what they published).
        b_prev, k_prev, e_prev = dict(b), dict(k), dict(e)
        out: list[tuple[int, int | None, float | None] | None] = [None] * n
        for i in range(n):
            if not running[i]:
                continue
            s = sign * values[i]
            # 2. the pin run, bit for bit, and the node's own contribution once pinned W times
            r[i] = r[i] + 1 if row[i] == values[i] else 0
            own = s if r[i] >= window else -math.inf
            # 3. the candidate: the largest of its own, its last one and its neighbours' last ones
            b[i] = max([b_prev[i], own] + [b_prev[j] for j in nbrs[i]])
            # 4. quiet when its own value is covered by its candidate
            quiet = s <= b[i]
            if quiet:
                k[i] = 1 + min([k_prev[i]] + [k_prev[j] for j in nbrs[i]])
            else:
                k[i] = 0
            proposal = t + diameter if k[i] >= diameter + window else math.inf
            e[i] = min([e_prev[i], proposal] + [e_prev[j] for j in nbrs[i]])
            # 5. publish x with k, e and cand = sign b
            cand = sign * b[i] if b[i] > -math.inf else None
            out[i] = (k[i], int(e[i]) if e[i] < math.inf else None, cand)
        published.append(out)
        for i in range(n):
            if running[i] and e[i] == t:  # it completes iteration t and ends the phase
                running[i] = False
                stop[i] = t
                output[i] = sign * b[i] if b[i] > -math.inf else float(row[i])
    return ReferenceStop(published, stop, output)
