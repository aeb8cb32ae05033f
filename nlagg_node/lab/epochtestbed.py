"""``nlagg testbed --epochs K --every S``: a continuous deployment on one machine.

The broker (private unless given) and n nodes that run K epochs of a continuous deployment
(:mod:`nlagg_node.runtime.epochdriver`), each epoch with fresh private values (the run's value
distribution with a seed of its own, so values change from epoch to epoch). Nodes are tasks of
this process (each with its own connection per epoch, as on a device) or ``nlagg node --every``
processes, whose value files are rewritten half a period before each epoch's start. The nodes draw
from the run seed's streams, so with drifting values the epochs are ``nlagg sim --epochs K
--trials 1``'s, bit for bit (:mod:`nlagg_node.epochplan`). The summary lists each epoch's outputs
checked against the aggregate of the nodes present.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import numpy as np

from ..argv import node_argv, this_python
from ..arrays import FloatArray
from ..config import RunConfig
from ..errors import ConfigError, TestbedError
from ..lifetime import owned_tempdir
from ..private import write_private
from ..rng import rng_for
from ..runtime.brokers import start_broker
from ..runtime.epochdriver import EpochClock, join_window, run_epochs
from ..runtime.epochmqtt import epoch_mqtt
from ..runtime.mqtt import MqttTransport
from ..runtime.public import run_edges
from ..schedule import true_aggregate
from ..sim.values import run_values
from ..valuechecks import check_node_value, check_start
from ..valuemap import scale_for
from ..verdict import ideal_nodes
from .children import Child, log_tail
from .epochcapture import EpochCaptureSummary, capture_report, start_epoch_capture, until_captured

__all__ = ["EpochRow", "EpochSummary", "epoch_values", "run_epoch_testbed"]


@dataclass(frozen=True)
class Warm:
    """The testbed's warm starts: the declared ``drift`` (None: every epoch cold, ``--cold-start``)
    and ``walk``, the drift the values walk by (None: drawn afresh each epoch)."""

    drift: float | None = 0.0
    walk: float | None = None


def start_lead(in_process: bool, n: int) -> float:
    """Seconds between the launch and epoch 0's start: node processes start Python meanwhile (one
    that misses epoch 0's start sits it out and joins epoch 1)."""
    return 2.0 if in_process else 5.0 + n


class EpochRow(TypedDict):
    """One epoch of the summary: its outputs against the aggregate of the nodes present."""

    epoch: int
    exact: bool
    output: float | list[float] | None  # the first present node's (all agree when exact)
    iterations: int  # the most any node ran
    true_value: float | list[float] | None  # the interval's low end (an even median's: see below)
    true_interval: list[list[float]]  # [lo, hi] of each output (a median of an even count: between)
    present: list[int]
    ideal: list[int]  # the present nodes whose values every exact protocol exposes (the output's holders)
    skipped: bool  # no node ran it (the previous epoch overran its period)
    start: str | None  # the first present node's: "cold", "warm" or "fell back" (warm, then rerun cold)


class EpochSummary(TypedDict):
    run_id: str
    op: str
    n: int
    every: float
    epochs: list[EpochRow]
    exact: bool  # every epoch that ran
    skipped: int
    broker: str
    in_process: bool
    wall_seconds: float
    capture: NotRequired[EpochCaptureSummary]  # with capture: the eavesdropper's attack per epoch


def epoch_values(cfg: RunConfig, epoch: int, drift: float | None = None) -> FloatArray:
    """The private values of epoch ``epoch`` (user units): the run's distribution, a seed per epoch;
    with a ``drift`` > 0, the simulator's bounded random walk from epoch 0's values instead
    (:func:`~nlagg_node.epochplan.walk_values`: steps uniform in [-D, D] of the range's span)."""
    if drift:
        from ..epochplan import walk_values

        walk = walk_values(cfg.model_copy(update={"values_file": None, "trials": 1}), epoch + 1, drift)
        values = np.asarray(walk[epoch, 0], dtype=float)
    else:
        seed = int(rng_for(cfg.seed, "testbed-epoch", epoch).integers(2**63))
        values = np.asarray(
            run_values(cfg.model_copy(update={"seed": seed, "values_file": None}), 1)[0], dtype=float
        )
    for v in values:
        check_start(cfg, float(v))
    return values


