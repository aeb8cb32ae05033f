"""The run's protocol, pure: its shape (schedule and graph) and the acceptance rule of every message.

The node runtime (:mod:`nlagg_node.runtime`), the simulator and the adversary's transcript and
replay drive the run through this package; none of them states a rule of its own. The early-stop
rule itself is :mod:`nlagg_node.termination` (compiled into the simulator's kernel, which hashes its
source), the departure rule :mod:`nlagg_node.departure`.
"""

from .accept import (
    NO_HALT,
    OUTSIDE_WINDOW,
    X_WINDOW,
    Departures,
    Verdict,
    admit,
    adv_error,
    departure_claims,
    halt_span,
    key_error,
    lowest_position,
    slot_verdict,
    status_error,
    x_form_error,
    z0_error,
)
from .shape import RunShape, phase_starts

__all__ = [
    "NO_HALT",
    "OUTSIDE_WINDOW",
    "X_WINDOW",
    "Departures",
    "RunShape",
    "Verdict",
    "admit",
    "adv_error",
    "departure_claims",
    "halt_span",
    "key_error",
    "lowest_position",
    "phase_starts",
    "slot_verdict",
    "status_error",
    "x_form_error",
    "z0_error",
]
