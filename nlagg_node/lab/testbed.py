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
import secrets
import shutil
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from adversary.transcript import Transcript

from ..argv import node_argv, this_python
from ..arrays import FloatArray, IntArray
from ..config import RunConfig
from ..departure import check_departures, components
from ..errors import BrokerUnreachableError, ConfigError, NlaggError, TestbedError
from ..inputs import make_output_dir
from ..lifetime import owned_tempdir
from ..private import write_private
from ..protocol.identity import Identity, new_identity
from ..runtime.brokers import start_broker
from ..runtime.hosted import host_nodes
from ..runtime.member import check_neighbour_timeout
from ..runtime.mqtt import MqttTransport
from ..runtime.node import Node
from ..runtime.public import build_config_msg, run_edges
from ..runtime.runparts import RunParts
from ..runtime.tls import TlsSettings
from ..runtime.wire import ConfigMsg, check_run_id, encode, topics
from ..schedule import Schedule, plan_phases, true_aggregate
from ..sim.departures import survivor_truth
from ..valuechecks import check_node_value, check_start
from ..valuemap import scale_for
from .children import Child, log_tail, start_eavesdropper
from .progress import RunProgress, Snapshot
from .summary import (
    CaptureOutcome,
    Departures,
    NodeReport,
    RunOutcome,
    TestbedSummary,
    capture_outcome,
    departure_outcome,
    run_outcome,
    write_outputs,
)

__all__ = ["new_run_id", "run_testbed"]

log = logging.getLogger("nlagg.testbed")


def new_run_id() -> str:
    """A fresh run id (``tb-`` + 8 hex digits): retained statuses of older runs never mix in."""
    return f"tb-{secrets.token_hex(4)}"


class _Eavesdropper:
    """``nlagg eavesdrop --events`` as a child process (its own core; the nodes keep theirs).

    Its log goes to ``log`` (the run folder's ``eavesdropper.log``), not into the testbed's
    output; its warnings are said when they concern a broker the user gave (``external``): that
    the testbed's own private broker admits anonymous clients is known and not theirs to fix.
    """

    def __init__(self, say: Callable[[str], None], log: Path, external: bool) -> None:
        self.say = say
        self.log = log
        self.external = external
        self.exposures: list[dict[str, Any]] = []
        self.child: Child | None = None

    async def start(
        self, url: str, run_id: str, prefix: str, db: Path, nice: int, ca_file: Path | None = None
    ) -> None:
        # A passive observer must not slow the run it watches (on a real network it is another
        # machine): on a shared CPU it yields to the nodes (``nice``) and catches up in their idle time.
        self.child = await start_eavesdropper(
            url, run_id, prefix, db, log=self.log, nice=nice, on_event=self._event, ca_file=ca_file
        )

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "warning" and self.external:
            self.say(f"eavesdropper: {event.get('message')}")
        if event.get("event") == "exposure":
            self.exposures.append(event)
            self.say(
                f"eavesdropper: node {event['node']} exposed at t={event['t']} ({event['how']}): "
                f"s = {event['value']!r}"
            )

    async def wait_complete(self, within: float) -> dict[str, Any]:
        """The eavesdropper's ``finished`` event once it saw every node's ``done``, or a
        :class:`TestbedError` quoting the event and its log."""
        finished = await self.wait_finished(within)
        if not finished.get("complete"):
            tail = " | ".join(log_tail(self.log))
            raise TestbedError(
                f"the nodes finished but the eavesdropper did not see every 'done': {finished}"
                + (f" (its log: {tail})" if tail else "")
            )
        return finished

    async def wait_finished(self, within: float) -> dict[str, Any]:
        """Its ``finished`` event; it may take ``within`` seconds more for as long as it keeps working
        (its CPU time grows): a niced capture on a busy machine drains its backlog slowly, a stuck one
        does not use the CPU."""
        child = self.child
        assert child is not None
        used = child.cpu_seconds()
        while True:
            try:
                async with asyncio.timeout(within):
                    rc = await child.wait()
                break
            except TimeoutError:
                before, used = used, child.cpu_seconds()
                if before is None or used is None or used - before < 0.01 * within:
                    return {"complete": False, "reason": f"still running after {within:g} s without progress"}
        return child.last_event("finished") or {"complete": False, "reason": f"exited with {rc}"}

    async def stop(self) -> None:
        if self.child is not None:
            await self.child.stop()

    async def guard(self, nodes: asyncio.Future[list[NodeReport]]) -> list[NodeReport]:
        """The nodes' results; if the eavesdropper dies first (without having seen every node done),
        the nodes are stopped at once and :class:`TestbedError` says so."""
        assert self.child is not None
        child = self.child
        died: asyncio.Future[Any] = asyncio.ensure_future(child.wait())
        try:
            await asyncio.wait([nodes, died], return_when=asyncio.FIRST_COMPLETED)
            if not nodes.done() and not (child.last_event("finished") or {}).get("complete"):
                nodes.cancel()
                await asyncio.gather(nodes, return_exceptions=True)
                said = " | ".join(child.lines[-3:] + log_tail(self.log)) or "none"
                raise TestbedError(
                    f"the eavesdropper exited with code {child.returncode} while the nodes were running;"
                    f" the run was stopped (its last output: {said})"
                )
            return await nodes
        finally:
            died.cancel()
            if not nodes.done():  # cancelled (Ctrl-C): the nodes stop now, not at their next timeout
                nodes.cancel()
                await asyncio.gather(nodes, return_exceptions=True)