async def _in_process(
    cfg: RunConfig, url: str, run_id: str, prefix: str, clock: EpochClock, patience: float, warm: Warm
) -> list[list[dict[str, Any]]]:
    edges = run_edges(cfg)
    scale = scale_for(cfg)

    async def node(i: int) -> list[dict[str, Any]]:
        async def value_for(k: int) -> float:
            return check_node_value(cfg, float(epoch_values(cfg, k, warm.walk)[i]))

        async def transport_for(k: int, run: str) -> MqttTransport:
            return await epoch_mqtt(url, f"nlagg-{run_id}-node-{i}", (prefix, run_id), i, k, run=run)

        outcomes = run_epochs(
            cfg,
            i,
            value_for,
            transport_for,
            clock,
            deployment=(prefix, run_id),
            to_user=scale.user_float,
            edges=edges,
            neighbour_timeout=patience,
            seed="config",  # the simulator's streams: sim --epochs K --trials 1, bit for bit
            drift=warm.drift,
        )
        return [
            {
                "epoch": o.epoch,
                "output": None if o.output is None else o.output.output,
                "iterations": 0 if o.output is None else o.output.iterations,
                "start": o.start,
            }
            async for o in outcomes
        ]

    return list(await asyncio.gather(*(node(i) for i in range(cfg.n))))


async def _processes(
    cfg: RunConfig,
    url: str,
    run_id: str,
    prefix: str,
    clock: EpochClock,
    patience: float,
    workdir: Path,
    warm: Warm,
) -> list[list[dict[str, Any]]]:
    cfg_path = workdir / "run-config.json"
    cfg_path.write_text(json.dumps({"config": cfg.model_dump(mode="json")}))
    private = workdir / "private"

    def write_values(k: int) -> None:
        for i, v in enumerate(epoch_values(cfg, k, warm.walk)):
            write_private(private / f"value-{i}", f"{float(v)!r}\n")

    write_values(0)
    seed_file = write_private(private / "seed", f"{cfg.seed}\n")  # in a 0600 file: not in ps
    procs: list[Child] = []
    try:
        for i in range(cfg.n):
            argv = node_argv(
                i,
                str(cfg_path),
                url,
                value_file=str(private / f"value-{i}"),
                seed_file=str(seed_file),
                run_id=run_id,
                prefix=prefix,
                neighbour_timeout=patience,
                as_json=True,
                program=this_python(),
                every=clock.period,
                epochs=clock.epochs,
                origin=clock.origin,
                drift=warm.walk,
                cold_start=warm.drift is None or None,
            )
            procs.append(await Child.start(argv, log=workdir / f"node-{i}.log"))
        for k in range(1, clock.epochs or 0):  # each epoch's values, half a period before it starts
            await asyncio.sleep(max(0.0, clock.start(k) - clock.period / 2 - time.time()))
            write_values(k)
        codes = await asyncio.gather(*(p.wait() for p in procs))
    finally:
        for p in procs:
            await p.kill()
        shutil.rmtree(private, ignore_errors=True)
    for i, rc in enumerate(codes):
        if rc != 0:
            raise TestbedError(
                f"node {i} exited with {rc}: {' | '.join(log_tail(workdir / f'node-{i}.log'))}"
            )
    return [[e for e in p.events if "epoch" in e] for p in procs]


def _rows(
    cfg: RunConfig, reports: list[list[dict[str, Any]]], epochs: int, walk: float | None
) -> list[EpochRow]:
    """Each epoch's outputs against the aggregate of the nodes that took part in it."""
    rows: list[EpochRow] = []
    span = scale_for(cfg).span
    for k in range(epochs):
        got = {
            i: r for i, rs in enumerate(reports) for r in rs if r["epoch"] == k and r["output"] is not None
        }
        present = sorted(got)
        values = epoch_values(cfg, k, walk)
        lo, hi = true_aggregate(cfg, values[None, present]) if present else (np.zeros(1), np.zeros(1))
        lo, hi = np.ravel(lo), np.ravel(hi)
        errs = [
            np.maximum(np.maximum(lo - np.ravel(got[i]["output"]), np.ravel(got[i]["output"]) - hi), 0).max()
            / span
            for i in present
        ]
        single = cfg.op != "topk"
        rows.append(
            {
                "epoch": k,
                "exact": bool(present and max(errs) <= cfg.tolerance),
                "output": got[present[0]]["output"] if present else None,
                "iterations": max((int(got[i]["iterations"]) for i in present), default=0),
                "true_value": None if not present else float(lo[0]) if single else [float(v) for v in lo],
                "true_interval": [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)]
                if present
                else [],
                "present": present,
                "ideal": _ideal(cfg, values, present),
                "skipped": not present,
                "start": got[present[0]].get("start") if present else None,
            }
        )
    return rows


