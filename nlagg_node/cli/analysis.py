"""``nlagg attack``, ``nlagg experiment`` and ``nlagg report``: the adversary's analysis."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..options.opt import SCHEDULER_HELP
from ._app import TRANSCRIPT_HELP, ForceOpt, QuietOpt, app, claim_out
from ._command import NlaggCommand


@app.command(cls=NlaggCommand)
def attack(
    transcript: Annotated[
        Path,
        typer.Argument(
            metavar="TRANSCRIPT",
            help=TRANSCRIPT_HELP
            + " of a testbed or simulated run, or an epoch store's folder (opened read-only)",
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    truth: Annotated[
        Path | None,
        typer.Option(help="ground truth to score (summary.json) [default: the one next to the transcript]"),
    ] = None,
    quiet: QuietOpt = False,
    drift: Annotated[
        float | None,
        typer.Option(
            help="an epoch store: the most a value moves per epoch, a fraction of the declared value range"
            " (in the values' units without one); each node's intervals are combined across epochs under it",
            min=0.0,
        ),
    ] = None,
) -> None:
    """Replay the public z-recursion of a transcript and report what it proves about every node.

    Given an epoch store (the folder of ``nlagg eavesdrop --continuous``), every epoch is attacked
    and the report lists the exposures per epoch and each node's intervals combined across epochs.
    """
    from adversary.attack import attack_transcript, incomplete_note
    from adversary.transcript.store import is_epoch_store

    from ..errors import ConfigError
    from ..verdict import output_holders, verdict

    if is_epoch_store(transcript):
        if truth is not None:
            raise ConfigError(
                "truth", str(truth), "an epoch store is not scored (adversary.epochs: interval_soundness)"
            )
        attack_store(transcript, drift, as_json)
        return
    if drift is not None:
        raise ConfigError("drift", drift, f"{transcript} is one run's transcript, not an epoch store")
    report = attack_transcript(transcript, truth=truth)
    if (note := incomplete_note(report)) is not None:
        print(f"nlagg: warning: {note}", file=sys.stderr)
    span = 1.0 if report.value_range is None else report.value_range[1] - report.value_range[0]
    holders = output_holders(report.op, {f.node: f.distance for f in report.exposed.values()}, span)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report.op}: {report.iterations} iterations replayed, output {report.output}")
    for col in ("node", "learned", "value / interval", "at t", "side", "distance", "verdict"):
        table.add_column(col)
    for f in report.findings:
        shown = f"{f.value!r}" if f.value is not None else f"[{f.lower:.6g}, {f.upper:.6g}]"
        exposed, corrupted = f.status == "exposed", f.status == "corrupted"
        table.add_row(
            str(f.node),
            f.status + (f" ({f.how})" if f.how else ""),
            shown,
            str(f.t) if f.t >= 0 else "-",
            f.side,
            f"{f.distance:.3g}",
            verdict(exposed=exposed, ideal=f.node in holders, corrupted=corrupted),
        )
    console = Console()
    console.print(table)
    notes = console if not quiet else Console(quiet=True)
    notes.print(
        "[dim]learned: exposed (=s) = a matching event x_i^(t) = s_i gave the exact value at iteration t;"
        " exposed (solved) = solved from an average-consensus x; exposed (solved from component sum) ="
        " the average phase's sum over its honest component, every other member known (docs/attack.md);"
        " interval = the transcript proves lower <= s_i <= upper; side/distance place that interval against"
        " the output; verdict: unavoidable = holds the output (the ideal world exposes it too), beyond the"
        " ideal world = exposed otherwise (for top-K and the trimmed mean the K extremes are allowed too:"
        " `nlagg report` ranks them)[/dim]"
    )
    for rel in report.extra.get("relations", []):
        terms = " + ".join(_term(c, i) for c, i in zip(rel["coefficients"], rel["nodes"], strict=True))
        console.print(f"the average phase fixes {terms.replace('+ -', '- ')} = {rel['value']:.12g}")
    if report.precision is not None:
        console.print(
            f"precision {report.precision:.3f}  recall {report.recall}  "
            f"intervals sound {report.interval_soundness}  ({report.truth_note})"
        )
    else:
        console.print(report.truth_note or "no ground truth found: not scored")


def _term(coefficient: float, node: int) -> str:
    """``s_3``, ``-s_3`` or ``0.5 s_3``: one term of a linear relation."""
    shown = f"{coefficient:.6g}"
    factor = {"1": "", "-1": "-"}.get(shown, shown + " ")
    return f"{factor}s_{node}"


def _interval(lower: float | None, upper: float | None) -> str:
    from rich.markup import escape

    lo = "-inf" if lower is None else f"{lower:.6g}"
    hi = "inf" if upper is None else f"{upper:.6g}"
    return escape(f"[{lo}, {hi}]")


def attack_store(folder: Path, drift: float | None, as_json: bool) -> None:
    """``nlagg attack`` on an epoch store: exposures per epoch, each node's combined intervals."""
    from rich.console import Console
    from rich.table import Table

    from adversary.epochs import attack_epochs

    report = attack_epochs(folder, drift)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    console = Console()
    table = Table(title=f"{report.prefix}/{report.run_id}: {len(report.epochs)} epochs ({report.op})")
    for col in ("epoch", "state", "output", "published", "iterations", "exposed"):
        table.add_column(col)
    for e in report.epochs:
        table.add_row(
            str(e.epoch),
            e.state + ("" if e.complete else " (incomplete)"),
            "-" if e.output is None else f"{e.output:.6g}",
            "-" if e.published is None else f"{e.published:.6g}",
            "-" if e.iterations is None else str(e.iterations),
            e.error or (", ".join(map(str, e.exposed)) or "none"),
        )
    console.print(table)
    nodes = Table(title="per node" + ("" if drift is None else f", intervals combined under drift {drift:g}"))
    for col in ("node", "exposed in epochs", "latest epoch's interval", "consistent with the drift"):
        nodes.add_column(col)
    for s in report.nodes:
        last = s.combined[-1] if s.combined else None
        shown = "-" if last is None else _interval(last["lower"], last["upper"])
        nodes.add_row(
            str(s.node), ", ".join(map(str, s.exposed_in)) or "-", shown, "yes" if s.consistent else "NO"
        )
    console.print(nodes)
    console.print(f"exposed in at least one epoch: {sorted(report.cumulative) or 'none'}")


