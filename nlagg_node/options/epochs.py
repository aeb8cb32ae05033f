"""The options of a continuous deployment (:mod:`nlagg_node.runtime.epochdriver`): ``nlagg node``,
``nlagg testbed`` and ``nlagg deploy plan`` share them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from .opt import CA_OPT, EPOCHS, NETWORK, OUTPUT, Needs, Opt

__all__ = ["DEFAULT_DRIFT", "DeploymentEpochOptions", "EpochOptions", "ResultsOptions", "deployment_drift"]


DEFAULT_DRIFT = 0.01
"""The drift a new deployment declares, a fraction of its declared value range, when ``--drift`` is
not given: ``nlagg deploy plan --every`` and ``nlagg testbed --epochs`` warm-start by default."""


_CONTINUOUS = "a continuous deployment"


def deployment_drift(
    drift: float | None, cold_start: bool, value_range: tuple[float, float] | None
) -> float | None:
    """The drift a new deployment declares (its plan writes it into every node file and the
    eavesdropper's command): ``drift`` as given, else :data:`DEFAULT_DRIFT` of a declared
    ``value_range``; None (every epoch cold) without a range, or with ``--cold-start``."""
    if drift is not None or cold_start or value_range is None:
        return drift
    return DEFAULT_DRIFT


@dataclass(frozen=True, kw_only=True)
class EpochOptions:
    """Epoch after epoch, every ``every`` seconds (docs/continuous.md)."""

    NEEDS: ClassVar[Needs] = (
        ("epochs", "every", _CONTINUOUS),
        ("drift", "every", _CONTINUOUS),
        ("cold_start", "every", _CONTINUOUS),
    )

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
            " epoch whose output leaves D of the last reruns cold (docs/continuous.md); a testbed's"
            " values walk by steps uniform in [-D, D] [default: deploy plan and testbed with"
            " --value-range: 0.01; else none, every epoch cold]",
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

    NEEDS: ClassVar[Needs] = (("origin", "every", _CONTINUOUS),)

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
