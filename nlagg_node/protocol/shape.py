"""The public shape of one run: its schedule, its graph, and what each follows from them.

Everything a receiver needs to judge a message of the run (:mod:`.accept`) and every driver of the
run (the node loop, the adversary's replay) needs to follow its phases: the iteration range, the
phase and dual group of every iteration, the z^(0) exchanges in order, where a phase that stops
early lets the next one start (the *jumps*), the stop's reach, and the graph's edges. Built once
from a validated configuration; nothing in it changes during the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from ..config import RunConfig
from ..graphs import IntArray, neighbours
from ..schedule import Phase, Schedule, plan_phases, sealed_groups_of
from ..termination import stop_reach
from .envelope import ValueBounds, XEnvelope, value_bounds, x_envelope

__all__ = ["RunShape", "phase_starts"]


def phase_starts(phases: Sequence[Phase]) -> list[int]:
    """The first iteration of every phase, then the run's ``t_total``
    (:class:`~nlagg_node.schedule.Schedule`)."""
    return list(Schedule.of(phases).starts)


@dataclass(frozen=True, eq=False)
class RunShape:
    """The schedule and graph of one run (see the module docstring).

    Parameters
    ----------
    cfg : the run's configuration (resolved).
    edges : its canonical edge list.
    """

    cfg: RunConfig
    edges: IntArray
    phases: list[Phase] = field(init=False)
    schedule: Schedule = field(init=False)
    starts: list[int] = field(init=False)  # the first iteration of each phase, and t_total last

    def __post_init__(self) -> None:
        phases = plan_phases(self.cfg)
        object.__setattr__(self, "phases", phases)
        object.__setattr__(self, "schedule", Schedule.of(phases))
        object.__setattr__(self, "starts", list(self.schedule.starts))

    @property
    def n(self) -> int:
        return self.cfg.n

    @property
    def t_total(self) -> int:
        return self.starts[-1]

    @property
    def early_stop(self) -> bool:
        return self.cfg.early_stop

    @property
    def may_depart(self) -> bool:
        """Whether x's carry the departures their nodes know (an early-stopping run with ``may_depart``)."""
        return self.cfg.early_stop and self.cfg.may_depart

    @property
    def certified(self) -> bool:
        """Whether x's carry the certified stop's candidate (``cand``): max and min stopping on it."""
        return self.cfg.certified

    @cached_property
    def phase_at(self) -> list[str]:
        """The phase name of every iteration, as the nodes publish it."""
        return [p.name for p in self.phases for _ in range(p.t_len)]

    def phase_of(self, t: int) -> int:
        """The index of the phase iteration ``t`` (``0 <= t < t_total``) belongs to."""
        return self.schedule.phase_of(t)

    def phase_end(self, t: int) -> int:
        """The first iteration after the phase of ``t``."""
        return self.schedule.phase_end(t)

    @cached_property
    def jumps(self) -> frozenset[int]:
        """Iterations a receiver takes ahead of its window: with early stopping every phase may end
        before its ``t_len``, and the next one starts at its usual iteration after a gap."""
        return frozenset(self.starts[1:-1]) if self.cfg.early_stop else frozenset()

    @cached_property
    def exchanges(self) -> list[str]:
        """The z^(0) exchanges of the run, in order: one whenever the dual group changes."""
        groups = [p.group for p in self.phases]
        return [g for k, g in enumerate(groups) if not k or g != groups[k - 1]]

    def opens_exchange(self, p: int) -> bool:
        """Whether phase ``p`` starts with a z^(0) exchange: the first phase, and every phase whose
        dual group differs from the one before (the same group carries its duals on)."""
        return p == 0 or self.phases[p].group != self.phases[p - 1].group

    @cached_property
    def exchange_of(self) -> dict[str, int]:
        return {g: k for k, g in enumerate(self.exchanges)}

    @cached_property
    def sealed(self) -> frozenset[str]:
        """The dual groups whose z^(0) travel sealed (protocol v2)."""
        return sealed_groups_of(self.cfg, self.phases)

    @cached_property
    def reach(self) -> int:
        """The stop's reach D (:func:`~nlagg_node.termination.stop_reach`); 0 on the fixed schedule."""
        return stop_reach(self.cfg.n, self.edges, self.cfg.may_depart) if self.cfg.early_stop else 0

    @cached_property
    def neighbours(self) -> list[list[int]]:
        """Every node's neighbours, ascending (plain lists: read per message on the hot path)."""
        return neighbours(self.cfg.n, self.edges)

    @cached_property
    def envelope(self) -> XEnvelope | None:
        """Where every honest x lies (:mod:`.envelope`); None without a declared value range."""
        return x_envelope(self.cfg, self.phases, self.neighbours)

    @cached_property
    def value_bounds(self) -> ValueBounds | None:
        """Where every value, hence every certified stop's candidate, lies (:func:`.envelope.value_bounds`);
        None: anywhere."""
        return value_bounds(self.cfg)

    @cached_property
    def directed(self) -> frozenset[tuple[int, int]]:
        """Both directions of every edge."""
        pairs = [(int(a), int(b)) for a, b in self.edges.tolist()]
        return frozenset(pairs) | frozenset((b, a) for a, b in pairs)
