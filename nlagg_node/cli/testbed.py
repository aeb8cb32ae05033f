"""``nlagg testbed``: a whole network on this machine (broker, eavesdropper, n nodes) and its summary."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..defaults import RUN_DEFAULTS
from ..errors import ConfigError
from ..options import TestbedOptions
from ._app import app, claim_out, setup_logging
from ._command import options_command

if TYPE_CHECKING:
    from ..config import RunConfig
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

_SAME_NAMED = ("run_id", "prefix", "broker_kind", "in_process", "neighbour_timeout", "ca_file", "auth")
"""The options :func:`~nlagg_node.lab.testbed.run_testbed` takes as they are, under their own names."""


def _checked(opts: TestbedOptions) -> tuple[RunConfig, set[int], dict[int, int]]:
    """The run's config, corrupted set and departures; everything refused before anything starts."""
    from ..departure import departure_defaults, parse_departures
    from ..valuechecks import config_warnings
    from .net import tls_settings

    early_stop, may_depart = departure_defaults(opts.early_stop, opts.may_depart, opts.depart, opts.op)
    if opts.every is not None and may_depart is None and opts.op != "trimmed-mean":
        may_depart = True  # epochs: a node absent at an epoch's start departs at t = 0
    cfg = dataclasses.replace(opts, early_stop=early_stop, may_depart=may_depart).load(trials=1)
    for line in config_warnings(cfg):  # about privacy: printed even with --quiet
        print(f"nlagg: {line}", file=sys.stderr)
    if opts.broker_kind not in ("auto", "mosquitto", "amqtt"):
        raise ConfigError("broker_kind", opts.broker_kind, "use auto, mosquitto or amqtt")
    corrupted = set(opts.corrupted(cfg.n))
    departures = parse_departures(opts.depart)
    if opts.ca_file is not None and opts.broker is None:
        why = "needs an mqtts:// --broker (the private broker is plain)"
        raise ConfigError("ca_file", str(opts.ca_file), why)
    if opts.broker is not None:
        tls_settings(opts.broker, opts.ca_file, None, None)  # a CA file without mqtts://, or a missing one
    if opts.out is not None:
        claim_out(opts.out, TESTBED_FILES, force=opts.force)
    return cfg, corrupted, departures


@options_command(app, TestbedOptions, "testbed")
def run_testbed_command(opts: TestbedOptions) -> None:
    """Run a whole network on this machine: broker, eavesdropper, n nodes; print what happened."""
    from rich.console import Console

    from ..lab.progress import progress_line
    from ..lab.testbed import run_testbed
    from ..lifetime import owned_tempdir, run_stoppable

    setup_logging(opts.verbose)
    cfg, corrupted, departures = _checked(opts)
    if opts.every is not None and opts.epochs is not None:  # a continuous deployment (each needs the other)
        from .epochtestbed import run_epoch_testbed_command

        run_epoch_testbed_command(opts, cfg, opts.epochs, opts.every)
        return
    console = Console(stderr=opts.as_json)

    def report(summary: TestbedSummary) -> TestbedSummary:
        if opts.as_json:
            print(json.dumps(summary), flush=True)
        else:
            print_summary(console, summary, quiet=opts.quiet)
        return summary

    def note(msg: str) -> None:
        if not opts.quiet:
            console.print(f"[dim]{msg}[/dim]")

    # The testbed the options describe; each run gives it its directory and progress line.
    testbed = functools.partial(
        run_testbed,
        cfg,
        broker_url=opts.broker,
        corrupt=corrupted,
        departures=departures,
        on_event=note,
        **{name: getattr(opts, name) for name in _SAME_NAMED},
    )

    async def run(out_dir: Path | None, on_progress: ProgressFn | None = None) -> TestbedSummary:
        summary = await testbed(out_dir=out_dir, on_progress=on_progress)
        if opts.out is None:
            summary["transcript"] = None  # the dashboard's temporary copy goes at exit: no path to it
        return report(summary)

    if opts.dashboard is None:
        # The live line goes to stderr, and only to a terminal: --json output and logs stay clean.
        with progress_line(sys.stderr.isatty() and not opts.quiet, console) as on_progress:
            run_stoppable(run(opts.out, on_progress))
        return
    from adversary.reporting.dashboard import parse_listen, serve_beside

    parse_listen(opts.dashboard)  # a bad address fails before anything starts
    with contextlib.ExitStack() as stack:
        # The dashboard reads the transcript while the run writes it, so it needs its path now.
        where = opts.out if opts.out is not None else stack.enter_context(owned_tempdir("testbed"))
        run_stoppable(
            serve_beside(
                where / "transcript.sqlite",
                opts.dashboard,
                run(where),
                lambda line: console.print(line),
                truth=lambda summary: cast(dict[str, Any], summary),  # read as its JSON document
            )
        )


def print_summary(console: Any, s: TestbedSummary, *, quiet: bool = False) -> None:
    """The run's table and verdict on a rich ``console`` (``quiet``: without the legend)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run {s['run_id']}: {s['op']} on {s['n']} nodes ({s['graph']}, {s['edges']} edges)")
    table.add_column("node", justify="right")
    table.add_column("private value", justify="right")
    table.add_column("output", justify="right")
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
    notes = console if not quiet else Console(quiet=True)
    notes.print(
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
    # After a departure from an odd n, a median is exact anywhere between the survivors' two middle values.
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
