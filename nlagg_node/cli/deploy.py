"""``nlagg deploy``: generate a deployment plan, a docker-compose file, and start one node from its file."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..defaults import DEFAULT_BROKER
from ..options import ComposeOptions, PlanOptions
from ..options.epochs import deployment_drift
from ._app import app
from ._command import NlaggCommand, options_command
from .net import CaFile, CertFile, KeyFile, tls_settings

if TYPE_CHECKING:
    from ..deploy import PlanSpec

deploy_app = typer.Typer(
    name="deploy",
    help="Deployment: broker credentials and ACLs, per-node files, docker-compose, Raspberry Pi nodes.",
    no_args_is_help=True,
)
app.add_typer(deploy_app, name="deploy")


def _network(opts: PlanOptions) -> PlanSpec:
    """The spec of ``deploy plan``: the run's options, then its broker, listener, TLS and sites."""
    from ..deploy import TlsFiles, plan_spec
    from ..deploy.continuous import schedule_of
    from ..errors import ConfigError

    if opts.out.exists() and not opts.out.is_dir():
        raise ConfigError("out", str(opts.out), "exists and is not a directory")
    tls_parts = (opts.tls_cafile, opts.tls_certfile, opts.tls_keyfile)
    if opts.tls and any(tls_parts):
        why = "--tls generates the broker's files: leave out --tls-cafile and friends"
        raise ConfigError("tls", True, why)
    secure = opts.tls or all(tls_parts)
    broker = opts.broker or ("mqtts://127.0.0.1:8883" if secure else DEFAULT_BROKER)
    listen = opts.listen or ("8883" if secure else "1883")
    host, _, port_text = listen.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("listen", listen, "expected PORT or HOST:PORT") from None
    spec = plan_spec(opts, broker)
    if any(tls_parts) and not all(tls_parts):
        raise ConfigError("tls", tls_parts, "give --tls-cafile, --tls-certfile and --tls-keyfile together")
    site_of = None
    if opts.sites_file is not None:
        from ..deploy.sites import read_sites_file

        if opts.sites != 1:
            raise ConfigError("sites", opts.sites, "give --sites or --sites-file, not both")
        site_of = tuple(read_sites_file(opts.sites_file, spec.run.n))
    drift = opts.drift
    if opts.every is not None:  # a continuous deployment: warm starts unless --cold-start
        drift = deployment_drift(drift, opts.cold_start, spec.run.value_range)
    return dataclasses.replace(
        spec,
        listen_host=host or None,
        listen_port=port,
        tls=TlsFiles(*tls_parts) if all(tls_parts) else None,  # type: ignore[arg-type]
        make_tls=opts.tls,
        require_certificate=opts.require_certificate,
        sites=opts.sites,
        site_of=site_of,
        site_brokers=tuple(opts.site_broker or ()),
        schedule=schedule_of(opts.every, opts.epochs, opts.origin, drift, opts.cold_start),
    )


@options_command(deploy_app, PlanOptions, "plan")
def plan_cmd(opts: PlanOptions) -> None:
    """Write run.toml, graph.json, nodes/<i>.toml, secrets/, broker/ (conf, passwd, ACL) and commands.txt."""
    from ..deploy import build_plan, write_plan

    out = opts.out
    plan = build_plan(_network(opts))
    write_plan(plan, out, force=opts.force)
    corrupted = ",".join(str(i) for i in plan.corrupted) or "none"
    print(
        f"plan for run {opts.run_id}: n={plan.n}, {len(plan.edges)} edges, corrupted {corrupted},"
        f" written to {out}"
    )
    if plan.bridges:
        from ..deploy.sites import cut_edges

        sizes = [plan.site_of.count(s) for s in range(len(plan.site_urls))]
        cut = len(cut_edges(plan.edges, plan.site_of))
        print(f"{len(sizes)} sites of {sizes} nodes, {cut} cut edges, {len(plan.bridges)} bridges")
    print(f"start each part by hand with the lines of {out / 'commands.txt'}")


