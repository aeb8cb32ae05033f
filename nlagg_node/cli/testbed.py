"""``nlagg testbed``: a whole network on this machine (broker, eavesdropper, n nodes) and its summary."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ..defaults import RUN_DEFAULTS
from ..errors import ConfigError
from ._app import (
    ConfigOpt,
    COpt,
    CorruptOpt,
    EarlyStopOpt,
    ForceOpt,
    GraphFileOpt,
    GraphOpt,
    InitChannelOpt,
    InitOpt,
    KOpt,
    MayDepartOpt,
    MuZOpt,
    NOpt,
    OpOpt,
    QuantileOpt,
    SeedOpt,
    SigmaZOpt,
    StopWindowOpt,
    ThetaOpt,
    TMaxOpt,
    ToleranceOpt,
    ValueRangeOpt,
    ValuesFileOpt,
    ValuesOpt,
    VerboseOpt,
    app,
    claim_out,
    parse_corrupt,
    setup_logging,
)
from .net import CaFile, tls_settings

if TYPE_CHECKING:
    from ..lab.progress import ProgressFn
    from ..lab.summary import TestbedSummary

__all__ = ["TESTBED_FILES", "print_summary", "run_testbed_command"]


TESTBED_FILES = (
    "transcript.sqlite*",
    "summary.json",
    "manifest.json",
    "run-config.json",
    "node-*.log",
    "eavesdropper.log",
    "report.html",
    "report.png",
)
"""What ``nlagg testbed --out`` (and ``nlagg report`` on it) writes."""


@app.command("testbed")
def run_testbed_command(
    n: NOpt = None,
    op: OpOpt = None,
    graph: GraphOpt = None,
    graph_file: GraphFileOpt = None,
    corrupt: CorruptOpt = None,
    seed: SeedOpt = None,
    run_id: Annotated[str | None, typer.Option(help="run id [default: a fresh tb-xxxxxxxx]")] = None,
    prefix: Annotated[str, typer.Option(help="topic prefix")] = "nlagg",
    broker: Annotated[
        str | None,
        typer.Option(
            help="use this broker, mqtt:// or mqtts://host[:port] [default: a private one on a free port]"
        ),
    ] = None,
    ca_file: CaFile = None,
    broker_kind: Annotated[str, typer.Option(help="private broker: auto, mosquitto or amqtt")] = "auto",
    in_process: Annotated[
        bool | None,
        typer.Option(
            "--in-process/--processes",
            help="host all nodes as tasks on one connection (large n), or one process per node"
            " [default: processes, except on the embedded broker]",
        ),
    ] = None,
    t_max: TMaxOpt = None,
    c: COpt = None,
    mu_z: MuZOpt = None,
    sigma_z: SigmaZOpt = None,
    theta: ThetaOpt = None,
    k: KOpt = None,
    quantile: QuantileOpt = None,
    init: InitOpt = None,
    values: ValuesOpt = None,
    early_stop: EarlyStopOpt = None,
    may_depart: MayDepartOpt = None,
    stop_window: StopWindowOpt = None,
    tolerance: ToleranceOpt = None,
    init_channel: InitChannelOpt = None,
    value_range: ValueRangeOpt = None,
    values_file: ValuesFileOpt = None,
    config: ConfigOpt = None,
    neighbour_timeout: Annotated[float, typer.Option(help="seconds a node waits at a barrier")] = 60.0,
    depart: Annotated[
        str | None,
        typer.Option(
            help="node@iteration,...: SIGKILL these node processes for good at those iterations; the others"
            " finish with their own aggregate (README 'Nodes that leave')"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            help="keep transcript.sqlite, summary.json, manifest.json and the nodes' and the"
            " eavesdropper's logs in this directory"
        ),
    ] = None,
    force: ForceOpt = False,
    dashboard: Annotated[
        str | None,
        typer.Option(
            help="serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished run until Ctrl-C"
        ),
    ] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a whole network on this machine: broker, eavesdropper, n nodes; print what happened."""
    from rich.console import Console

    from ..config import load_config
    from ..departure import departure_defaults, parse_departures
    from ..lab.progress import progress_line
    from ..lab.testbed import run_testbed
    from ..lifetime import run_stoppable
    from ..scale import config_warnings

    setup_logging(verbose)
    early_stop, may_depart = departure_defaults(early_stop, may_depart, depart, op)
    cfg = load_config(
        config,
        op=op,
        n=n,
        graph="file" if graph_file is not None and graph is None else graph,
        graph_file=graph_file,
        t_max=t_max,
        c=c,
        mu_z=mu_z,
        sigma_z=sigma_z,
        theta=theta,
        k=k,
        quantile=quantile,
        init=init,
        values=values,
        seed=seed,
        value_range=value_range,
        values_file=values_file,
        trials=1,
        early_stop=early_stop,
        may_depart=may_depart,
        stop_window=stop_window,
        tolerance=tolerance,
        init_channel=init_channel,
    )
    for line in config_warnings(cfg):
        print(f"nlagg: {line}", file=sys.stderr)
    if broker_kind not in ("auto", "mosquitto", "amqtt"):
        raise ConfigError("broker_kind", broker_kind, "use auto, mosquitto or amqtt")
    corrupted = parse_corrupt(corrupt, cfg.n)
    departures = parse_departures(depart)
    if ca_file is not None and broker is None:
        raise ConfigError("ca_file", str(ca_file), "needs an mqtts:// --broker (the private broker is plain)")
    if broker is not None:
        tls_settings(broker, ca_file, None, None)  # a CA file without mqtts://, or a missing one: exit 2
    if out is not None:
        claim_out(out, TESTBED_FILES, force=force)
    console = Console(stderr=as_json)

    def report(summary: TestbedSummary) -> TestbedSummary:
        if as_json:
            print(json.dumps(summary), flush=True)
        else:
            print_summary(console, summary)
        return summary

    async def run(out_dir: Path | None, on_progress: ProgressFn | None = None) -> TestbedSummary:
        summary = await run_testbed(
            cfg,
            run_id=run_id,
            prefix=prefix,
            broker_url=broker,
            broker_kind=broker_kind,
            in_process=in_process,
            corrupt=corrupted,
            out_dir=out_dir,
            neighbour_timeout=neighbour_timeout,
            ca_file=ca_file,
            on_event=lambda msg: console.print(f"[dim]{msg}[/dim]"),
            departures=departures,
            on_progress=on_progress,
        )
        return report(summary)

    if dashboard is None:
        # The live line goes to stderr, and only to a terminal: --json output and logs stay clean.
        with progress_line(sys.stderr.isatty()) as on_progress:
            run_stoppable(run(out, on_progress))
        return
    from adversary.dashboard import parse_listen, serve_beside

    parse_listen(dashboard)  # a bad address fails before anything starts
    with contextlib.ExitStack() as stack:
        # The dashboard reads the transcript while the run writes it, so it needs its path now.
        where = out if out is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        run_stoppable(
            serve_beside(
                where / "transcript.sqlite",
                dashboard,
                run(where),
                lambda line: console.print(line),
                truth=lambda summary: cast(dict[str, Any], summary),  # read as its JSON document
            )
        )


