"""The batched Monte Carlo simulator."""

from .engine import SimResult, node_generators, simulate
from .values import draw_values

__all__ = ["SimResult", "draw_values", "node_generators", "simulate"]
