"""``nlagg testbed``: a whole run on one machine, over a real broker, captured by the eavesdropper.

Starts the broker (a private Mosquitto or embedded amqtt unless ``broker_url`` is given),
publishes the retained public config, starts the eavesdropper (subscribed before any node
exists, so it sees every z^(0)), then the n nodes: separate ``nlagg node`` processes by default,
or tasks sharing one connection (``in_process``, for large n). Waits for everything, and builds
the summary from the ground truth (held here only) and what the eavesdropper captured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from adversary.transcript import Transcript

from ..config import RunConfig
from ..errors import ConfigError, NlaggError
from ..runtime.brokers import start_broker
from ..runtime.hosted import host_nodes
from ..runtime.mqtt import MqttTransport
from ..runtime.node import Node
from ..runtime.public import build_config_msg, run_edges
from ..runtime.wire import check_run_id, encode, topics
from ..schedule import distance_to, true_aggregate

__all__ = ["TestbedError", "new_run_id", "run_testbed"]

log = logging.getLogger("nlagg.testbed")
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
NODE_ENTRY = "from nlagg_node.cli import main; main()"


class TestbedError(NlaggError):
    """A node process failed or the run did not complete."""


def new_run_id() -> str:
    """A fresh run id (``tb-`` + 8 hex digits): retained statuses of older runs never mix in."""
    return f"tb-{secrets.token_hex(4)}"


class _Eavesdropper:
    """``nlagg eavesdrop --events`` as a child process (its own core; the nodes keep theirs)."""

    def __init__(self, proc: asyncio.subprocess.Process, say: Callable[[str], None]) -> None:
        self.proc = proc
        self.say = say
        self.exposures: list[dict[str, Any]] = []
        self.finished: dict[str, Any] | None = None
        self.subscribed = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls, url: str, run_id: str, prefix: str, db: Path, say: Callable[[str], None], nice: int = 0
    ) -> _Eavesdropper:
        cmd = [sys.executable, "-c", NODE_ENTRY, "eavesdrop", "--broker", url, "--run-id", run_id]
        cmd += ["--prefix", prefix, "--transcript", str(db), "--events", "--no-live"]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
        )
        if nice > 0 and hasattr(os, "setpriority"):
            # A passive observer must not slow the run it watches (on a real network it is another
            # machine): on a shared CPU it yields to the nodes and catches up in their idle time.
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        eaves = cls(proc, say)
        try:
            async with asyncio.timeout(30.0):
                await eaves.subscribed.wait()
        except TimeoutError:
            await eaves.stop()
            raise TestbedError("the eavesdropper did not subscribe within 30 s") from None
        return eaves

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "subscribed":
                self.subscribed.set()
            elif kind == "exposure":
                self.exposures.append(event)
                self.say(
                    f"eavesdropper: node {event['node']} exposed at t={event['t']} ({event['how']}): "
                    f"s = {event['value']!r}"
                )
            elif kind == "finished":
                self.finished = event

    async def wait_finished(self, within: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(within):
                await self.proc.wait()
                await self.reader
        except TimeoutError:
            return {"complete": False, "reason": f"still running after {within:g} s"}
        return self.finished or {"complete": False, "reason": f"exited with {self.proc.returncode}"}

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(5.0):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # closed by the caller's with-block


def _node_command(
    i: int,
    cfg_path: Path,
    value: float,
    url: str,
    run_id: str,
    prefix: str,
    corrupt: bool,
    timeout: float,
    seed: int,
) -> list[str]:
    """The ``nlagg node`` command of node i; ``--seed`` makes its z^(0) those of the simulator."""
    cmd = [sys.executable, "-c", NODE_ENTRY, "node", "--id", str(i), "--config", str(cfg_path)]
    cmd += ["--value", repr(float(value)), "--broker", url, "--run-id", run_id, "--prefix", prefix]
    cmd += ["--neighbour-timeout", repr(timeout), "--seed", str(seed), "--json"]
    if corrupt:
        cmd.append("--corrupt")
    return cmd


async def _run_processes(
    cfg: RunConfig,
    values: FloatArray,
    url: str,
    run_id: str,
    prefix: str,
    corrupt: set[int],
    workdir: Path,
    node_timeout: float,
) -> list[dict[str, Any]]:
    cfg_path = workdir / "run-config.json"
    cfg_path.write_text(json.dumps({"config": cfg.model_dump(mode="json")}))
    procs: list[asyncio.subprocess.Process] = []
    logs = []
    try:
        for i in range(cfg.n):
            log_path = workdir / f"node-{i}.log"
            logs.append(log_path)
            with _open_log(log_path) as err:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *_node_command(
                            i, cfg_path, values[i], url, run_id, prefix, i in corrupt, node_timeout, cfg.seed
                        ),
                        stdout=asyncio.subprocess.PIPE,
                        stderr=err,
                        stdin=asyncio.subprocess.DEVNULL,
                    )
                )
        outs = await asyncio.gather(*(p.communicate() for p in procs))
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    results = []
    for i, (p, (stdout, _)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            tail = logs[i].read_text(errors="replace").strip().splitlines()[-3:]
            raise TestbedError(f"node {i} exited with {p.returncode}: {' | '.join(tail)}")
        results.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return results


async def _run_in_process(
    cfg: RunConfig,
    values: FloatArray,
    url: str,
    run_id: str,
    prefix: str,
    corrupt: set[int],
    node_timeout: float,
) -> list[dict[str, Any]]:
    edges = run_edges(cfg)
    async with MqttTransport(url, client_id=f"nlagg-{run_id}-host") as transport:
        nodes = [
            Node(
                cfg,
                i,
                float(values[i]),
                transport,
                run_id=run_id,
                prefix=prefix,
                edges=edges,
                corrupt=i in corrupt,
                neighbour_timeout=node_timeout,
                own_transport=False,
            )
            for i in range(cfg.n)
        ]
        undecodable: list[str] = []
        results = await host_nodes(
            nodes, transport, prefix, run_id, on_reject=lambda topic, _exc: undecodable.append(topic)
        )
    out: list[dict[str, Any]] = [
        {"node": r.node, "output": r.output, "seconds": r.seconds, "rejected": r.rejected} for r in results
    ]
    out[0]["rejected"] += len(undecodable)  # the shared reader's count, reported once
    return out


async def run_testbed(
    cfg: RunConfig,
    *,
    run_id: str | None = None,
    prefix: str = "nlagg",
    broker_url: str | None = None,
    broker_kind: str = "auto",
    in_process: bool | None = None,
    corrupt: set[int] | None = None,
    out_dir: Path | None = None,
    neighbour_timeout: float = 60.0,
    eavesdropper_nice: int = 10,
    on_event: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run one testbed and return its summary (see the issue's ``--json`` fields).

    ``in_process=None`` picks the layout: one process per node, except on the embedded
    amqtt broker, where every node process would add its own delivery of every
    neighbour's x and the pure-Python broker becomes the bottleneck (48 rounds/s against
    180 in-process, n = 15): there the nodes share one connection.

    ``eavesdropper_nice`` lowers the eavesdropper process's CPU priority by that much (0: as
    the launcher). It still stores every message (the run fails otherwise); it only yields the
    CPU to the nodes while they compute and catches up in their idle time.
    """
    from ..sim.values import draw_values

    cfg = cfg.resolved().model_copy(update={"trials": 1})
    run_id = check_run_id(run_id or new_run_id())
    corrupt = set(corrupt or set())
    bad = sorted(i for i in corrupt if not 0 <= i < cfg.n)
    if bad:
        raise ConfigError("corrupt", bad, f"node ids must lie in 0..{cfg.n - 1}")
    if eavesdropper_nice < 0:
        raise ConfigError("eavesdropper_nice", eavesdropper_nice, "must be 0 or more (a lower priority)")
    say = on_event or (lambda _msg: None)
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    truth_lo, truth_hi = true_aggregate(cfg, values[None])
    t = topics(prefix, run_id)
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        if out_dir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nlagg-testbed-")))
        else:
            workdir = out_dir
            workdir.mkdir(parents=True, exist_ok=True)
        db_path = workdir / "transcript.sqlite"
        if db_path.exists():
            raise NlaggError(f"{db_path} exists; choose another --out directory")
        if broker_url is None:
            handle = await stack.enter_async_context(start_broker(broker_kind))  # type: ignore[arg-type]
            url, kind = handle.url, str(handle.kind)
        else:
            url, kind = broker_url, "external"
        say(f"broker {kind} at {url}; run {run_id}")
        if in_process is None:
            in_process = kind == "amqtt"
            if in_process:
                say("embedded broker: hosting the nodes in one process (--processes to override)")
        launcher = await stack.enter_async_context(MqttTransport(url, client_id=f"nlagg-{run_id}-launcher"))
        await launcher.publish(t.config, encode(build_config_msg(cfg, run_id, edges)), qos=1, retain=True)
        eaves = await _Eavesdropper.start(url, run_id, prefix, db_path, say, eavesdropper_nice)
        stack.push_async_callback(eaves.stop)
        say(f"starting {cfg.n} nodes ({'in-process' if in_process else 'one process each'})")
        t_nodes = time.perf_counter()
        if in_process:
            results = await _run_in_process(cfg, values, url, run_id, prefix, corrupt, neighbour_timeout)
        else:
            results = await _run_processes(
                cfg, values, url, run_id, prefix, corrupt, workdir, neighbour_timeout
            )
        node_wall = time.perf_counter() - t_nodes
        finished = await eaves.wait_finished(30.0)
        if not finished.get("complete"):
            raise TestbedError(
                f"the nodes finished but the eavesdropper did not see every 'done': {finished}"
            )
        with Transcript(db_path) as transcript:
            captured = {i: st.output for i, st in transcript.statuses().items() if st.state == "done"}
            stored = transcript.count()
        summary = _summary(cfg, run_id, values, truth_lo, truth_hi, results, corrupt, node_wall)
        summary.update(_capture_summary(cfg, values, corrupt, eaves.exposures, captured, stored, finished))
        summary.update(
            broker=kind,
            broker_url=url,
            in_process=in_process,
            eavesdropper_nice=eavesdropper_nice,
            wall_seconds=time.perf_counter() - started,
            transcript=str(db_path) if out_dir is not None else None,
        )
        if out_dir is not None:
            _write_outputs(out_dir, cfg, summary)
    return summary


