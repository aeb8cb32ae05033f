"""``nlagg node --every S``: one node of a continuous deployment (:mod:`nlagg_node.runtime.epochdriver`).

The node reads its value source again at each epoch's start, connects with that epoch's last
will, runs the epoch, publishes its output on the results topic, appends it to ``--results-file``
and reports it (one line per epoch; one JSON object per epoch with ``--json``). A SIGTERM stops it
between or during epochs (a service manager restarts it; it rejoins at the next start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NlaggError
from ..options import NodeOptions
from ..options.opt import refuse_conflicts
from .start import NodeStart

if TYPE_CHECKING:
    from ..runtime.epochdriver import EpochClock

__all__ = [
    "check_epoch_options",
    "epoch_clock",
    "epoch_line",
    "print_epochs",
    "results_path",
    "run_node_epochs",
]


def check_epoch_options(opts: NodeOptions) -> None:
    """Refuse what a continuous node cannot have (before anything connects)."""
    refuse_conflicts(opts)  # a node file's options too (NodeOptions.NEEDS and EXCLUDES)


def results_path(opts: NodeOptions) -> Path | None:
    """Where a continuous node appends its outputs: ``--results-file``, else ``results-<id>.jsonl``
    in ``--state-dir`` (which keeps no checkpoint: a restarted node rejoins at the next epoch)."""
    if opts.results_file is not None:
        return Path(opts.results_file)
    return None if opts.state_dir is None else Path(opts.state_dir) / f"results-{opts.id}.jsonl"


def epoch_clock(every: float, epochs: int | None, origin: float | None) -> EpochClock:
    """The :class:`~nlagg_node.runtime.epochdriver.EpochClock` of these options (origin 0: aligned starts)."""
    from ..runtime.epochdriver import EpochClock, join_window

    return EpochClock(0.0 if origin is None else origin, every, epochs, join_window(every))


async def run_node_epochs(
    start: NodeStart, stop: asyncio.Event | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Run the node's epochs; yield each epoch's report (user units) as it ends. ``stop`` set: leave
    the epoch running cleanly and end (:func:`~nlagg_node.runtime.epochdriver.run_epochs`)."""
    from ..runtime.epochdriver import run_epochs
    from ..runtime.epochmqtt import epoch_mqtt
    from ..runtime.mqtt import MqttTransport
    from ..runtime.outputs import append_output
    from ..valuechecks import check_node_value
    from ..valuesource import read_value, source_from_flags

    o = start.opts
    assert o.every is not None
    results = results_path(o)
    source = source_from_flags(o.value, o.value_file, o.value_cmd)
    assert source is not None  # prepare_node refused a node without one

    async def value_for(_epoch: int) -> float:
        return check_node_value(start.cfg, await asyncio.to_thread(read_value, source))

    async def transport_for(epoch: int, run: str) -> MqttTransport:
        client_id = f"nlagg-{start.run_id}-node-{o.id}"
        where = (start.prefix, start.run_id)
        return await epoch_mqtt(
            o.broker,
            client_id,
            where,
            o.id,
            epoch,
            username=o.username,
            password=start.password,
            tls=start.tls,
            run=run,
            identity=start.identity,
        )

    outcomes = run_epochs(
        start.cfg,
        o.id,
        value_for,
        transport_for,
        epoch_clock(o.every, o.epochs, o.origin),
        deployment=(start.prefix, start.run_id),
        to_user=start.scale.user_float,
        stop=stop,
        drift=o.warm_drift,
        seed=start.seed,
        corrupt=o.corrupt,
        neighbour_timeout=o.neighbour_timeout,
        startup_timeout=o.startup_timeout,
        departure_timeout=o.departure_timeout,
        identities=start.identities,
        identity=start.identity,
    )
    async for out in outcomes:
        report: dict[str, Any] = {"node": o.id, "epoch": out.epoch, "output": None, "start": out.start}
        if out.output is not None:
            report.update(output=out.output.output, iterations=out.output.iterations, time=out.output.time)
            if results is not None:
                append_output(results, out.output)
        if out.absent:
            report["absent"] = list(out.absent)
        if out.skipped:
            report["skipped"] = out.skipped
        if out.missed is not None:
            report["missed"] = out.missed
        if out.output is None:  # an error record, never a silent null (issue 43, break 5)
            report["error"] = f"epoch {out.epoch}: no output ({out.missed or 'the node did not finish it'})"
        if out.read is not None:
            report.update(read=out.read.output, read_epoch=out.read.epoch)
        yield report


def epoch_line(report: dict[str, Any]) -> str:
    """What ``nlagg node --every`` prints for an epoch (without ``--json``)."""
    head = f"node {report['node']}: epoch {report['epoch']}"
    if report["output"] is None:
        return f"{head}: missed ({report.get('missed')})"
    absent = f", neighbour(s) {report['absent']} absent" if "absent" in report else ""
    start = report["start"]
    if "read" in report:
        before = report.get("read_epoch", report["epoch"] - 1)
        start += " from the published " + ("" if before == report["epoch"] - 1 else f"epoch {before}: ")
        start += str(report["read"])
    return f"{head}: output {report['output']} after {report['iterations']} iterations, {start}{absent}"


async def print_epochs(start: NodeStart, as_json: bool) -> None:
    """Run the node's epochs and print a line for each (JSON with ``as_json``) as it ends; a SIGTERM
    (a service manager's stop or restart) leaves the epoch running cleanly, then the node exits."""
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ran, missed = 0, []
    async for report in run_node_epochs(start, stop):
        print(json.dumps(report) if as_json else epoch_line(report), flush=True)
        ran += 1
        if report["output"] is None and not str(report.get("missed", "")).startswith("left at"):
            missed.append(report["epoch"])
    over = "stopped" if stop.is_set() else "the deployment's epochs are over"
    print(f"node {start.opts.id}: {over}", file=sys.stderr)
    if ran and len(missed) == ran:  # not one output: a failure, not exit 0 with outputs null
        raise NlaggError(f"node {start.opts.id}: no output in any of its {ran} epoch(s) {missed}")
