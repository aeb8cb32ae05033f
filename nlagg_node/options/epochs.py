"""The options of a continuous deployment (:mod:`nlagg_node.runtime.epochs`): ``nlagg node``,
``nlagg testbed`` and ``nlagg deploy plan`` share them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from .opt import CA_OPT, EPOCHS, NETWORK, OUTPUT, Opt

__all__ = ["DeploymentEpochOptions", "EpochOptions", "ResultsOptions"]


@dataclass(frozen=True, kw_only=True)
class EpochOptions:
    """Epoch after epoch, every ``every`` seconds (docs/continuous.md)."""

    every: Annotated[
        float | None,
        Opt("a continuous deployment: run an epoch every SECONDS (read the value again, aggregate)", EPOCHS),
    ] = None
    epochs: Annotated[
        int | None,
        Opt("with --every: the epochs 0..K-1 after the origin [default: for ever]", EPOCHS, min=1),
    ] = None
    drift: Annotated[
        float | None,
        Opt(
            "with --every: warm-start each epoch at the last output, declaring the drift D, the most a"
            " value moves between epochs (a fraction of --value-range, value units without one): an"
            " epoch whose output leaves D of the last reruns cold (docs/continuous.md) [default: none,"
            " every epoch cold; a testbed's values then walk by steps uniform in [-D, D]]",
            EPOCHS,
            min=0.0,
        ),
    ] = None
    cold_start: Annotated[
        bool,
        Opt(
            "with --every: start every epoch cold even with --drift (which warm-starts max, min,"
            " median and quantile with --init proposed at the last output)",
            EPOCHS,
            ("--cold-start",),
        ),
    ] = False

    @property
    def warm_drift(self) -> float | None:
        """The drift the epochs warm-start with (None: every epoch cold: no ``--drift`` declared, or
        ``--cold-start``)."""
        return None if self.cold_start else self.drift


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


@dataclass(frozen=True, kw_only=True)
class ResultsOptions:
    """``nlagg results``: the output series of a continuous deployment."""

    file: Annotated[
        list[Path] | None,
        Opt("a node's results file (--results-file, or state/results-<id>.jsonl); repeat it"),
    ] = None
    broker: Annotated[
        str | None,
        Opt("or listen to the deployment's results topics P/R/results/+ here", NETWORK),
    ] = None
    run_id: Annotated[str | None, Opt("the deployment's run id R (with --broker)", NETWORK)] = None
    prefix: Annotated[str, Opt("topic prefix P", NETWORK)] = "nlagg"
    username: Annotated[str | None, Opt("broker user name (a plan's operator: launcher)", NETWORK)] = None
    password_file: Annotated[str | None, Opt("file holding the broker password", NETWORK)] = None
    ca_file: Annotated[str | None, CA_OPT] = None
    wait: Annotated[
        float, Opt("with --broker: seconds to listen (the retained latest epoch comes at once)", NETWORK)
    ] = 2.0
    csv: Annotated[
        Path | None, Opt("also write the series as CSV: epoch,node,output,iterations,time", OUTPUT)
    ] = None
    as_json: Annotated[bool, Opt("print one JSON object per record", OUTPUT, ("--json",))] = False
