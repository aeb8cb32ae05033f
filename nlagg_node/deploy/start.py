"""Start one node from its files: the run config (run.toml), its value source and its credentials.

``nlagg node`` is :func:`start_node` on the options of its command line; ``nlagg deploy node`` is
:func:`start_node` on the options of a node file (:func:`node_file_start`), run from the file's base
folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, StoppedBySignal, StopRequested
from ..inputs import read_input_text
from ..lifetime import run_stoppable
from ..options import NodeOptions
from .identities import load_identity, run_identities, run_launcher

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..lab.summary import NodeReport
    from ..protocol.identity import Identity
    from ..runtime.node import Node
    from ..runtime.tls import TlsSettings
    from ..valuemap import ValueScale

__all__ = [
    "NodeStart",
    "node_file_start",
    "prepare_node",
    "read_password",
    "result_lines",
    "run_instance",
    "run_node",
    "start_node",
    "tls_settings",
]


def tls_settings(
    broker: str, ca_file: str | Path | None, cert_file: str | Path | None, key_file: str | Path | None
) -> TlsSettings | None:
    """The :class:`TlsSettings` of ``--ca-file/--cert-file/--key-file`` (None for a plain mqtt:// broker)."""
    from ..runtime.tls import TlsSettings, broker_endpoint

    files = {"ca_file": ca_file, "cert_file": cert_file, "key_file": key_file}
    if not broker_endpoint(broker).tls:
        for name, path in files.items():
            if path is not None:
                raise ConfigError(name, str(path), f"TLS files need an mqtts:// broker, not {broker}")
        return None
    ca, cert, key = (None if p is None else Path(p) for p in files.values())
    return TlsSettings(ca, cert, key)


def read_password(password_file: str | Path | None) -> str | None:
    """The first line of a password file (None without one)."""
    if password_file is None:
        return None
    lines = read_input_text(Path(password_file), "password_file").splitlines()
    return lines[0].strip() if lines else ""


def _read_seed(seed_file: Path) -> int:
    lines = read_input_text(seed_file, "seed_file").splitlines()
    text = lines[0].strip() if lines else ""
    if not text.isdigit() or len(text) > 20:
        raise ConfigError("seed_file", str(seed_file), "the first line must be a non-negative integer")
    return int(text)


def _network_table(config: Path) -> dict[str, Any]:
    """The ``[network]`` table (prefix, run_id) of a run.toml, if any."""
    if config.suffix.lower() != ".toml" or not config.is_file():
        return {}
    try:
        doc = tomllib.loads(config.read_text())
    except tomllib.TOMLDecodeError:
        return {}
    net = doc.get("network", {})
    return net if isinstance(net, dict) else {}


@dataclass(frozen=True)
class NodeStart:
    """Everything a node needs, read and checked before it connects (see :func:`prepare_node`)."""

    opts: NodeOptions
    cfg: RunConfig
    run_id: str
    prefix: str
    value: float  # s_i on the protocol's scale
    scale: ValueScale
    password: str | None
    tls: TlsSettings | None
    seed: int | None
    identities: list[str] | None = None  # the run's public identities: its messages are signed
    identity: Identity | None = None  # this node's signing key
    launcher: str | None = None  # the launcher's key: the run has a signed instance per start


def prepare_node(opts: NodeOptions) -> NodeStart:
    """Read the config, the value source, the password and the seed; refuse what is wrong (exit 2)."""
    from ..config import load_config
    from ..runtime.wire import check_prefix, check_run_id
    from ..valuechecks import check_node_value, leak_warning
    from ..valuemap import scale_for
    from ..valuesource import read_value

    if opts.leave_by not in ("status", "kill"):
        raise ConfigError("leave_by", opts.leave_by, "use status or kill")
    config = Path(opts.config)
    cfg = load_config(config, value_range=opts.value_range)
    net = _network_table(config)
    rid = check_run_id(opts.run_id or str(net.get("run_id", "")) or "default")
    pfx = check_prefix(opts.prefix or str(net.get("prefix", "nlagg")))
    if not 0 <= opts.id < cfg.n:
        raise ConfigError("id", opts.id, f"must lie in 0..{cfg.n - 1}")
    source = opts.value_source()
    if source is None:
        raise ConfigError("value", "0 sources", "give exactly one of --value, --value-file, --value-cmd")
    # Before anything is published: the value lies in the declared range and the start protects it.
    s = check_node_value(cfg, read_value(source))
    warning = leak_warning(cfg)
    if warning is not None:
        print(f"nlagg: {warning}", file=sys.stderr)
    seed = opts.seed
    if opts.seed_file is not None:
        if seed is not None:
            raise ConfigError("seed_file", opts.seed_file, "give --seed or --seed-file, not both")
        seed = _read_seed(Path(opts.seed_file))
    identities = run_identities(config)
    identity = None if opts.signing_key is None else load_identity(Path(opts.signing_key))
    if identities is not None and identity is None:
        raise ConfigError("signing_key", None, f"{config} lists the nodes' identities: give this node's key")
    return NodeStart(
        opts=opts,
        cfg=cfg,
        run_id=rid,
        prefix=pfx,
        value=s,
        scale=scale_for(cfg),
        password=read_password(opts.password_file),
        tls=tls_settings(opts.broker, opts.ca_file, opts.cert_file, opts.key_file),
        seed=seed,
        identities=identities,
        identity=identity if identities is not None else None,
        launcher=run_launcher(config) if identities is not None else None,
    )


async def run_instance(start: NodeStart) -> str | None:
    """This start's run instance (:mod:`nlagg_node.protocol.instance`), None in a run without one.

    A node resuming an unfinished checkpoint resumes the start the checkpoint is of (its session on
    the broker holds what its neighbours sent meanwhile); otherwise the node reads
    the broker's retained configuration, before it connects for the run (its last will binds the
    instance), with a clean session of its own user: what the broker kept for it is of an earlier
    start. It waits ``startup_timeout`` seconds for the launcher's configuration.
    """
    from ..errors import NlaggError
    from ..protocol.instance import instance_error
    from ..runtime.checkpoint import CheckpointStore
    from ..runtime.mqtt import MqttTransport
    from ..runtime.public import build_config_msg, config_mismatch, run_edges
    from ..runtime.wire import ConfigMsg, WireError, decode, topics

    o = start.opts
    if start.launcher is None:
        return None
    if o.state_dir is not None:
        saved = CheckpointStore(Path(o.state_dir), start.run_id, o.id).saved_instance(unfinished=True)
        if saved is not None:
            return saved
    topic = topics(start.prefix, start.run_id).config
    transport = MqttTransport(
        o.broker,
        client_id=f"nlagg-{start.run_id}-node-{o.id}",
        username=o.username,
        password=start.password,
        tls=start.tls,
        clean_session=True,
    )
    mine = build_config_msg(
        start.cfg, start.run_id, run_edges(start.cfg), start.identities, launcher=start.launcher
    )
    try:
        async with asyncio.timeout(o.startup_timeout), transport:
            await transport.subscribe(topic)
            async for raw in transport.messages():
                _, msg = decode(raw.topic, raw.payload, start.prefix, start.run_id)
                assert isinstance(msg, ConfigMsg)
                why = instance_error(topic, raw.payload, start.launcher, msg.instance)
                mismatch = config_mismatch(mine, msg)
                if mismatch is not None:
                    raise mismatch
                if why is not None:
                    raise NlaggError(f"node {o.id}: {why}")
                assert msg.instance is not None
                return msg.instance
    except TimeoutError:
        raise NlaggError(
            f"node {o.id}: no run configuration retained on {topic} within {o.startup_timeout:g} s "
            "(start the run with nlagg deploy publish-config first)"
        ) from None
    except WireError as exc:
        raise NlaggError(f"node {o.id}: the retained configuration on {topic} is refused ({exc})") from None
    raise NlaggError(f"node {o.id}: the broker closed the connection before the run configuration came")


def _node(start: NodeStart, instance: str | None) -> Node:
    from ..runtime.checkpoint import CheckpointStore
    from ..runtime.mqtt import MqttTransport
    from ..runtime.node import Node, node_will

    o = start.opts
    transport = MqttTransport(
        o.broker,
        client_id=f"nlagg-{start.run_id}-node-{o.id}",
        will=node_will(start.prefix, start.run_id, o.id, start.identity, instance=instance),
        username=o.username,
        password=start.password,
        tls=start.tls,
    )
    return Node(
        start.cfg,
        o.id,
        start.value,
        transport,
        run_id=start.run_id,
        prefix=start.prefix,
        corrupt=o.corrupt,
        seed=start.seed,
        neighbour_timeout=o.neighbour_timeout,
        startup_timeout=o.startup_timeout,
        checkpoint=None if o.state_dir is None else CheckpointStore(Path(o.state_dir), start.run_id, o.id),
        departure_timeout=o.departure_timeout,
        leave_after=o.leave_after,
        leave_quietly=o.leave_by == "kill",
        identities=start.identities,
        identity=start.identity,
        instance=instance,
    )


async def run_node(start: NodeStart) -> NodeReport:
    """Connect, run the protocol to its end (or leave, as asked) and report in the user's units."""
    o = start.opts
    async with _node(start, await run_instance(start)) as nd:
        if nd.resumed is not None:
            print(
                f"node {o.id}: resuming from the checkpoint in {o.state_dir} "
                f"(stage {nd.resumed.stage}, t = {nd.resumed.t})",
                flush=True,
            )
        stop = asyncio.Event()  # SIGTERM: leave before the next x, or stop before the first
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            r = await nd.run(stop)
        except StopRequested:
            raise StoppedBySignal(signal.SIGTERM) from None
        if r.left_at is not None and o.leave_by == "kill":
            print(json.dumps({"node": r.node, "left_at": r.left_at}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # inside the connection: the broker sends the will
    scale = start.scale
    report: NodeReport = {
        "node": r.node,
        "output": [scale.user_float(v) for v in r.output],
        "finals": [scale.user_float(v) for v in r.finals],
        "iterations": r.iterations,
        "seconds": r.seconds,
        "rounds_per_second": r.rounds_per_second,
        "rejected": r.rejected,
        "duplicates": r.duplicates,
    }
    if r.departed:
        report["departed"] = {str(j): t for j, t in sorted(r.departed.items())}
    if r.left_at is not None:
        report["left_at"] = r.left_at
    return report


def start_node(opts: NodeOptions) -> NodeReport:
    """Prepare and run one node (blocking): what ``nlagg node`` does."""
    return run_stoppable(run_node(prepare_node(opts)))  # Ctrl-C: one line, exit 130; SIGTERM leaves


def node_file_start(
    node_file: Path, *, broker: str | None = None, state_dir: str | None = None
) -> tuple[NodeOptions, Path]:
    """The options a node file stands for, and the folder its paths are relative to (its base_dir).

    ``broker`` and ``state_dir`` override the file's. The file's config, password and TLS files must
    exist (refused otherwise, naming the file).
    """
    from .nodefile import node_file_options, resolve_node

    node, base = resolve_node(node_file)
    return node_file_options(node, broker=broker, state_dir=state_dir), base


def result_lines(node_id: int, result: NodeReport) -> list[str]:
    """What ``nlagg node`` prints for a result (without ``--json``)."""
    if "left_at" in result:
        return [f"node {node_id}: left the run after publishing x^(0)..x^({result['left_at'] - 1})"]
    out = result["output"]
    lines = [
        f"node {node_id}: done, output {out[0] if len(out) == 1 else out} after {result.get('iterations')} "
        f"iterations ({result.get('rounds_per_second', 0.0):.0f} rounds/s, {result['rejected']} messages"
        " rejected)"
    ]
    for j, t in result.get("departed", {}).items():
        lines.append(f"node {node_id}: neighbour {j} departed at t={t} (its last x was x^({t - 1}))")
    return lines