class _ForgetInterrupted:
    """An exit callback: an interrupted run (Ctrl-C) leaves nothing in ``--out``, which the next run
    may then claim and ``nlagg report`` never mistakes for a run (a failed one keeps its logs)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    async def __call__(self, exc_type: type[BaseException] | None, *_: object) -> bool:
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError | KeyboardInterrupt):
            for pattern in _RUN_FILES:
                for path in self.out.glob(pattern):
                    path.unlink(missing_ok=True)
            shutil.rmtree(self.out / "private", ignore_errors=True)
        return False


_RUN_FILES = ("transcript.sqlite*", "run-config.json", "node-*.log", "eavesdropper.log", "summary.json")


@dataclass(frozen=True)
class _Nodes:
    """The n nodes of a run: what each one is started with."""

    cfg: RunConfig
    values: FloatArray  # private, one per node
    url: str
    run_id: str
    prefix: str
    corrupt: set[int]
    timeout: float  # seconds a node waits at a barrier
    departures: dict[int, int]  # node -> T: killed (SIGKILL) once its neighbours hold its x^(T-1)
    ca_file: Path | None = None  # verifies an mqtts:// broker
    identities: tuple[Identity, ...] = ()  # one per node when the run signs its messages (auth)

    @property
    def public_keys(self) -> list[str] | None:
        return [identity.public for identity in self.identities] if self.identities else None


async def probe_broker(url: str, tls: TlsSettings | None, run_id: str, within: float = 5.0) -> None:
    """One MQTT connect to ``url`` within ``within`` s, or :class:`TestbedError` saying why: a port
    that is not an MQTT broker's would otherwise be retried silently for minutes."""
    try:
        async with MqttTransport(
            url, client_id=f"nlagg-{run_id}-probe", tls=tls, reconnect_tries=1, connect_timeout=within
        ):
            pass
    except BrokerUnreachableError as exc:
        raise TestbedError(f"no MQTT broker answers at {url} ({exc.last or exc}); check --broker") from None


def _tls(ca_file: Path | None) -> TlsSettings | None:
    return None if ca_file is None else TlsSettings(ca_file=ca_file)


