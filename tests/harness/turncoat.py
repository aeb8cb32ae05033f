"""Node j's whole bundle in the wrong hands: its own files run by a node whose x's lie (issue 43).

An insider holding node j's broker password, signing key and value file runs node j's commands.txt
line through :func:`main` here instead of ``nlagg``: the node is the real one (its x's signed with
node j's identity, on its key chain, paced by the barrier), but the early-stop fields it publishes
with its x's over an iteration span are the ones :class:`Forge` chooses: a ``stop`` (the forged
stop, issue 43 break 1), a quiet counter, a certified stop's candidate ``cand`` (break 3). They are
rewritten on their way out (:meth:`~nlagg_node.runtime.peers.Outbox.send_x`, before the payload is
encoded and signed), so whatever the wire codec is, every receiver sees node j's own signed x.
With its x^(first) it may also publish a forged signed status (:meth:`Forge.status`): neighbours
it claims have departed (``departed``), or its own departure at ``leaving`` while it goes on
publishing x's. The node itself goes on with its honest state: only what it tells the others is false.

:class:`PlanBed <tests.harness.planbed.PlanBed>` starts it for a node with
``start_nodes(turncoat=(j, forge))``; the forge travels in the environment (:data:`ENV`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nlagg_node.config import RunConfig

__all__ = ["ENTRY", "ENV", "Forge", "bounded_influence", "main"]

ENV = "NLAGG_TURNCOAT"
"""The environment variable holding the forge (JSON of :class:`Forge`)."""

ENTRY = ["-c", "from tests.harness.turncoat import main; main()"]
"""The turncoat's entry, after the Python interpreter (in place of the ``nlagg`` CLI's)."""

Fields = tuple[int, int | None, Sequence[int], float | None]  # (quiet, stop, departures, cand)


@dataclass(frozen=True)
class Forge:
    """What node j's x^(t) claim for ``first <= t <= last`` (None: the honest field).

    Attributes
    ----------
    stop : the stop iteration claimed (an absolute t).
    stop_ahead : or a stop ``t + stop_ahead`` (a plausible proposal, made while not quiet).
    quiet : the quiet counter k claimed.
    cand : the certified stop's candidate claimed (protocol scale).
    departed : the departures ``{str(k): T}`` of nodes k its status claims it saw, from x^(first) on.
    leaving : the departure iteration T its status claims from x^(first) on (it goes on sending x's).
    """

    first: int
    last: int
    stop: int | None = None
    stop_ahead: int | None = None
    quiet: int | None = None
    cand: float | None = None
    departed: dict[str, int] | None = None
    leaving: int | None = None

    def covers(self, t: int) -> bool:
        return self.first <= t <= self.last

    def fields(self, t: int, honest: Fields) -> Fields:
        """The fields published with x^(t) in place of ``honest``."""
        if not self.covers(t):
            return honest
        quiet, stop, departures, cand = honest
        if self.stop_ahead is not None:
            stop = t + self.stop_ahead
        return (
            quiet if self.quiet is None else self.quiet,
            stop if self.stop is None else self.stop,
            departures,
            cand if self.cand is None else self.cand,
        )

    def status(self, node: int, run: str | None) -> bytes | None:
        """The forged status node ``node`` publishes with its x^(first) (None: no status is forged)."""
        from nlagg_node.runtime.wire import StatusMsg, encode

        if self.departed is None and self.leaving is None:
            return None
        if self.leaving is None:
            msg = StatusMsg(node=node, state="running", departed=self.departed, run=run)
        else:
            msg = StatusMsg(
                node=node, state="leaving", iterations=self.leaving, departed=self.departed, run=run
            )
        return encode(msg)

    def environment(self) -> dict[str, str]:
        """The environment of the turncoat's process: this forge, and this checkout importable."""
        root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        return {
            ENV: json.dumps(asdict(self)),
            "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
        }

    @classmethod
    def from_environment(cls) -> Forge:
        return replace(cls(0, -1), **json.loads(os.environ[ENV]))


def bounded_influence(cfg: RunConfig, honest: Sequence[float]) -> tuple[float, float]:
    """The outputs (user units) one node may cause by claiming any value a node of the run ``cfg``
    may hold (:func:`~nlagg_node.protocol.value_bounds`) beside the ``honest`` values: the ideal
    world with one lying participant. Max, min and the median are monotone in the claim, so the
    interval runs from the claim at the bottom to the claim at the top (the median of an even count
    its lower middle value, as the run pins it)."""
    from nlagg_node.protocol import value_bounds
    from nlagg_node.valuemap import scale_for

    bounds = value_bounds(cfg.resolved())
    scale = scale_for(cfg)
    claims = (
        (-math.inf, math.inf)
        if bounds is None
        else (scale.user_float(bounds.lo), scale.user_float(bounds.hi))
    )
    ends: list[float] = []
    for claim in claims:
        values = sorted([*honest, claim])
        if cfg.op == "max":
            ends += [values[-1]]
        elif cfg.op == "min":
            ends += [values[0]]
        elif cfg.op == "median":
            ends += [values[(len(values) - 1) // 2]]
        else:
            raise ValueError(f"op={cfg.op!r}: no bounded-influence interval here")
    return min(ends), max(ends)


def install(forge: Forge) -> None:
    """Every x this process publishes carries ``forge``'s fields (the process is one node's)."""
    from nlagg_node.runtime.peers import Outbox

    honest_send = Outbox.send_x

    def send_x(self: Outbox, t: int, phase: str, x: float, fields: Fields | None = None) -> None:
        if t == forge.first and (status := forge.status(self.node, self.run)) is not None:
            self.set_status(status)
        honest_send(self, t, phase, x, None if fields is None else forge.fields(t, fields))

    Outbox.send_x = send_x  # type: ignore[method-assign]


def main() -> None:
    """``nlagg`` with the forge of :data:`ENV` installed (argv: the node's commands.txt line)."""
    install(Forge.from_environment())
    from nlagg_node.cli import main as nlagg

    nlagg()
