"""``nlagg node``, ``nlagg eavesdrop``: one client of a real MQTT broker, and its TLS options.

``nlagg testbed`` (a whole network on this machine) is in :mod:`nlagg_node.cli.testbed`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..defaults import DEFAULT_BROKER
from ..errors import ConfigError
from ..inputs import read_input_text
from ._app import TRANSCRIPT_HELP, BrokerOpt, VerboseOpt, app, setup_logging

if TYPE_CHECKING:
    from ..lab.summary import NodeReport
    from ..runtime.tls import TlsSettings


def _parse_value(text: str, field: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(field, text.strip()[:60], "not a number") from None
    if not math.isfinite(value):
        raise ConfigError(field, text.strip(), "must be a finite number")
    return value


def _read_value(value: float | None, value_file: Path | None, value_cmd: str | None) -> float:
    given = [x for x in (value, value_file, value_cmd) if x is not None]
    if len(given) != 1:
        raise ConfigError(
            "value", f"{len(given)} sources", "give exactly one of --value, --value-file, --value-cmd"
        )
    if value is not None:
        return _parse_value(repr(value), "value")
    if value_file is not None:
        lines = [ln for ln in read_input_text(value_file, "value_file").splitlines() if ln.strip()]
        if not lines:
            raise ConfigError("value_file", str(value_file), "file is empty")
        try:
            return _parse_value(lines[0], "value_file")
        except ConfigError as exc:
            first = lines[0].strip()[:40]
            raise ConfigError("value_file", str(value_file), f"first line {first!r}: {exc.reason}") from None
    assert value_cmd is not None
    proc = subprocess.run(value_cmd, shell=True, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise ConfigError(
            "value_cmd", value_cmd, f"exited with {proc.returncode}: {proc.stderr.strip()[:200]}"
        )
    return _parse_value(proc.stdout, "value_cmd")


def _read_seed(seed_file: Path) -> int:
    lines = read_input_text(seed_file, "seed_file").splitlines()
    text = lines[0].strip() if lines else ""
    if not text.isdigit() or len(text) > 20:
        raise ConfigError("seed_file", str(seed_file), "the first line must be a non-negative integer")
    return int(text)


def _read_password(password_file: Path | None) -> str | None:
    if password_file is None:
        return None
    lines = read_input_text(password_file, "password_file").splitlines()
    return lines[0].strip() if lines else ""


CaFile = Annotated[
    Path | None, typer.Option(help="mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)")
]
CertFile = Annotated[Path | None, typer.Option(help="mqtts://: client certificate, when the broker asks")]
KeyFile = Annotated[Path | None, typer.Option(help="mqtts://: the client certificate's private key")]


def tls_settings(
    broker: str, ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> TlsSettings | None:
    """The :class:`TlsSettings` of ``--ca-file/--cert-file/--key-file`` (None for a plain mqtt:// broker)."""
    from ..runtime.tls import TlsSettings, broker_endpoint

    if not broker_endpoint(broker).tls:
        for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
            if path is not None:
                raise ConfigError(name, str(path), f"TLS files need an mqtts:// broker, not {broker}")
        return None
    return TlsSettings(ca_file, cert_file, key_file)


def _network_table(config: Path) -> dict[str, Any]:
    """The ``[network]`` table (prefix, run_id) of a run.toml, if any."""
    import tomllib

    if config.suffix.lower() != ".toml" or not config.is_file():
        return {}
    try:
        doc = tomllib.loads(config.read_text())
    except tomllib.TOMLDecodeError:
        return {}
    net = doc.get("network", {})
    return net if isinstance(net, dict) else {}


@app.command()
def node(
    id: Annotated[int, typer.Option("--id", help="this node's id, 0..n-1")],
    config: Annotated[
        Path, typer.Option(help="run config (TOML with [run] and optional [network], or JSON)")
    ],
    broker: BrokerOpt = DEFAULT_BROKER,
    value: Annotated[float | None, typer.Option(help="the private value s_i")] = None,
    value_file: Annotated[Path | None, typer.Option(help="file whose first line is s_i")] = None,
    value_cmd: Annotated[
        str | None, typer.Option(help="shell command printing s_i (e.g. a sensor read)")
    ] = None,
    value_range: Annotated[
        tuple[float, float] | None,
        typer.Option(help="public range LO HI of the values (overrides the config's value_range)"),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option(help="run id (default: [network].run_id of the config)")
    ] = None,
    prefix: Annotated[
        str | None, typer.Option(help="topic prefix (default: [network].prefix or nlagg)")
    ] = None,
    username: Annotated[str | None, typer.Option(help="broker user name")] = None,
    password_file: Annotated[Path | None, typer.Option(help="file holding the broker password")] = None,
    corrupt: Annotated[
        bool, typer.Option(help="forward s_i and the duals to adv/{i}/state (passive adversary)")
    ] = False,
    seed: Annotated[
        int | None,
        typer.Option(help="seed of this node's generator rng_for(seed,'node',0,id); OS entropy if unset"),
    ] = None,
    seed_file: Annotated[
        Path | None, typer.Option(help="file whose first line is the seed (keeps it out of ps)")
    ] = None,
    neighbour_timeout: Annotated[
        float, typer.Option(help="seconds to wait at a barrier before failing")
    ] = 60.0,
    startup_timeout: Annotated[
        float, typer.Option(help="seconds to wait for the neighbours to come online")
    ] = 120.0,
    departure_timeout: Annotated[
        float | None,
        typer.Option(
            help="seconds a neighbour's last will must stay before it counts as departed for good "
            "(README 'Nodes that leave') [default: 3/4 of --neighbour-timeout]"
        ),
    ] = None,
    leave_after: Annotated[
        int | None,
        typer.Option(help="publish x^(0)..x^(T-1), then leave the run (for tests)", min=1),
    ] = None,
    leave_by: Annotated[
        str,
        typer.Option(
            help="how --leave-after leaves: status (a clean 'leaving') or kill (SIGKILL itself once every"
            " neighbour holds its last x: the last will)"
        ),
    ] = "status",
    state_dir: Annotated[
        Path | None,
        typer.Option(help="keep a checkpoint here (before every publish); a restart resumes from it"),
    ] = None,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as one JSON object")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run one node: connect, announce, exchange z^(0), iterate with the neighbour barrier, publish done."""
    import asyncio
    import os
    import signal

    from ..config import load_config
    from ..runtime.checkpoint import CheckpointStore
    from ..runtime.mqtt import MqttTransport
    from ..runtime.node import Node, node_will
    from ..runtime.wire import check_prefix, check_run_id
    from ..scale import check_node_value, leak_warning, scale_for

    setup_logging(verbose)
    if leave_by not in ("status", "kill"):
        raise ConfigError("leave_by", leave_by, "use status or kill")
    logging.getLogger("nlagg.progress").setLevel(logging.INFO)  # a line every few seconds (stderr)
    cfg = load_config(config, value_range=value_range)
    net = _network_table(config)
    rid = check_run_id(run_id or str(net.get("run_id", "")) or "default")
    pfx = check_prefix(prefix or str(net.get("prefix", "nlagg")))
    if not 0 <= id < cfg.n:
        raise ConfigError("id", id, f"must lie in 0..{cfg.n - 1}")
    raw = _read_value(value, value_file, value_cmd)
    # Before anything is published: the value lies in the declared range and the start protects it.
    s = check_node_value(cfg, raw)
    scale = scale_for(cfg)
    warning = leak_warning(cfg)
    if warning is not None:
        print(f"nlagg: {warning}", file=sys.stderr)
    password = _read_password(password_file)
    tls = tls_settings(broker, ca_file, cert_file, key_file)
    if seed_file is not None:
        if seed is not None:
            raise ConfigError("seed_file", str(seed_file), "give --seed or --seed-file, not both")
        seed = _read_seed(seed_file)

    async def main() -> NodeReport:
        transport = MqttTransport(
            broker,
            client_id=f"nlagg-{rid}-node-{id}",
            will=node_will(pfx, rid, id),
            username=username,
            password=password,
            tls=tls,
        )
        async with Node(
            cfg,
            id,
            s,
            transport,
            run_id=rid,
            prefix=pfx,
            corrupt=corrupt,
            seed=seed,
            neighbour_timeout=neighbour_timeout,
            startup_timeout=startup_timeout,
            checkpoint=None if state_dir is None else CheckpointStore(state_dir, rid, id),
            departure_timeout=departure_timeout,
            leave_after=leave_after,
            leave_quietly=leave_by == "kill",
        ) as nd:
            if nd.resumed is not None:
                print(
                    f"node {id}: resuming from the checkpoint in {state_dir} "
                    f"(stage {nd.resumed.stage}, t = {nd.resumed.t})",
                    flush=True,
                )
            with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, nd.leave)
            r = await nd.run()
            if r.left_at is not None and leave_by == "kill":
                print(json.dumps({"node": r.node, "left_at": r.left_at}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # inside the connection: the broker sends the will
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

    result = asyncio.run(main())
    if as_json:
        print(json.dumps(result))
    elif "left_at" in result:
        print(f"node {id}: left the run after publishing x^(0)..x^({result['left_at'] - 1})")
    else:
        out = result["output"]
        print(
            f"node {id}: done, output {out[0] if len(out) == 1 else out} after {result['iterations']} "
            f"iterations ({result['rounds_per_second']:.0f} rounds/s, {result['rejected']} messages rejected)"
        )
        for j, t in result.get("departed", {}).items():
            print(f"node {id}: neighbour {j} departed at t={t} (its last x was x^({t - 1}))")


@app.command()
def eavesdrop(
    run_id: Annotated[str, typer.Option(help="the run to capture")],
    broker: Annotated[
        list[str] | None,
        typer.Option(
            help="broker URL, mqtt://host[:port]; repeat it for every site broker of a run with sites"
            f" (one transcript, each message once) [default: {DEFAULT_BROKER}]"
        ),
    ] = None,
    transcript: Annotated[
        Path,
        typer.Option(help=TRANSCRIPT_HELP + " to write (created, or continued when it holds this run)"),
    ] = Path("transcript.sqlite"),
    prefix: Annotated[str, typer.Option(help="topic prefix")] = "nlagg",
    username: Annotated[str | None, typer.Option(help="broker user name")] = None,
    password_file: Annotated[Path | None, typer.Option(help="file holding the broker password")] = None,
    live: Annotated[bool | None, typer.Option(help="live view (default: when stdout is a terminal)")] = None,
    timeout: Annotated[float | None, typer.Option(help="stop after this many seconds")] = None,
    events: Annotated[bool, typer.Option(help="print JSON-line events (for a supervising process)")] = False,
    config: Annotated[
        Path | None, typer.Option(help="the run's config file, if the retained P/R/config is not published")
    ] = None,
    broker_cluster: Annotated[
        bool,
        typer.Option(
            help="the broker is a cluster (RabbitMQ, EMQX, VerneMQ) whose members may forward messages"
            " out of causal order: an x that overtook the x's it was computed from waits for them (5 s)"
        ),
    ] = False,
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    dashboard: Annotated[
        str | None,
        typer.Option(
            help="serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished capture until Ctrl-C"
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Capture every message of a run into SQLite and show per node what the transcript reveals."""
    from adversary.capture import run_eavesdropper

    from ..lifetime import run_stoppable

    setup_logging(verbose)
    password = _read_password(password_file)
    brokers = broker or [DEFAULT_BROKER]
    tls = tls_settings(brokers[0], ca_file, cert_file, key_file)
    for url in brokers[1:]:  # the TLS files must suit every broker
        tls_settings(url, ca_file, cert_file, key_file)
    show = sys.stdout.isatty() if live is None else live
    public = None
    if config is not None:
        from ..config import load_config
        from ..runtime.public import build_config_msg, run_edges

        cfg = load_config(config)
        public = build_config_msg(cfg, run_id, run_edges(cfg))
    capture = run_eavesdropper(
        brokers,
        run_id,
        transcript,
        prefix=prefix,
        username=username,
        password=password,
        live=show,
        stop_after=timeout,
        events=events,
        config=public,
        tls=tls,
        broker_cluster=broker_cluster,
    )
    if dashboard is None:
        run_stoppable(capture)
        return
    from adversary.reporting.dashboard import parse_listen, serve_beside

    try:
        parse_listen(dashboard)  # a bad address fails before anything starts
    except BaseException:
        capture.close()
        raise
    run_stoppable(
        serve_beside(transcript, dashboard, capture, lambda line: print(line, file=sys.stderr, flush=True))
    )
