"""What the nodes accept, as the transcript applies it: node ids, iteration bounds, phases, the window.

A node takes neighbour j's x_j^(t) only for ``t < t_total``, only with the phase name of iteration
t, and only inside its barrier window ``t <= t_now + 1``; it drops an x outside it for good. Node
j's honest x_j^(t) is computed from x_k^(t-1) of every neighbour k, so by the time it is published
every x_k^(t-1) has gone through the broker before it; Mosquitto forwards the messages of one run
to every subscriber in the order it received them, so the eavesdropper sees them first too. The
transcript therefore counts x_j^(t) as valid only when every neighbour has been seen at iteration
t - 1 or later (t = 0 needs nothing): a forged x_j^(t_now + 1500), which every node rejects, is
rejected here too, while the real one that comes later is kept. Like a node, the transcript judges
an identical copy sent again later anew (a node that resends it once its neighbours caught up).
Inside the window the first message wins, as at the nodes (see :mod:`adversary.transcript`). In a
run with early stopping an x carries ``quiet`` (and ``stop``), as the nodes require, and the first
x of a phase may follow the gap a phase that stopped early leaves, so it needs nothing before it.
Only a run whose nodes may depart (``may_depart``) has x's with ``departures``. Where departures
split the graph, each component stops on its own: the x's of one go on while another is silent,
and the window still holds, since a node's neighbours are all in its component or departed. An x
of a node after the one with which it ended its phase (its fields say so,
:func:`nlagg_node.termination.halts`) is refused: its neighbours have moved on.

A node that departs at T (:mod:`nlagg_node.departure`) is announced in its neighbours' statuses
before they publish x^(T+1) (they say so first): from then on its x^(T-1) is the last one its
neighbours' x's wait for, and an x of it from T on is refused, as the nodes refuse it.

When the broker lost the capture's session (a broker crash), the messages queued for it are gone
and the window has nothing to stand on: :meth:`RunRules.resync` suspends it until every node has
been seen again.

z^(0) must travel along an edge of the graph and belong to a dual group of the schedule, sealed
(protocol v2) exactly where the run seals that group (a node refuses the other form); statuses,
adversary states and every iteration counter are bounded by the run. The rules need the run's
public configuration; every size they allocate comes from it once validated.
"""

from __future__ import annotations

import bisect

from nlagg_node.runtime.public import config_from_msg, config_mismatch
from nlagg_node.runtime.wire import (
    X_TYPES,
    AdvStateMsg,
    ConfigMsg,
    Decoded,
    KeyMsg,
    SealedZ0Msg,
    StatusMsg,
    XMsg,
    XWire,
    Z0Msg,
)
from nlagg_node.schedule import plan_phases, sealed_groups_of
from nlagg_node.termination import halts, stop_reach

__all__ = ["OUTSIDE_WINDOW", "RunRules", "rules_for"]

OUTSIDE_WINDOW = "outside every neighbour's window"  # a rejection a later identical copy may undo