async def _run_processes(run: _Nodes, workdir: Path) -> list[NodeReport]:
    cfg = run.cfg
    cfg_path = workdir / "run-config.json"
    doc: dict[str, object] = {"config": cfg.model_dump(mode="json")}
    if run.identities:
        doc["identities"] = {"ed25519": run.public_keys}
    cfg_path.write_text(json.dumps(doc))
    # The private value and the seed travel in 0600 files: neither shows in ps.
    private = workdir / "private"
    seed_file = write_private(private / "seed", f"{cfg.seed}\n")
    procs: list[Child] = []
    try:
        for i in range(cfg.n):
            argv = node_argv(
                i,
                str(cfg_path),
                run.url,
                value_file=str(write_private(private / f"value-{i}", f"{float(run.values[i])!r}\n")),
                run_id=run.run_id,
                prefix=run.prefix,
                neighbour_timeout=run.timeout,
                seed_file=str(seed_file),  # its z^(0) are those of the simulator
                ca_file=None if run.ca_file is None else str(run.ca_file),
                as_json=True,
                corrupt=i in run.corrupt,
                leave_after=run.departures.get(i),
                leave_by="kill" if i in run.departures else None,
                signing_key=_key_file(run, private, i),
                program=this_python(),
            )
            procs.append(await Child.start(argv, log=workdir / f"node-{i}.log"))
        codes = await asyncio.gather(*(p.wait() for p in procs))
    finally:
        for p in procs:
            await p.kill()
        shutil.rmtree(private, ignore_errors=True)  # read at start; nothing private stays in the run folder
    results = []
    try:
        for i, (p, rc) in enumerate(zip(procs, codes, strict=True)):
            if i in run.departures:
                # It should have been killed at its departure, unless early stopping ended its run
                # before (it finished: the simulator's trial has no such departure either).
                if rc < 0:
                    continue
                if not (rc == 0 and run.cfg.early_stop and p.events):
                    raise TestbedError(
                        f"node {i} was to depart at t={run.departures[i]} but exited with {rc}"
                    )
            if rc != 0 or not p.events:
                raise TestbedError(
                    f"node {i} exited with {rc}: {' | '.join(log_tail(workdir / f'node-{i}.log'))}"
                )
            results.append(cast(NodeReport, p.events[-1]))  # the JSON line of nlagg node --json
    finally:
        for i in range(len(procs)):  # a node that logged nothing leaves no empty file in the run folder
            log = workdir / f"node-{i}.log"
            if log.is_file() and log.stat().st_size == 0:
                log.unlink()
    return results


def _key_file(run: _Nodes, private: Path, i: int) -> str | None:
    """Node ``i``'s signing key in a 0600 file of the run's private folder (None: a run without)."""
    if not run.identities:
        return None
    return str(write_private(private / f"identity-{i}.pem", run.identities[i].pem()))