@options_command(deploy_app, ComposeOptions, "compose")
def compose_cmd(opts: ComposeOptions) -> None:
    """A docker-compose testbed: Mosquitto with the plan's ACL and passwords, the eavesdropper (transcript
    in the volume 'transcript'), one service per node (checkpoint in its volume 'state-<i>').

    Without --plan, writes a fresh plan (new passwords; broker mqtt://broker:1883, with --tls
    mqtts://broker:8883) under --out, then the compose file and its .env beside it; run it from
    --out with docker-compose (docs/cli.md, 'deploy compose').
    """
    from ..deploy import build_plan, load_plan, plan_spec, write_plan
    from ..deploy.compose import (
        COMPOSE_BROKER_URL,
        COMPOSE_TLS_BROKER_URL,
        compose_yaml,
        write_compose_project,
    )

    plan = opts.plan  # the options a plan sets are refused beside it (ComposeOptions.EXCLUDES)
    if plan is not None and opts.out is None:
        sys.stdout.write(compose_yaml(load_plan(plan), compose_dir=opts.compose_dir))
        return
    out = opts.out if opts.out is not None else Path(".")
    if plan is None:
        plan = out / opts.plan_dir
        spec = plan_spec(opts, COMPOSE_TLS_BROKER_URL if opts.tls else COMPOSE_BROKER_URL)
        spec = dataclasses.replace(
            spec,
            make_tls=opts.tls,
            require_certificate=opts.require_certificate,
            listen_port=8883 if opts.tls else spec.listen_port,
        )
        write_plan(build_plan(spec), plan, force=opts.force)
    loaded = load_plan(plan)
    project = write_compose_project(loaded, out, force=opts.force)
    corrupted = ",".join(str(i) for i in loaded.corrupted) or "none"
    print(
        f"compose testbed for run {loaded.run_id}: {loaded.n} nodes (corrupted {corrupted}); "
        f"{project.compose_file}, {project.env_file} (services run as uid {project.uid}), plan in {plan}"
    )
    print(f"start it from {out}: docker-compose up -d && docker wait $(docker-compose ps -q eavesdropper)")


@deploy_app.command("truth", cls=NlaggCommand)
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


@deploy_app.command("publish-config", cls=NlaggCommand)
def publish_config_cmd(
    config: Annotated[Path, typer.Option(help="the plan's public run.toml")] = Path("run.toml"),
    broker: Annotated[
        list[str] | None,
        typer.Option(
            help="the run's broker, mqtt://host[:port]; repeat for site brokers (one instance)"
            f" [default: {DEFAULT_BROKER}]"
        ),
    ] = None,
    username: Annotated[str, typer.Option(help="broker user allowed to write the config")] = "launcher",
    password_file: Annotated[Path, typer.Option(help="file holding that user's password")] = Path(
        "secrets/launcher.pw"
    ),
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            help="the launcher's key, which signs the run instance [default: secrets/launcher.identity.pem]"
        ),
    ] = None,
) -> None:
    """Publish the run's public configuration as the retained P/R/config message (run from the plan dir);
    with a launcher key in run.toml, a fresh signed run instance each time (every start of the run)."""
    import asyncio

    from ..deploy.launcher import publish_config
    from ..deploy.start import read_password

    password = read_password(password_file) or ""
    brokers = broker or [DEFAULT_BROKER]
    tls = tls_settings(brokers[0], ca_file, cert_file, key_file)
    topic = asyncio.run(
        publish_config(
            config, brokers, username=username, password=password, tls=tls, signing_key=signing_key
        )
    )
    print(f"published the retained run configuration on {topic}")


@deploy_app.command("bundle", cls=NlaggCommand)
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


@deploy_app.command("node", cls=NlaggCommand)
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
    """Start one node from its file: `nlagg node` with the file's id, value source and credentials."""
    from ..deploy.nodefile import shell_line
    from ..deploy.start import node_file_start
    from ..options import to_argv
    from .net import run_node_command

    opts, base = node_file_start(node_file, broker=broker, state_dir=state_dir)
    if dry_run:
        print(f"cd {base} && {shell_line(['nlagg', 'node', *to_argv(opts)])}")
        return
    os.chdir(base)  # the file's paths are relative to its base folder
    run_node_command(opts)
