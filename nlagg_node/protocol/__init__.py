"""The run's protocol, pure: its shape (schedule and graph) and the acceptance rule of every message.

The node runtime (:mod:`nlagg_node.runtime`), the simulator and the adversary's transcript and
replay drive the run through this package; none of them states a rule of its own. A node's early
stop is a state machine (:mod:`.machine`) over the rule's scalar functions in
:mod:`nlagg_node.termination` (compiled into the simulator's kernel, which hashes its source); the
departure rule is :mod:`nlagg_node.departure`.

The names are re-exported lazily, listed once in the ``TYPE_CHECKING`` block below
(:mod:`nlagg_node.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .accept import NO_HALT as NO_HALT
    from .accept import OUTSIDE_WINDOW as OUTSIDE_WINDOW
    from .accept import X_WINDOW as X_WINDOW
    from .accept import Departures as Departures
    from .accept import Verdict as Verdict
    from .accept import admit as admit
    from .accept import adv_error as adv_error
    from .accept import departure_claims as departure_claims
    from .accept import halt_span as halt_span
    from .accept import key_error as key_error
    from .accept import lowest_position as lowest_position
    from .accept import own_departure_error as own_departure_error
    from .accept import slot_verdict as slot_verdict
    from .accept import status_error as status_error
    from .accept import x_form_error as x_form_error
    from .accept import x_value_error as x_value_error
    from .accept import z0_error as z0_error
    from .envelope import ValueBounds as ValueBounds
    from .envelope import XEnvelope as XEnvelope
    from .envelope import output_error as output_error
    from .envelope import value_bounds as value_bounds
    from .envelope import x_envelope as x_envelope
    from .equivocation import EquivocationError as EquivocationError
    from .equivocation import equivocation_error as equivocation_error
    from .equivocation import x_conflict_error as x_conflict_error
    from .identity import Identity as Identity
    from .identity import Verifier as Verifier
    from .identity import new_identity as new_identity
    from .identity import signature_error as signature_error
    from .instance import instance_error as instance_error
    from .instance import new_instance as new_instance
    from .machine import PhaseNode as PhaseNode
    from .machine import StopRule as StopRule
    from .machine import fields_along as fields_along
    from .machine import phase_final as phase_final
    from .shape import RunShape as RunShape
    from .shape import phase_starts as phase_starts

__all__, __getattr__ = lazy_exports(__name__, __file__)