async def _run_in_process(run: _Nodes) -> list[NodeReport]:
    edges = run_edges(run.cfg)
    # Built before connecting, with the run's shape and config built once: at n = 1000 a node is
    # built in 0.5 ms this way, against 118 ms with its own (the keepalive expired meanwhile).
    parts = RunParts.of(run.cfg, run.run_id, edges, run.public_keys)
    transport = MqttTransport(run.url, client_id=f"nlagg-{run.run_id}-host", tls=_tls(run.ca_file))
    nodes = [
        Node(
            run.cfg,
            i,
            check_node_value(run.cfg, float(run.values[i])),  # protocol units, as `nlagg node` passes
            transport,
            run_id=run.run_id,
            prefix=run.prefix,
            edges=edges,
            parts=parts,
            corrupt=i in run.corrupt,
            neighbour_timeout=run.timeout,
            own_transport=False,
            identities=run.public_keys,
            identity=run.identities[i] if run.identities else None,
        )
        for i in range(run.cfg.n)
    ]
    async with transport:
        undecodable: list[str] = []
        results = await host_nodes(
            nodes, transport, run.prefix, run.run_id, on_reject=lambda topic, _exc: undecodable.append(topic)
        )
    scale = scale_for(run.cfg)
    out: list[NodeReport] = [
        {
            "node": r.node,
            "output": [scale.user_float(v) for v in r.output],
            "seconds": r.seconds,
            "rejected": r.rejected,
            "iterations": r.iterations,
        }
        for r in results
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
    departures: dict[int, int] | None = None,
    ca_file: Path | None = None,
    on_progress: Callable[[Snapshot], None] | None = None,
    auth: bool = False,
) -> TestbedSummary:
    """Run one testbed and return its summary (see the issue's ``--json`` fields).

    ``in_process=None`` picks the layout: one process per node, except on the embedded
    amqtt broker, where every node process would add its own delivery of every
    neighbour's x and the pure-Python broker becomes the bottleneck (48 rounds/s against
    180 in-process, n = 15): there the nodes share one connection.

    ``eavesdropper_nice`` lowers the eavesdropper process's CPU priority by that much (0: as
    the launcher). It still stores every message (the run fails otherwise); it only yields the
    CPU to the nodes while they compute and catches up in their idle time.

    ``departures`` ``{node: T}``: that node process is killed (SIGKILL, no clean leave) once its
    neighbours hold its x^(T-1) (:mod:`nlagg_node.departure`); the survivors' outputs are checked
    against the aggregate of their own connected component.

    ``ca_file`` is the CA that verifies an ``mqtts://`` ``broker_url`` (TLS for the launcher, the
    eavesdropper and every node).

    ``on_progress`` receives a :class:`~nlagg_node.lab.progress.Snapshot` a few times a second
    (the launcher then also subscribes to node 0's x and the statuses). An eavesdropper that dies
    during the run stops it at once (:class:`TestbedError`). ``auth``: see :func:`_publish_config`.
    """
    cfg = cfg.resolved().model_copy(update={"trials": 1})
    run_id = check_run_id(run_id or new_run_id())
    check_neighbour_timeout(neighbour_timeout)  # before anything starts (each node checks it too)
    corrupt = set(corrupt or set())
    bad = sorted(i for i in corrupt if not 0 <= i < cfg.n)
    if bad:
        raise ConfigError("corrupt", bad, f"node ids must lie in 0..{cfg.n - 1}")
    if eavesdropper_nice < 0:
        raise ConfigError("eavesdropper_nice", eavesdropper_nice, "must be 0 or more (a lower priority)")
    say = on_event or (lambda _msg: None)
    values, edges = _checked_values(cfg)
    departures = dict(departures or {})
    in_process = _checked_departures(cfg, edges, departures, in_process)
    t = topics(prefix, run_id)
    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        workdir = _workdir(stack, out_dir)
        db_path = workdir / "transcript.sqlite"
        if db_path.exists():
            raise NlaggError(f"{db_path} exists; choose another --out directory")
        url, kind = await _broker(stack, broker_url, broker_kind, _tls(ca_file), run_id)
        say(f"broker {kind} at {url}; run {run_id}")
        if in_process is None:
            in_process = kind == "amqtt"
            if in_process:
                say("embedded broker: hosting the nodes in one process (--processes to override)")
        launcher = await stack.enter_async_context(
            MqttTransport(url, client_id=f"nlagg-{run_id}-launcher", tls=_tls(ca_file))
        )
        ids = await _publish_config(launcher, t.config, build_config_msg(cfg, run_id, edges), auth)
        eaves = _Eavesdropper(say, workdir / "eavesdropper.log", external=broker_url is not None)
        stack.push_async_callback(eaves.stop)
        await eaves.start(url, run_id, prefix, db_path, eavesdropper_nice, ca_file)
        say(f"starting {cfg.n} nodes ({'in-process' if in_process else 'one process each'})")
        t_nodes = time.perf_counter()
        nodes = _Nodes(cfg, values, url, run_id, prefix, corrupt, neighbour_timeout, departures, ca_file, ids)
        if on_progress is not None:
            cap = Schedule.of(plan_phases(cfg)).t_total
            watch = RunProgress(prefix, run_id, cfg.n, cap, lambda: len(eaves.exposures), on_progress)
            follower = asyncio.create_task(watch.follow(launcher))
            stack.callback(follower.cancel)
        run_nodes = _run_in_process(nodes) if in_process else _run_processes(nodes, workdir)
        results = await eaves.guard(asyncio.ensure_future(run_nodes))
        node_wall = time.perf_counter() - t_nodes
        finished = await eaves.wait_complete(30.0)
        ran, departed, captured = _outcome(nodes, edges, results, node_wall, eaves, db_path, finished)
        summary: TestbedSummary = {
            **ran,
            **departed,
            **captured,
            "broker": kind,
            "broker_url": url,
            "in_process": in_process,
            "eavesdropper_nice": eavesdropper_nice,
            "wall_seconds": time.perf_counter() - started,
            "transcript": str(db_path) if out_dir is not None else None,
        }
        if out_dir is not None:
            write_outputs(out_dir, cfg, summary)
    return summary


