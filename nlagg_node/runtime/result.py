"""What a node ends a run with: the value type the loop returns and ``nlagg node --json`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NodeResult"]


@dataclass
class NodeResult:
    """What one node ended with (``value`` is private; it never leaves the node)."""

    node: int
    value: float
    finals: list[float]  # final x of every phase
    output: list[float]  # combine(): the k values of top-K, else one value
    iterations: int
    seconds: float
    z0_sent: dict[str, list[float]] = field(default_factory=dict)  # group -> z_{i|j}^(0), j ascending
    x: list[float] = field(default_factory=list)  # x_i^(t), t = 0..iterations-1
    rejected: int = 0
    duplicates: int = 0
    departed: dict[int, int] = field(default_factory=dict)  # neighbour -> T (nlagg_node.departure)
    left_at: int | None = None  # this node left the run cleanly at T (no output)

    @property
    def rounds_per_second(self) -> float:
        return self.iterations / self.seconds if self.seconds > 0 else 0.0
