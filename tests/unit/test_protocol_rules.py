"""The protocol layer's transitions: the window, a sender's stop and departures, the shape's phases."""

from __future__ import annotations

import pytest

from nlagg_node.config import RunConfig
from nlagg_node.protocol import (
    NO_HALT,
    Departures,
    RunShape,
    admit,
    departure_claims,
    halt_span,
    slot_verdict,
)
from nlagg_node.runtime.node import run_edges


def shape_of(**fields: object) -> RunShape:
    cfg = RunConfig(**{"op": "max", "n": 6, "graph": "ring", "t_max": 20, "trials": 1, **fields}).resolved()
    return RunShape(cfg, run_edges(cfg))


@pytest.mark.parametrize(
    ("key", "position", "gone", "halt", "verdict"),
    [
        pytest.param(5, 5, 20, NO_HALT, None, id="the-awaited-key"),
        pytest.param(6, 5, 20, NO_HALT, None, id="one-ahead"),
        pytest.param(7, 5, 20, NO_HALT, "ahead", id="two-ahead"),
        pytest.param(3, 5, 20, NO_HALT, None, id="behind-the-slot-decides"),
        pytest.param(6, 5, 6, NO_HALT, "gone", id="from-the-departure"),
        pytest.param(5, 5, 6, NO_HALT, None, id="before-the-departure"),
        pytest.param(6, 5, 20, (5, 10), "stopped", id="after-the-senders-stop"),
        pytest.param(10, 5, 20, (5, 10), None, id="the-next-phase-jumps"),
    ],
)
def test_admit(key: int, position: int, gone: int, halt: tuple[int, int], verdict: str | None) -> None:
    assert admit(key, position, gone, halt, 2, frozenset({10})) == verdict


def test_the_first_value_of_a_slot_wins() -> None:
    assert [slot_verdict(None, 1.0), slot_verdict(1.0, 1.0), slot_verdict(1.0, 2.0)] == [
        "new",
        "dup",
        "conflict",
    ]


def test_the_shape_follows_the_schedule() -> None:
    shape = shape_of(op="topk", k=2, early_stop=True)
    assert len(shape.phases) >= 2
    assert shape.starts[0] == 0
    assert shape.starts[-1] == shape.t_total
    assert shape.jumps == frozenset(shape.starts[1:-1])
    for p, start in enumerate(shape.starts[:-1]):
        assert shape.phase_of(start) == p
        assert shape.phase_end(start) == shape.starts[p + 1]
        assert shape.phase_at[start] == shape.phases[p].name
    assert shape_of(early_stop=False).jumps == frozenset()
    opens = [shape.opens_exchange(p) for p in range(len(shape.phases))]
    assert opens[0]
    assert [shape.phases[p].group for p in range(len(opens)) if opens[p]] == shape.exchanges


def test_a_stop_ends_the_senders_phase_unless_a_departure_voids_it() -> None:
    shape = shape_of(early_stop=True, may_depart=True, stop_window=1)  # reach n - 1 = 5, earliest stop 10
    assert halt_span(shape, 12, 12, ()) == (12, 20)
    assert (
        halt_span(shape, 9, 9, ()) == NO_HALT
    )  # before the earliest stop: no honest node's, it ends nothing
    assert halt_span(shape, 12, 13, ()) == NO_HALT
    assert halt_span(shape, 12, 12, (5,)) == NO_HALT  # 5 lies in [12 - 10, 12 - 5]: voided


def test_departures_are_facts_about_edges() -> None:
    shape = shape_of()
    dep = Departures(shape)
    assert dep.receivers(1, 9) == [0, 2]
    assert dep.gone_from(1) == 20
    dep.claim(0, 1, 8)  # node 0 says 1 left at 8: only their edge goes
    assert dep.gone_from(1) == 20
    assert dep.receivers(1, 9) == [2]
    assert dep.receivers(1, 8) == [0, 2]
    dep.claim(2, 1, 8)
    assert dep.gone_from(1) == 8  # gone for every neighbour
    dep.claim(4, 4, 3)  # its own word
    assert dep.gone_from(4) == 3
    assert dep.receivers(3, 4) == [2]


def test_a_status_claims_its_senders_leaving_and_its_own_observations() -> None:
    assert departure_claims(1, "leaving", 7, None) == [(1, 7)]
    assert departure_claims(1, "running", None, {"0": 4, "2": 5}) == [(0, 4), (2, 5)]
    assert departure_claims(1, "leaving", None, None) == []