class RunRules:
    """The nodes' acceptance rules for one run, with the state the window needs.

    Raises :class:`~nlagg_node.errors.ConfigError` when ``config`` does not describe a valid run
    (out-of-bounds sizes included): such a config is stored as invalid and sets no rules.
    """

    def __init__(self, config: ConfigMsg) -> None:
        cfg, edges = config_from_msg(config)
        phases = plan_phases(cfg)
        self.config = config
        self.n = cfg.n
        self.t_total = sum(p.t_len for p in phases)
        self._starts = [sum(p.t_len for p in phases[:k]) for k in range(len(phases))]
        self._phase_at = [p.name for p in phases for _ in range(p.t_len)]  # as the nodes hold it
        self.early_stop = cfg.early_stop
        self.may_depart = cfg.early_stop and cfg.may_depart  # x's carry the departures their nodes know
        # Early stopping: the stop's reach, and where each node stopped each phase ((phase, node) ->
        # its last t): a later x of that phase is none its neighbours take (they have moved on).
        self.reach = stop_reach(cfg.n, edges, cfg.may_depart) if cfg.early_stop else 0
        self._stopped: dict[tuple[int, int], int] = {}
        # With early stopping a phase may end before its t_len: its successor's first x follows a gap.
        self._jumps = set(self._starts[1:]) if cfg.early_stop else set()
        self.groups = {p.group for p in phases}
        self.sealed = sealed_groups_of(cfg, phases)
        nbrs: list[list[int]] = [[] for _ in range(self.n)]
        for a, b in edges.tolist():
            nbrs[a].append(b)
            nbrs[b].append(a)
        # Plain lists, not arrays: the window is checked for every captured x, on a handful of
        # neighbours, where numpy's per-call cost is most of the work.
        self.neighbours = [sorted(v) for v in nbrs]
        self.directed = {(a, b) for a, b in edges.tolist()} | {(b, a) for a, b in edges.tolist()}
        self.latest: list[int] = [-1] * self.n  # latest valid t per node
        self._resync: set[int] = set()  # nodes not seen since the capture lost its session
        self.gone_from: list[int] = [self.t_total] * self.n  # departures, from statuses

    def inside(self, node: int, t: int) -> bool:
        """Whether ``(node, t)`` is a node and an iteration of the run."""
        return 0 <= node < self.n and 0 <= t < self.t_total

    def phase_at(self, t: int) -> str:
        """The name of the phase iteration ``t`` (``0 <= t < t_total``) belongs to."""
        return self._phase_at[t]

    def reject(self, msg: Decoded) -> str | None:
        """Why a node would not use ``msg`` (None: it would, when first for its slot)."""
        if isinstance(msg, X_TYPES):
            return self._x(msg)
        if isinstance(msg, Z0Msg | SealedZ0Msg):
            if (msg.from_, msg.to) not in self.directed:
                return f"z0 from node {msg.from_} to node {msg.to}: not an edge of the run's graph"
            if msg.group not in self.groups:
                return f"z0 for unknown dual group {msg.group!r}"
            if isinstance(msg, SealedZ0Msg) != (msg.group in self.sealed):
                how = "sealed (v2)" if isinstance(msg, SealedZ0Msg) else "plaintext (v1)"
                return f"z0 of group {msg.group!r} is {how}; the run exchanges it the other way"
            return None
        if isinstance(msg, KeyMsg):
            if msg.node >= self.n:
                return f"key of node {msg.node}: the run has nodes 0..{self.n - 1}"
            if not self.sealed:
                return "a public key in a run that seals no z^(0)"
            return None
        if isinstance(msg, StatusMsg):
            if msg.node >= self.n:
                return f"status of node {msg.node}: the run has nodes 0..{self.n - 1}"
            if msg.iterations is not None and msg.iterations > self.t_total:
                return f"iterations={msg.iterations}: the run has {self.t_total}"
            return None
        if isinstance(msg, AdvStateMsg):
            if msg.node >= self.n:
                return f"state of node {msg.node}: the run has nodes 0..{self.n - 1}"
            if msg.t >= self.t_total:
                return f"t={msg.t}: the run has iterations 0..{self.t_total - 1}"
            return None
        if isinstance(msg, ConfigMsg):
            mismatch = config_mismatch(self.config, msg)
            if mismatch is not None:
                return f"a second run configuration ({mismatch}); the first one is kept"
        return None

    def _x(self, msg: XMsg | XWire) -> str | None:
        i, t = msg.node, msg.t
        if i >= self.n:
            return f"x of node {i}: the run has nodes 0..{self.n - 1}"
        if t >= self.t_total:
            return f"t={t}: the run has iterations 0..{self.t_total - 1}"
        expected = self._phase_at[t]
        if msg.phase != expected:
            return f"t={t}: phase {msg.phase!r}, expected {expected!r}"
        if (msg.quiet is None) == self.early_stop or (msg.stop is not None and not self.early_stop):
            return f"x_{i}^({t}): quiet/stop {'missing in' if self.early_stop else 'in'} a run " + (
                "that stops early" if self.early_stop else "with a fixed schedule"
            )
        if msg.departures is not None and not self.may_depart:
            return f"x_{i}^({t}): departures in a run " + (
                "whose nodes may not depart" if self.early_stop else "with a fixed schedule"
            )
        if t >= self.gone_from[i]:
            return f"x_{i}^({t}): node {i} departed at t={self.gone_from[i]}"
        if self._stopped:
            last = self._stopped.get((bisect.bisect_right(self._starts, t), i))
            if last is not None and t > last:
                return f"x_{i}^({t}): node {i} ended this phase after t={last}"
        if t > 0 and t not in self._jumps and not self._resync:
            behind = self._behind(i, t)
            if behind:
                return f"x_{i}^({t}) {OUTSIDE_WINDOW}: node(s) {behind[:8]} not yet at t={t - 1}"
        return None

    def _behind(self, node: int, t: int) -> list[int]:
        """The neighbours of ``node`` not yet seen at ``t - 1`` that have not departed by then."""
        latest, gone, before = self.latest, self.gone_from, t - 1
        return [j for j in self.neighbours[node] if latest[j] < before and gone[j] > before]

    def waits(self, msg: Decoded) -> bool:
        """Whether ``msg`` is an x of the run whose window is not open yet (a neighbour not yet seen
        at t-1). Captured from one broker that x is out of its window for good; captured from
        several bridged brokers, the x's before it may still be on their way over another one."""
        if (
            not isinstance(msg, X_TYPES)
            or not self.inside(msg.node, msg.t)
            or msg.t == 0
            or msg.t in self._jumps
            or self._resync
        ):
            return False
        return bool(self._behind(msg.node, msg.t))

    def accepted(self, msg: Decoded) -> None:
        """Record a message stored as valid (the window moves on)."""
        if isinstance(msg, X_TYPES):
            self.saw_x(msg.node, msg.t)
            t = msg.t
            if msg.stop == t and halts(msg.stop, t, msg.departures or (), self.reach):
                self._stopped.setdefault((bisect.bisect_right(self._starts, t), msg.node), t)
        elif isinstance(msg, StatusMsg) and msg.departed:
            for j, t in msg.departed.items():
                if 0 <= int(j) < self.n:
                    self.gone_from[int(j)] = min(int(t), self.gone_from[int(j)])

    def saw_x(self, node: int, t: int) -> None:
        if t > self.latest[node]:
            self.latest[node] = t
        if self._resync:
            self._resync.discard(node)

    def resync(self) -> None:
        """The capture may have missed messages: no window until every node has been seen again."""
        self._resync = set(range(self.n))


def rules_for(config: ConfigMsg) -> tuple[RunRules | None, str | None]:
    """``(rules, None)`` for a valid run configuration, ``(None, why)`` for one that is not."""
    try:
        return RunRules(config), None
    except ValueError as exc:  # ConfigError is one; so is anything numpy says about the edges
        return None, f"not a valid run configuration ({exc})"