def _summary(
    cfg: RunConfig,
    run_id: str,
    values: FloatArray,
    truth_lo: FloatArray,
    truth_hi: FloatArray,
    results: list[dict[str, Any]],
    corrupt: set[int],
    node_wall: float,
) -> dict[str, Any]:
    from ..schedule import plan_phases

    t_total = sum(p.t_len for p in plan_phases(cfg))
    lo, hi = np.ravel(truth_lo[0]), np.ravel(truth_hi[0])
    outputs = {int(r["node"]): [float(v) for v in r["output"]] for r in results}
    err = np.array([distance_to(np.array(outputs[i]), lo, hi) for i in range(cfg.n)])
    slowest = max(float(r["seconds"]) for r in results)
    single = cfg.op != "topk"
    return {
        "run_id": run_id,
        "op": cfg.op,
        "n": cfg.n,
        "graph": cfg.graph,
        "edges": len(run_edges(cfg)),
        "seed": cfg.seed,
        "true_value": float(lo[0]) if single and lo[0] == hi[0] else [float(v) for v in lo],
        "true_interval": [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)],
        "final_x": {str(i): (outputs[i][0] if single else outputs[i]) for i in range(cfg.n)},
        "exact": bool((err <= 1e-9).all()),
        "mse": float((err**2).sum(axis=1).mean()),
        "private_values": {str(i): float(values[i]) for i in range(cfg.n)},
        "corrupted": sorted(corrupt),
        "iterations": t_total,
        "rounds_per_second": t_total / slowest if slowest > 0 else 0.0,
        "node_wall_seconds": node_wall,
        "messages_rejected_by_nodes": sum(int(r.get("rejected", 0)) for r in results),
    }