async def _publish_config(
    launcher: MqttTransport, topic: str, public: ConfigMsg, auth: bool
) -> tuple[Identity, ...]:
    """Publish the run's retained configuration ``public``. With ``auth`` every node gets an Ed25519
    identity first, as a deployed plan's nodes have (:mod:`nlagg_node.protocol.identity`): the
    configuration carries their public keys, and the identities are returned."""
    ids = tuple(new_identity() for _ in range(public.n)) if auth else ()
    if ids:
        public = public.model_copy(update={"identities": [identity.public for identity in ids]})
    await launcher.publish(topic, encode(public), qos=1, retain=True)
    return ids


def _checked_values(cfg: RunConfig) -> tuple[FloatArray, IntArray]:
    """The run's private values (user units, inside the declared range) and its edges; a value the
    start would not protect is refused before any broker or node starts (each node checks too)."""
    from ..sim.values import run_values

    values = run_values(cfg, 1)[0]
    for v in values:
        check_start(cfg, float(v))
    return values, run_edges(cfg)


def _checked_departures(
    cfg: RunConfig, edges: IntArray, departures: dict[int, int], in_process: bool | None
) -> bool | None:
    """The layout a run with ``departures`` takes (they kill node processes: one process per node),
    or a :class:`ConfigError` naming what cannot be."""
    t_total = Schedule.of(plan_phases(cfg)).t_total
    check_departures(departures, cfg.n, t_total, cfg.op, cfg.early_stop, cfg.may_depart)
    comps = components(cfg.n, edges, departures)
    if cfg.op == "topk" and min(len(c) for c in comps) < cfg.k:
        small = min(comps, key=len)
        raise ConfigError(
            "depart", departures, f"top-K with k={cfg.k} leaves component {small} too few nodes"
        )
    if departures and in_process:
        raise ConfigError(
            "depart", departures, "kills node processes: run one process per node (--processes)"
        )
    return False if departures else in_process


async def _broker(
    stack: AsyncExitStack, url: str | None, kind: str, tls: TlsSettings | None, run_id: str
) -> tuple[str, str]:
    """``(url, kind)`` of the run's broker: a private one started on ``stack`` when ``url`` is None,
    else the given one once it answered as an MQTT broker (not MQTT, or nothing there: say so now)."""
    if url is None:
        handle = await stack.enter_async_context(start_broker(kind))  # type: ignore[arg-type]
        return handle.url, str(handle.kind)
    await probe_broker(url, tls, run_id)
    return url, "external"


def _workdir(stack: AsyncExitStack, out_dir: Path | None) -> Path:
    """Where the run's files go: ``out_dir`` (emptied again if the run is interrupted), or a
    temporary folder owned by this process (removed at exit, or by the next start after a kill)."""
    if out_dir is None:
        return stack.enter_context(owned_tempdir("testbed"))
    stack.push_async_exit(_ForgetInterrupted(out_dir))
    make_output_dir(out_dir, "out")
    return out_dir


def _outcome(
    nodes: _Nodes,
    edges: IntArray,
    results: list[NodeReport],
    node_wall: float,
    eaves: _Eavesdropper,
    db_path: Path,
    finished: dict[str, Any],
) -> tuple[RunOutcome, Departures, CaptureOutcome]:
    """The summary's fields about the run itself: outputs against the truth of each surviving
    component, the departures that happened, and what the eavesdropper captured and learned."""
    cfg, values, corrupt = nodes.cfg, nodes.values, nodes.corrupt
    with Transcript(db_path) as transcript:
        scale = scale_for(cfg)
        captured = {
            i: None if st.output is None else [scale.user_float(v) for v in st.output]
            for i, st in transcript.statuses().items()
            if st.state == "done"
        }
        stored = transcript.count()
    outputs = {r["node"]: [float(v) for v in r["output"]] for r in results}
    departures = {j: at for j, at in nodes.departures.items() if j not in outputs}  # those that happened
    comps = components(cfg.n, edges, departures)
    truth_lo, truth_hi = true_aggregate(cfg, values[None][:, max(comps, key=len)])  # the largest part
    node_truth = survivor_truth(cfg, values[None], [comps])
    node_truth = (node_truth[0][0], node_truth[1][0])
    return (
        run_outcome(cfg, nodes.run_id, values, truth_lo, truth_hi, results, corrupt, node_wall, node_truth),
        departure_outcome(cfg, departures, edges, node_truth, outputs),
        capture_outcome(cfg, values, corrupt, eaves.exposures, captured, stored, finished),
    )
