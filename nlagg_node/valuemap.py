"""The affine map between the user's units and the protocol's scale (see :mod:`nlagg_node.valuechecks`).

Kept apart from the checks of :mod:`nlagg_node.valuechecks`, which need the phase schedule, so that the
schedule itself can map the public prior onto the protocol's scale without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import RunConfig

__all__ = ["ValueScale", "scale_for"]


@dataclass(frozen=True)
class ValueScale:
    """The affine map between the user's units and the protocol's: ``p = (s - lo) / (hi - lo)``.

    ``identity`` (no declared range) leaves every number untouched, bit for bit.
    """

    lo: float = 0.0
    hi: float = 1.0
    identity: bool = True

    @property
    def span(self) -> float:
        """``hi - lo`` (1 for the identity): the unit of the exactness tolerance."""
        return 1.0 if self.identity else self.hi - self.lo

    def to_protocol(self, s: Any) -> Any:
        """User units -> protocol units (scalars or arrays)."""
        if self.identity:
            return s
        return (np.asarray(s, dtype=np.float64) - self.lo) / (self.hi - self.lo)

    def to_user(self, x: Any) -> Any:
        """Protocol units -> user units (scalars or arrays); infinities stay infinite."""
        if self.identity:
            return x
        return np.asarray(x, dtype=np.float64) * (self.hi - self.lo) + self.lo

    def user_float(self, x: float) -> float:
        return float(self.to_user(x))

    def protocol_float(self, s: float) -> float:
        return float(self.to_protocol(s))


def scale_for(cfg: RunConfig) -> ValueScale:
    """The scale of a run: the identity without ``value_range``."""
    if cfg.value_range is None:
        return ValueScale()
    lo, hi = cfg.value_range
    return ValueScale(float(lo), float(hi), identity=False)
