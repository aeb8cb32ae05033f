"""The options of a continuous deployment (:mod:`nlagg_node.runtime.epochs`): ``nlagg node``,
``nlagg testbed`` and ``nlagg deploy plan`` share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from .opt import EPOCHS, Opt

__all__ = ["DeploymentEpochOptions", "EpochOptions"]


@dataclass(frozen=True, kw_only=True)
class EpochOptions:
    """Epoch after epoch, every ``every`` seconds (docs/continuous.md)."""

    every: Annotated[
        float | None,
        Opt("a continuous deployment: run an epoch every SECONDS (read the value again, aggregate)", EPOCHS),
    ] = None
    epochs: Annotated[
        int | None,
        Opt(
            "with --every: the epochs 0..K-1 after the origin [default: for ever]",
            EPOCHS,
            extra=(("min", 1),),
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class DeploymentEpochOptions(EpochOptions):
    """A deployment's epochs start on a public wall clock: ``nlagg node`` and ``nlagg deploy plan``."""

    origin: Annotated[
        float | None,
        Opt(
            "with --every: unix time of epoch 0's start; epoch k starts at origin + k x every (nodes:"
            " 0, starts aligned to the period; plans: the next minute after a minute from now)",
            EPOCHS,
        ),
    ] = None