def _experiment_names(incomplete: str) -> list[str]:
    """The shell's completion of ``nlagg experiment NAME``."""
    from adversary.analysis.experiments import experiment_names

    return [name for name in (*experiment_names(), "all") if name.startswith(incomplete)]


@app.command(cls=NlaggCommand)
def experiment(
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="mse, nmi-max, nmi-median, topology, dp, min, topk, quantile, trimmed-mean or all",
            autocompletion=_experiment_names,
        ),
    ],
    trials: Annotated[int, typer.Option(help="Monte Carlo trials per simulation")] = 1000,
    out: Annotated[Path, typer.Option(help="directory for the figures, JSON and index.html")] = Path(
        "experiments"
    ),
    force: ForceOpt = False,
    seed: Annotated[int, typer.Option(help="run seed of every simulation")] = 0,
    quiet: QuietOpt = False,
    bootstrap: Annotated[int, typer.Option(help="subsamples (80% of trials) for 90% NMI bands")] = 0,
    scheduler: Annotated[str | None, typer.Option(help=SCHEDULER_HELP, metavar="tcp://HOST:PORT")] = None,
) -> None:
    """Reproduce a figure of the paper (PNG + PDF + JSON); ``all`` also writes index.html."""
    import time

    from adversary.analysis.experiments import run_all, run_experiment

    from ..lifetime import partial_results_in

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    from adversary.analysis.experiments import experiment_names

    chosen = experiment_names() if name == "all" else [name]
    if name in ("all", *experiment_names()):
        extra = ["index.html"] if name == "all" else []
        files = [f"{nm}.{ext}" for nm in chosen for ext in ("png", "pdf", "json")]
        claim_out(out, files + extra, force=force)
    partial_results_in(out)  # an interrupted run keeps the figures it finished
    started = time.perf_counter()
    if name == "all":
        page = run_all(trials, out, seed=seed, log=log, bootstrap=bootstrap, scheduler=scheduler)
        print(f"wrote {page} in {time.perf_counter() - started:.0f} s")
    else:
        doc = run_experiment(name, trials, out, seed=seed, log=log, bootstrap=bootstrap, scheduler=scheduler)
        print(
            f"wrote {', '.join(str(out / f) for f in doc['files'])} and {out / (name + '.json')} "
            f"in {time.perf_counter() - started:.0f} s"
        )


@app.command(cls=NlaggCommand)
def report(
    run_dir: Annotated[
        Path, typer.Argument(metavar="RUN_DIR", help="directory written by nlagg testbed --out")
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="directory for report.html, .png, .pdf, .json [default: the run directory]"),
    ] = None,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Turn one testbed run into a page: trajectories, what the adversary learned when, the ideal bound."""
    from adversary.report import render_testbed_report

    target = out if out is not None else run_dir
    if run_dir.is_dir():
        claim_out(target, [f"report.{ext}" for ext in ("html", "png", "pdf", "json")], force=force)

    def say(line: str) -> None:  # replaying and drawing a long run takes a while
        if not quiet:
            print(f"nlagg: report: {line}", file=sys.stderr, flush=True)

    page = render_testbed_report(run_dir, out, say)
    print(f"wrote {page}")


@app.command(cls=NlaggCommand)
def dashboard(
    transcript: Annotated[
        Path,
        typer.Argument(
            metavar="TRANSCRIPT",
            help=TRANSCRIPT_HELP + " (opened read-only): a growing one is shown live, a finished one"
            " replayed; an epoch store's folder (nlagg eavesdrop --continuous) follows its newest epoch",
        ),
    ],
    port: Annotated[int, typer.Option(help="TCP port (0: any free one)")] = 8080,
    host: Annotated[
        str, typer.Option(help="address to listen on; any but loopback requires the token printed at start")
    ] = "127.0.0.1",
) -> None:
    """Serve a read-only web page of what the eavesdropper learns from a transcript (Ctrl-C stops it)."""
    import asyncio

    from adversary.reporting.dashboard import serve_dashboard

    if not 0 <= port <= 65535:
        from ..errors import ConfigError

        raise ConfigError("port", port, "must lie in 0..65535")
    asyncio.run(serve_dashboard(transcript, host, port, say=lambda line: print(line, flush=True)))
