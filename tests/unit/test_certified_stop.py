"""The certified stop of max and min in the simulator (:mod:`nlagg_node.termination`, docs/protocol.md)."""

from __future__ import annotations

from typing import Any

import pytest

from nlagg_node import load_config, simulate
from nlagg_node.errors import ConfigError
from nlagg_node.protocol import fields_along
from nlagg_node.sim.multiepoch import simulate_epochs
from nlagg_node.termination import Certificate, certificate_sign, stop_reach

DEPARTURES = [
    pytest.param(None, id="no-departure"),
    pytest.param({4: 300}, id="one-departure"),
    pytest.param({4: 900, 9: 1200}, id="two-departures"),
]


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("departures", DEPARTURES)
def test_the_kernel_stops_every_node_where_the_reference_rule_does(
    op: str, departures: dict[int, int] | None
) -> None:
    """Each node's iterations and output are those :func:`fields_along` (the rule's reference,
    what the nodes publish) gives along the simulator's own trajectory."""
    cfg = load_config(op=op, n=15, trials=12, seed=3, record="all", may_depart=departures is not None)
    res = simulate(cfg, departures=departures)
    window = cfg.resolved().stop_window_value
    for b in range(cfg.trials):
        edges, gone = res.graphs[b], res.departures_of(b)
        xs = res.recorded_x[: int(res.phase_iterations[b, 0]), b, :]
        cert = Certificate(res.protocol_values[b], certificate_sign(op))
        reach = stop_reach(cfg.n, edges, cfg.may_depart)
        rows = fields_along(xs, edges, 0, window, reach, cfg.tolerance, departed=gone, certificate=cert)
        ran = [sum(row[i] is not None for row in rows) for i in range(cfg.n)]
        assert ran == res.node_iterations[b, :, 0].tolist()
        for i in set(range(cfg.n)) - set(gone):
            last = rows[ran[i] - 1][i]
            assert last is not None
            assert last[3] == res.output[b, i]


@pytest.mark.parametrize("op", ["max", "min"])
def test_certified_outputs_are_the_aggregate_bit_for_bit_and_come_sooner(op: str) -> None:
    """Against the tolerance rule on the same trials: the output is the extreme value itself, every
    trial stops earlier, and no node is exposed that the tolerance rule did not expose."""
    common: dict[str, Any] = {"op": op, "n": 15, "trials": 60, "seed": 0, "record": "none"}
    cert = simulate(load_config(**common))
    tol = simulate(load_config(**common, stop_rule="tolerance"))
    extreme = cert.protocol_values.min(axis=1) if op == "min" else cert.protocol_values.max(axis=1)
    assert (cert.output == extreme[:, None]).all()
    assert (cert.mse == 0.0).all()
    assert (cert.converged_iterations > 0).all()
    assert (cert.phase_iterations < tol.phase_iterations).all()
    assert (cert.exposed <= tol.exposed).all()
    assert not cert.stray_candidates().any()


def test_a_phase_that_never_stops_keeps_its_x_as_final() -> None:
    """Capped before any certificate: the finals are the x's, as on the tolerance rule."""
    cfg = load_config(op="max", n=15, trials=4, seed=0, t_max=50, record="none")
    res = simulate(cfg)
    assert (res.phase_iterations == 50).all()
    assert not res.offered.any()
    assert (res.converged_iterations == -1).all()


def test_only_max_and_min_take_the_certificate() -> None:
    with pytest.raises(ConfigError, match=r"stop_rule='certificate'.*op='median'"):
        load_config(op="median", stop_rule="certificate")
    assert load_config(op="min").certified
    assert not load_config(op="max", early_stop=False).certified


def test_epochs_report_stray_candidates() -> None:
    res = simulate_epochs(load_config(op="max", n=10, trials=20, seed=1, value_range=(0.0, 1.0)), 3, 0.01)
    summary = res.summary()
    assert summary["stray_candidate_fraction"] == 0.0
    assert res.exact.all()