def print_summary(console: Any, s: TestbedSummary) -> None:
    from rich.table import Table

    table = Table(title=f"run {s['run_id']}: {s['op']} on {s['n']} nodes ({s['graph']}, {s['edges']} edges)")
    table.add_column("node", justify="right")
    table.add_column("private value", justify="right")
    table.add_column("final x", justify="right")
    table.add_column("eavesdropper learned")
    from ..verdict import BEYOND, UNAVOIDABLE

    for i in range(s["n"]):
        key = str(i)
        exp = s["exposures"].get(key)
        departed = s.get("departed", {})
        if key in departed:
            table.add_row(key, f"{s['private_values'][key]:.6g}", f"departed at t={departed[key]}", "-")
            continue
        if i in s["corrupted"]:
            learned = "corrupted: forwards s_i"
        elif exp is not None:
            ok = "" if exp["correct"] else ", WRONG value"
            where = f"s_i at t={exp['t']} ({exp['how']}{ok})"
            if exp["verdict"] == UNAVOIDABLE:
                learned = f"[yellow]{where}: {UNAVOIDABLE}, the ideal world exposes it too[/yellow]"
            else:
                learned = f"[red]{where}: {exp['verdict']}[/red]"
        else:
            learned = "an interval only"
        table.add_row(key, f"{s['private_values'][key]:.6g}", str(s["final_x"][key]), learned)
    console.print(table)
    console.print(
        "[dim]eavesdropper learned: s_i at t (=s) = a matching event x_i^(t) = s_i gave the exact value at"
        " iteration t; (solved) = solved from an average-consensus x; unavoidable = the node holds an"
        " output value, which every exact protocol reveals (the ideal world); beyond the ideal world ="
        " more than any exact protocol must reveal; an interval only = the transcript bounds s_i"
        " (nlagg attack on the transcript shows it)[/dim]"
    )
    verdict = "[green]exact[/green]" if s["exact"] else "[red]NOT exact[/red]"
    if s["tolerance"] != RUN_DEFAULTS["tolerance"]:  # a fraction of the range, if one was declared
        verdict += f" to {s['tolerance']:g}" + (" of the range" if s["value_range"] is not None else "")
    hint = (
        "" if s["exact"] else " [dim]- not converged: raise --t-max (or --c/--mu-z, see `nlagg tune`)[/dim]"
    )
    if s.get("departed"):
        console.print(f"departed: {s['departed']} (node: iteration); survivors: {s['survivors']}")
        if s["graph_split"]:
            console.print("[yellow]the departures split the graph: one result per component[/yellow]")
            for comp in s["components"]:
                ok = "exact" if comp["exact"] else "NOT exact"
                console.print(f"  component {comp['members']}: true aggregate {comp['true_value']}, {ok}")
    # An even-n median (or a quantile between two values) is exact anywhere in an interval.
    if any(lo != hi for lo, hi in s["true_interval"]):
        parts = [str(lo) if lo == hi else f"any of [{lo}, {hi}]" for lo, hi in s["true_interval"]]
        truth = parts[0] if len(parts) == 1 else f"[{', '.join(parts)}]"
    else:
        truth = str(s["true_value"])
    console.print(f"true aggregate {truth}: {verdict} (MSE {s['mse']:.3g}){hint}")
    console.print(
        f"{s['iterations']} iterations, {s['rounds_per_second']:.1f} rounds/s, "
        f"wall {s['wall_seconds']:.1f} s; broker {s['broker']}; "
        f"{s['messages_captured']} messages captured ({s['messages_rejected']} rejected)"
    )
    beyond = [int(k) for k, e in s["exposures"].items() if e["verdict"] == BEYOND]
    console.print(
        f"exposed honest nodes: {s['exposed_nodes'] or 'none'} ({BEYOND}: {beyond or 'none'});"
        f" corrupted: {s['corrupted'] or 'none'}"
    )
    if s["transcript"]:
        console.print(f"transcript: {s['transcript']}")
