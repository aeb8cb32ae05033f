"""``nlagg deploy``: generate a deployment plan, a docker-compose file, and start one node from its file."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..defaults import DEFAULT_BROKER
from ._app import CorruptOpt, EarlyStopOpt, ForceOpt, StopWindowOpt, ToleranceOpt, app
from .net import CaFile, CertFile, KeyFile, tls_settings

if TYPE_CHECKING:
    from ..deploy import PlanSpec

deploy_app = typer.Typer(
    name="deploy",
    help="Deployment: broker credentials and ACLs, per-node files, docker-compose, Raspberry Pi nodes.",
    no_args_is_help=True,
)
app.add_typer(deploy_app, name="deploy")


# The run's options, shared by `plan` and `compose` (which writes a plan too).
RunIdOpt = Annotated[str, typer.Option(help="run id R (topics P/R/...): 1-64 of [A-Za-z0-9_-]")]
NOpt = Annotated[int, typer.Option(help="number of nodes")]
GraphOpt = Annotated[str, typer.Option(help="rgg, ring, complete, grid, erdos-renyi, star or file")]
GraphFileOpt = Annotated[Path | None, typer.Option(help="edge list for --graph file")]
RadiusOpt = Annotated[float | None, typer.Option(help="rgg connection radius (default: connectivity)")]
OpOpt = Annotated[str, typer.Option(help="max, min, topk, median, quantile, trimmed-mean or average")]
SeedOpt = Annotated[
    int | None, typer.Option(help="run seed for graph and values [default: drawn from OS entropy]")
]
ReplayOpt = Annotated[
    bool, typer.Option(help="give nodes the run seed so z^(0) replays the simulator (lab only)")
]
PrefixOpt = Annotated[str, typer.Option(help="topic prefix P")]
ValueOpt = Annotated[float | None, typer.Option(help="the same constant value on every node")]
ValueFileOpt = Annotated[str | None, typer.Option(help="every node reads its value from this file")]
ValueCmdOpt = Annotated[str | None, typer.Option(help="every node runs this shell command for its value")]
TMaxOpt = Annotated[int | None, typer.Option(help="iterations per phase (operator default if unset)")]
COpt = Annotated[float | None, typer.Option(help="PDMM step parameter c")]
MuZOpt = Annotated[float | None, typer.Option(help="mean offset of z^(0)")]
KOpt = Annotated[int | None, typer.Option(help="K for topk and trimmed-mean")]
QuantileOpt = Annotated[float | None, typer.Option(help="quantile level p in (0, 1)")]
ValuesOpt = Annotated[
    str | None, typer.Option(help="drawn values: normal, uniform, uniform-range or bimodal")
]
PlanMayDepartOpt = Annotated[
    bool | None,
    typer.Option(
        "--may-depart/--no-may-depart",
        help="devices may leave for good: the early stop waits n - 1 hops and survives departures; off: the"
        " graph's diameter, and a departure fails the run (docs/protocol.md) [default: on]",
    ),
]
ValueRangeOpt = Annotated[
    tuple[float, float] | None,
    typer.Option(help="public range LO HI of the values (default: what the --value-cmd sensor declares)"),
]


def _sensor_range(value_cmd: str | None) -> tuple[float, float] | None:
    """The range a sensor script declares (``# nlagg-value-range: LO HI``), for --value-cmd."""
    if value_cmd is None:
        return None
    from ..deploy.sensors import range_for_command

    return range_for_command(value_cmd)


def _plan_spec(
    *,
    run_id: str,
    n: int,
    graph: str,
    graph_file: Path | None,
    radius: float | None,
    op: str,
    corrupt: str | None,
    seed: int | None,
    replay: bool,
    prefix: str,
    value: float | None,
    value_file: str | None,
    value_cmd: str | None,
    t_max: int | None,
    c: float | None,
    mu_z: float | None,
    k: int | None,
    quantile: float | None,
    values: str | None,
    broker: str,
    early_stop: bool | None = None,
    stop_window: int | None = None,
    tolerance: float | None = None,
    value_range: tuple[float, float] | None = None,
    may_depart: bool | None = None,
    listen_host: str | None = None,
    listen_port: int = 1883,
    tls: tuple[str | None, str | None, str | None] = (None, None, None),
    make_tls: bool = False,
    require_certificate: bool = False,
    sites: int = 1,
    sites_file: Path | None = None,
    site_brokers: list[str] | None = None,
) -> PlanSpec:
    """The plan's spec from the shared command-line options (errors name the option)."""
    from ..config import load_config
    from ..deploy import PlanSpec, TlsFiles, ValueSource
    from ..errors import ConfigError

    cfg = load_config(
        None,
        op=op,
        n=n,
        graph="file" if graph_file is not None else graph,
        graph_file=graph_file,
        radius=radius,
        t_max=t_max,
        c=c,
        mu_z=mu_z,
        k=k,
        quantile=quantile,
        values=values,
        value_range=value_range if value_range is not None else _sensor_range(value_cmd),
        # Early stopping that survives departures unless told otherwise: devices in the field may
        # leave unannounced (docs/protocol.md).
        early_stop=True if early_stop is None else early_stop,
        may_depart=True if may_depart is None else may_depart,
        stop_window=stop_window,
        tolerance=tolerance,
    )
    given = [
        (name, v)
        for name, v in (("value", value), ("value_file", value_file), ("value_cmd", value_cmd))
        if v is not None
    ]
    if len(given) > 1:
        raise ConfigError(given[1][0], given[1][1], f"give at most one value source (also got {given[0][0]})")
    source = None
    if value is not None:
        source = ValueSource(source="constant", value=value)
    elif value_file is not None:
        source = ValueSource(source="file", path=value_file)
    elif value_cmd is not None:
        source = ValueSource(source="command", command=value_cmd)
    if any(tls) and not all(tls):
        raise ConfigError("tls", tls, "give --tls-cafile, --tls-certfile and --tls-keyfile together")
    site_of = None
    if sites_file is not None:
        from ..deploy.sites import read_sites_file

        if sites != 1:
            raise ConfigError("sites", sites, "give --sites or --sites-file, not both")
        site_of = tuple(read_sites_file(sites_file, cfg.n))
    return PlanSpec(
        run=cfg,
        run_id=run_id,
        prefix=prefix,
        corrupt=corrupt,
        seed=seed,
        replay=replay,
        broker_url=broker,
        listen_host=listen_host,
        listen_port=listen_port,
        value_source=source,
        tls=TlsFiles(*tls) if all(tls) else None,  # type: ignore[arg-type]
        make_tls=make_tls,
        require_certificate=require_certificate,
        sites=sites,
        site_of=site_of,
        site_brokers=tuple(site_brokers or ()),
    )


@deploy_app.command("plan")
def plan_cmd(
    out: Annotated[Path, typer.Option(help="directory to write the plan into")],
    run_id: RunIdOpt,
    n: NOpt = 15,
    graph: GraphOpt = "rgg",
    graph_file: GraphFileOpt = None,
    radius: RadiusOpt = None,
    op: OpOpt = "max",
    corrupt: CorruptOpt = None,
    seed: SeedOpt = None,
    replay: ReplayOpt = False,
    prefix: PrefixOpt = "nlagg",
    broker: Annotated[
        str | None,
        typer.Option(
            help="broker URL the nodes and the eavesdropper connect to (with --tls: mqtts://127.0.0.1:8883)"
            f" [default: {DEFAULT_BROKER}]"
        ),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(help="broker listener: PORT or HOST:PORT (PORT = every address; 1883, with --tls 8883)"),
    ] = None,
    tls: Annotated[
        bool, typer.Option(help="generate a private CA and the broker's certificate; a TLS-only listener")
    ] = False,
    require_certificate: Annotated[
        bool, typer.Option(help="with --tls: a client certificate per user, required by the broker")
    ] = False,
    value: ValueOpt = None,
    value_file: ValueFileOpt = None,
    value_cmd: ValueCmdOpt = None,
    t_max: TMaxOpt = None,
    c: COpt = None,
    mu_z: MuZOpt = None,
    k: KOpt = None,
    quantile: QuantileOpt = None,
    early_stop: EarlyStopOpt = None,
    may_depart: PlanMayDepartOpt = None,
    stop_window: StopWindowOpt = None,
    tolerance: ToleranceOpt = None,
    values: ValuesOpt = None,
    value_range: ValueRangeOpt = None,
    tls_cafile: Annotated[str | None, typer.Option(help="broker TLS: CA certificate (PEM)")] = None,
    tls_certfile: Annotated[str | None, typer.Option(help="broker TLS: server certificate (PEM)")] = None,
    tls_keyfile: Annotated[str | None, typer.Option(help="broker TLS: server key (PEM)")] = None,
    sites: Annotated[
        int,
        typer.Option(
            help="K site brokers: the graph split into K balanced parts with few cut edges, the brokers"
            " bridged along the cut (deploy/README.md, 'More than one broker')"
        ),
    ] = 1,
    sites_file: Annotated[
        Path | None, typer.Option(help="assign nodes to sites by hand: JSON [[ids of site 0], [site 1], ...]")
    ] = None,
    site_broker: Annotated[
        list[str] | None,
        typer.Option(
            help="URL of each site's broker, in site order (default: --broker's host, its port + site)"
        ),
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Write run.toml, graph.json, nodes/<i>.toml, secrets/, broker/ (conf, passwd, ACL) and commands.txt."""
    from ..deploy import build_plan, write_plan
    from ..errors import ConfigError

    if out.exists() and not out.is_dir():
        raise ConfigError("out", str(out), "exists and is not a directory")
    tls_parts = (tls_cafile, tls_certfile, tls_keyfile)
    if tls and any(tls_parts):
        raise ConfigError(
            "tls", True, "--tls generates the broker's files: leave out --tls-cafile and friends"
        )
    secure = tls or all(tls_parts)
    if broker is None:
        broker = "mqtts://127.0.0.1:8883" if secure else DEFAULT_BROKER
    if listen is None:
        listen = "8883" if secure else "1883"
    host, _, port_text = listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("listen", listen, "expected PORT or HOST:PORT") from None
    spec = _plan_spec(
        run_id=run_id,
        n=n,
        graph=graph,
        graph_file=graph_file,
        radius=radius,
        op=op,
        corrupt=corrupt,
        seed=seed,
        replay=replay,
        prefix=prefix,
        value=value,
        value_file=value_file,
        value_cmd=value_cmd,
        t_max=t_max,
        c=c,
        mu_z=mu_z,
        k=k,
        quantile=quantile,
        early_stop=early_stop,
        may_depart=may_depart,
        stop_window=stop_window,
        tolerance=tolerance,
        values=values,
        value_range=value_range,
        broker=broker,
        listen_host=host or None,
        listen_port=port,
        tls=tls_parts,
        make_tls=tls,
        require_certificate=require_certificate,
        sites=sites,
        sites_file=sites_file,
        site_brokers=site_broker,
    )
    plan = build_plan(spec)
    write_plan(plan, out, force=force)
    corrupted = ",".join(str(i) for i in plan.corrupted) or "none"
    print(
        f"plan for run {run_id}: n={plan.n}, {len(plan.edges)} edges, corrupted {corrupted}, written to {out}"
    )
    if plan.bridges:
        from ..deploy.sites import cut_edges

        sizes = [plan.site_of.count(s) for s in range(len(plan.site_urls))]
        cut = len(cut_edges(plan.edges, plan.site_of))
        print(f"{len(sizes)} sites of {sizes} nodes, {cut} cut edges, {len(plan.bridges)} bridges")
    print(f"start each part by hand with the lines of {out / 'commands.txt'}")


@deploy_app.command("compose")
def compose_cmd(
    out: Annotated[
        Path | None,
        typer.Option(
            help="write docker-compose.yml, .env and a fresh plan here (default: . ; with --plan: stdout)"
        ),
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(help="use this existing plan (nlagg deploy plan) instead of a fresh one")
    ] = None,
    plan_dir: Annotated[
        Path, typer.Option(help="where the fresh plan goes, relative to --out (gitignored by a .gitignore)")
    ] = Path("plan"),
    compose_dir: Annotated[
        Path | None, typer.Option(help="with --plan and no --out: where the printed file will live")
    ] = None,
    run_id: RunIdOpt = "testbed",
    n: NOpt = 6,
    graph: GraphOpt = "rgg",
    graph_file: GraphFileOpt = None,
    radius: RadiusOpt = None,
    op: OpOpt = "max",
    corrupt: CorruptOpt = None,
    seed: SeedOpt = None,
    replay: ReplayOpt = False,
    prefix: PrefixOpt = "nlagg",
    value: ValueOpt = None,
    value_file: ValueFileOpt = None,
    value_cmd: ValueCmdOpt = None,
    t_max: TMaxOpt = None,
    c: COpt = None,
    mu_z: MuZOpt = None,
    k: KOpt = None,
    quantile: QuantileOpt = None,
    early_stop: EarlyStopOpt = None,
    may_depart: PlanMayDepartOpt = None,
    stop_window: StopWindowOpt = None,
    tolerance: ToleranceOpt = None,
    values: ValuesOpt = None,
    value_range: ValueRangeOpt = None,
    force: ForceOpt = False,
) -> None:
    """A docker-compose testbed: Mosquitto with the plan's ACL and passwords, the eavesdropper (transcript
    in the volume 'transcript'), one service per node (checkpoint in its volume 'state-<i>').

    Without --plan, writes a fresh plan (new passwords; broker mqtt://broker:1883) under --out, then
    the compose file and its .env beside it; run it from --out with docker-compose (deploy/README.md).
    """
    from ..deploy import build_plan, load_plan, write_plan
    from ..deploy.compose import COMPOSE_BROKER_URL, compose_yaml, write_compose_project

    if plan is not None and out is None:
        sys.stdout.write(compose_yaml(load_plan(plan), compose_dir=compose_dir))
        return
    out = out if out is not None else Path(".")
    if plan is None:
        spec = _plan_spec(
            run_id=run_id,
            n=n,
            graph=graph,
            graph_file=graph_file,
            radius=radius,
            op=op,
            corrupt=corrupt,
            seed=seed,
            replay=replay,
            prefix=prefix,
            value=value,
            value_file=value_file,
            value_cmd=value_cmd,
            t_max=t_max,
            c=c,
            mu_z=mu_z,
            k=k,
            quantile=quantile,
            early_stop=early_stop,
            may_depart=may_depart,
            stop_window=stop_window,
            tolerance=tolerance,
            values=values,
            value_range=value_range,
            broker=COMPOSE_BROKER_URL,
        )
        plan = out / plan_dir
        write_plan(build_plan(spec), plan, force=force)
    loaded = load_plan(plan)
    project = write_compose_project(loaded, out, force=force)
    corrupted = ",".join(str(i) for i in loaded.corrupted) or "none"
    print(
        f"compose testbed for run {loaded.run_id}: {loaded.n} nodes (corrupted {corrupted}); "
        f"{project.compose_file}, {project.env_file} (services run as uid {project.uid}), plan in {plan}"
    )
    print(f"start it from {out}: docker-compose up -d && docker wait $(docker-compose ps -q eavesdropper)")


@deploy_app.command("truth")
def truth_cmd(
    plan: Annotated[Path, typer.Option(help="plan directory written by nlagg deploy plan or compose")],
    out: Annotated[Path, typer.Option(help="file to write (0600)")] = Path("summary.json"),
) -> None:
    """Write a plan's ground truth (run id, every node's private value) as the summary.json that
    nlagg attack and nlagg report score a transcript against. Private: keep it with the operator."""
    import json

    from ..deploy import load_plan
    from ..deploy.nodefile import read_node_value
    from ..private import write_private

    loaded = load_plan(plan)
    values = {str(node.id): read_node_value(node, plan) for node in loaded.nodes}
    doc = {"run_id": loaded.run_id, "corrupted": loaded.corrupted, "private_values": values}
    write_private(out, json.dumps(doc, indent=2) + "\n")
    print(f"{out}: the private values of run {loaded.run_id}'s {loaded.n} nodes")


@deploy_app.command("publish-config")
def publish_config_cmd(
    config: Annotated[Path, typer.Option(help="the plan's public run.toml")] = Path("run.toml"),
    broker: Annotated[str, typer.Option(help="the run's broker, mqtt://host[:port]")] = DEFAULT_BROKER,
    username: Annotated[str, typer.Option(help="broker user allowed to write the config")] = "launcher",
    password_file: Annotated[Path, typer.Option(help="file holding that user's password")] = Path(
        "secrets/launcher.pw"
    ),
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
) -> None:
    """Publish the run's public configuration as the retained P/R/config message (run from the plan dir)."""
    import asyncio

    from ..deploy.launcher import publish_config
    from ..inputs import read_input_text

    lines = read_input_text(password_file, "password_file").splitlines()
    password = lines[0].strip() if lines else ""
    tls = tls_settings(broker, ca_file, cert_file, key_file)
    topic = asyncio.run(publish_config(config, broker, username=username, password=password, tls=tls))
    print(f"published the retained run configuration on {topic}")


@deploy_app.command("bundle")
def bundle_cmd(
    plan: Annotated[Path, typer.Option(help="plan directory written by nlagg deploy plan")],
    node: Annotated[int, typer.Option(help="node id")],
    out: Annotated[Path | None, typer.Option(help="tarball to write [default: node<ID>.tar.gz]")] = None,
) -> None:
    """Pack what one device needs (run.toml, graph.json, its node file and password) into a tarball."""
    from ..deploy.bundle import write_bundle

    target = out if out is not None else Path(f"node{node}.tar.gz")
    members = write_bundle(plan, node, target)
    print(f"{target}: {', '.join(members)}")


@deploy_app.command("node")
def node_cmd(
    node_file: Annotated[
        Path, typer.Argument(metavar="NODE_FILE", help="the node's private file (nodes/<i>.toml)")
    ],
    broker: Annotated[str | None, typer.Option(help="override the broker URL [default: the file's]")] = None,
    dry_run: Annotated[bool, typer.Option(help="print the nlagg node command instead of running it")] = False,
    state_dir: Annotated[
        str | None, typer.Option(help="override the file's checkpoint directory (systemd: StateDirectory=)")
    ] = None,
) -> None:
    """Start one node from its file: runs `nlagg node` with the file's id, value source and credentials."""
    from ..deploy.nodefile import nlagg_program, node_file_argv, resolve_node, shell_line

    node, base = resolve_node(node_file)
    argv = node_file_argv(node, broker=broker, state_dir=state_dir)
    if dry_run:
        print(f"cd {base} && {shell_line(argv)}")
        return
    os.chdir(base)
    sys.stdout.flush()
    os.execv(nlagg_program(), argv)