def _capture_summary(
    cfg: RunConfig,
    values: FloatArray,
    corrupt: set[int],
    exposures: list[dict[str, Any]],
    captured: dict[int, list[float] | None],
    stored: int,
    finished: dict[str, Any],
) -> dict[str, Any]:
    """What the eavesdropper got, checked against the ground truth."""
    honest = [e for e in exposures if int(e["node"]) not in corrupt]
    return {
        "messages_captured": stored,
        "messages_rejected": int(finished.get("rejected", 0)),
        "final_x_captured": {str(i): captured.get(i) for i in range(cfg.n)},
        "exposed_nodes": sorted({int(e["node"]) for e in honest}),
        "exposures": {
            str(e["node"]): {
                "t": int(e["t"]),
                "value": float(e["value"]),
                "how": str(e["how"]),
                "correct": bool(abs(float(e["value"]) - float(values[int(e["node"])])) <= 1e-9),
            }
            for e in honest
        },
    }


def _write_outputs(out: Path, cfg: RunConfig, summary: dict[str, Any]) -> None:
    from ..sim.output import package_versions

    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    manifest = {
        "kind": "nlagg-testbed",
        "config": cfg.model_dump(mode="json"),
        "seed": cfg.seed,
        "run_id": summary["run_id"],
        "corrupted": summary["corrupted"],
        "in_process": summary["in_process"],
        "broker": summary["broker"],
        "versions": package_versions(),
        "replay": "nlagg sim --config manifest.json --trials 1 --record all  (same numbers, bit for bit)",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
