"""The epoch testbed's eavesdropper: ``nlagg eavesdrop --continuous`` as a child process, given the
deployment's public config and declared drift (each epoch's configuration derived as the nodes
derive it: :class:`adversary.capture.epochconfig.EpochConfigs`), capturing every epoch and its
cold rerun into an epoch store; the summary's exposures are :func:`adversary.epochs.attack_epochs`
of that store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TypedDict

from ..argv import eavesdrop_argv, this_python
from ..config import RunConfig
from ..errors import TestbedError
from .children import Child, log_tail

__all__ = ["CapturedEpoch", "EpochCaptureSummary", "capture_report", "start_epoch_capture", "until_captured"]

STORE = "epochs"
"""The epoch store's folder inside the testbed's run folder."""


class CapturedEpoch(TypedDict):
    """One epoch as the eavesdropper's attack saw it."""

    epoch: int
    exposed: list[int]
    complete: bool
    output: float | None
    error: str | None


class EpochCaptureSummary(TypedDict):
    store: str
    epochs: list[CapturedEpoch]
    cumulative_exposed: dict[str, int]  # node -> the first epoch it was exposed in
    interval_soundness: float  # the combined intervals that hold the true values (1.0: all)


async def start_epoch_capture(
    url: str, run_id: str, prefix: str, cfg: RunConfig, drift: float | None, workdir: Path, epochs: int
) -> Child:
    """Start the capture of ``epochs`` epochs into ``workdir/epochs`` (``drift``: the declared drift;
    None: every epoch cold); returned once it has subscribed (before epoch 0 may start)."""
    cfg_path = workdir / "deployment-config.json"
    cfg_path.write_text(json.dumps({"config": cfg.model_dump(mode="json")}))
    argv = eavesdrop_argv(
        url,
        run_id,
        str(workdir / STORE),
        prefix=prefix,
        events=True,
        live=False,
        continuous=True,
        epochs=epochs,
        config=str(cfg_path),
        drift=drift,
        cold_start=drift is None,
        program=this_python(),
    )
    log = workdir / "eavesdropper.log"
    child = await Child.start(argv, log=log, nice=10)
    try:
        async with asyncio.timeout(180.0):  # a niced child's imports can be slow on a loaded machine
            while not child.subscribed.is_set():
                if child.returncode is not None:
                    raise TestbedError(f"the eavesdropper exited first: {' | '.join(log_tail(log))}")
                await asyncio.sleep(0.05)
    except TimeoutError:
        await child.stop()
        raise TestbedError("the eavesdropper did not subscribe within 180 s") from None
    return child


async def until_captured(child: Child, within: float) -> None:
    """Wait (at most ``within`` s) for the capture to close its epochs and exit, else stop it (the
    store then holds what it closed)."""
    try:
        async with asyncio.timeout(within):
            await child.wait()
    except TimeoutError:
        await child.stop()


def capture_report(workdir: Path, drift: float | None, truth: dict[int, Any]) -> EpochCaptureSummary:
    """The attack on the store in ``workdir`` (``drift``: the values' real walk, to combine the
    intervals; None: not combined), scored against ``truth[k]``, epoch k's values."""
    from adversary.epochs import attack_epochs

    report = attack_epochs(workdir / STORE, drift=drift)
    return {
        "store": str(workdir / STORE),
        "epochs": [
            {
                "epoch": e.epoch,
                "exposed": e.exposed,
                "complete": e.complete,
                "output": e.output,
                "error": e.error,
            }
            for e in report.epochs
        ],
        "cumulative_exposed": {str(i): k for i, k in sorted(report.cumulative.items())},
        "interval_soundness": report.interval_soundness(truth),
    }