def _ideal(cfg: RunConfig, values: FloatArray, present: list[int]) -> list[int]:
    """The present nodes the ideal world exposes in an epoch: the output's holders among them."""
    if len(present) < 2:
        return list(present)
    among = cfg.model_copy(update={"n": len(present)})
    return sorted(present[r] for r in ideal_nodes(among, values[present]))


async def run_epoch_testbed(
    cfg: RunConfig,
    epochs: int,
    every: float,
    *,
    run_id: str,
    prefix: str = "nlagg",
    broker_url: str | None = None,
    broker_kind: str = "auto",
    in_process: bool | None = None,
    neighbour_timeout: float = 60.0,
    out_dir: Path | None = None,
    drift: float | None = None,
    cold_start: bool = False,
    capture: bool = False,
) -> EpochSummary:
    """Run ``epochs`` epochs ``every`` seconds apart on one machine and return the summary.

    ``drift``: the declared drift of warm starts (None: every epoch cold) and the values' walk
    (None: values drawn afresh each epoch); ``cold_start``: every epoch cold; ``capture``: an eavesdropper
    captures every epoch into an epoch store in the run folder (``out_dir``, else a temporary one)
    and the summary's ``capture`` holds the attack's exposures per epoch
    (:mod:`nlagg_node.lab.epochcapture`)."""
    warm = Warm(None if cold_start else drift, drift)
    cfg = cfg.resolved().model_copy(update={"trials": 1})
    if epochs < 1:
        raise ConfigError("epochs", epochs, "must be 1 or more")
    for k in range(epochs):
        epoch_values(cfg, k, drift)  # a value the start would not protect: refused before anything starts
    started = time.time()
    async with AsyncExitStack() as stack:
        if broker_url is None:
            handle = await stack.enter_async_context(start_broker(broker_kind))  # type: ignore[arg-type]
            url, kind = handle.url, str(handle.kind)
        else:
            url, kind = broker_url, "external"
        layout = kind == "amqtt" if in_process is None else in_process
        workdir = out_dir if out_dir is not None else stack.enter_context(owned_tempdir("testbed"))
        eaves = None
        if capture:
            workdir.mkdir(parents=True, exist_ok=True)
            eaves = await start_epoch_capture(url, run_id, prefix, cfg, warm.drift, workdir, epochs)
            stack.push_async_callback(eaves.stop)
        clock = EpochClock(time.time() + start_lead(layout, cfg.n), every, epochs, join_window(every))
        if layout:
            reports = await _in_process(cfg, url, run_id, prefix, clock, neighbour_timeout, warm)
        else:
            reports = await _processes(cfg, url, run_id, prefix, clock, neighbour_timeout, workdir, warm)
        captured = None
        if eaves is not None:
            await until_captured(eaves, 2.0 * every + 30.0)
            truth = {k: epoch_values(cfg, k, drift) for k in range(epochs)}
            captured = capture_report(workdir, drift or None, truth)
    rows = _rows(cfg, reports, epochs, drift)
    summary: EpochSummary = {
        "run_id": run_id,
        "op": cfg.op,
        "n": cfg.n,
        "every": every,
        "epochs": rows,
        "exact": all(r["exact"] for r in rows if not r["skipped"]),
        "skipped": sum(r["skipped"] for r in rows),
        "broker": kind,
        "in_process": layout,
        "wall_seconds": time.time() - started,
    }
    if captured is not None:
        summary["capture"] = captured
    return summary
