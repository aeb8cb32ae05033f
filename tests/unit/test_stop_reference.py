"""The default stop rule, three ways: the node's state machine (:class:`~nlagg_node.protocol.PhaseNode`
through :func:`~nlagg_node.protocol.fields_along`) and the simulator's kernel, each against a
reference written from docs/protocol.md alone (``tests/harness/stop_reference.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from nlagg_node import load_config, simulate
from nlagg_node.protocol import PhaseNode, StopRule, fields_along
from nlagg_node.termination import NO_STOP, Certificate, certificate_sign, diameter
from tests.harness.stop_reference import certified_stop

CASES = [
    pytest.param("max", "rgg", 15, 3, id="max-rgg15"),
    pytest.param("min", "rgg", 15, 4, id="min-rgg15"),
    pytest.param("max", "ring", 6, 5, id="max-ring6"),
    pytest.param("min", "ring", 9, 6, id="min-ring9"),
]


@pytest.mark.parametrize(("op", "graph", "n", "seed"), CASES)
def test_the_kernel_and_the_state_machine_stop_where_the_reference_does(
    op: str, graph: str, n: int, seed: int
) -> None:
    """Along the simulator's own trajectory: each node's published ``(k, e, cand)`` from the state
    machine equal the reference's at every iteration, and the kernel's iterations and outputs equal
    the reference's stop and output, bit for bit."""
    cfg = load_config(op=op, graph=graph, n=n, trials=6, seed=seed, record="all")
    res = simulate(cfg)
    window, sign = cfg.resolved().stop_window_value, certificate_sign(op)
    stopped = 0
    for b in range(cfg.trials):
        edges = res.graphs[b]
        values = res.protocol_values[b].tolist()
        xs = res.recorded_x[: int(res.phase_iterations[b, 0]), b, :]
        ref = certified_stop(xs.tolist(), edges.tolist(), values, sign, window, diameter(n, edges))
        rows = fields_along(
            xs, edges, 0, window, diameter(n, edges), cfg.tolerance, None, Certificate(values, sign)
        )
        machine = [
            [None if f is None else (f[0], None if f[1] == NO_STOP else f[1], f[3]) for f in r] for r in rows
        ]
        assert machine == ref.published
        ran = [int(r) for r in res.node_iterations[b, :, 0]]
        assert ran == [len(xs) if s is None else s + 1 for s in ref.stop]
        assert res.output[b].tolist() == ref.output
        stopped += all(s is not None for s in ref.stop)
    assert stopped == cfg.trials  # every trial ended on the certificate, within t_max


def test_a_pinned_maximum_reaches_every_node_and_is_every_output() -> None:
    """A path 0 - 1 - 2 whose maximizer (node 0) is pinned from the start and whose other x's never
    settle: the reference and the state machine stop every node at the same iteration, each with
    the maximum as its output, although no other x ever equals it."""
    values, window, reach = [5.0, 3.0, 1.0], 3, 2
    rng = np.random.default_rng(0)
    xs = np.column_stack([np.full(40, 5.0), 4.0 + rng.random(40), 4.0 + rng.random(40)])
    ref = certified_stop(xs.tolist(), [(0, 1), (1, 2)], values, 1.0, window, reach)
    rule = StopRule(window, reach, 1e-9, sign=1.0)
    nodes = [PhaseNode(rule, 0, v) for v in values]
    last: list[tuple[int, int, tuple[int, ...], float | None]] = []
    nbrs = [[1], [0, 2], [1]]
    stops: list[int] = []
    for t, row in enumerate(xs.tolist()):
        fields = [
            node.tick(t, row[i], [last[j] for j in nbrs[i]] if last else []) for i, node in enumerate(nodes)
        ]
        last = fields
        if all(node.halts(t) for node in nodes):
            stops.append(t)
            break
    assert ref.stop == [stops[0]] * 3
    assert ref.output == [5.0, 5.0, 5.0]
    assert [node.final(row[i], stopped=True) for i, node in enumerate(nodes)] == ref.output
