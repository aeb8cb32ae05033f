"""``nlagg sim``: the batched Monte Carlo simulator."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

import typer

from ..options import SimOptions
from ._app import app, claim_file, claim_out
from ._command import options_command

RUN_FILES = ("summary.json", "arrays.npz", "manifest.json")
"""What ``nlagg sim --out`` writes."""

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rich.table import Table

    from ..sim.output import SimSummary


@options_command(app, SimOptions)
def sim(opts: SimOptions) -> None:
    """Simulate many trials of private PDMM aggregation and report accuracy and leakage per rank."""
    from ..departure import departure_defaults, parse_departures
    from ..sim.output import summarize, write_run
    from ..valuechecks import config_warnings
    from ..verdict import far_beyond_warning

    early_stop, may_depart = departure_defaults(opts.early_stop, opts.may_depart, opts.depart, opts.op)
    cfg = dataclasses.replace(opts, early_stop=early_stop, may_depart=may_depart).load()
    warnings = config_warnings(cfg)
    for line in warnings:  # about privacy: printed even with --quiet
        typer.echo(line, err=True)
    if opts.epochs is not None:  # --drift and --cold-start need it (SimOptions.NEEDS)
        _sim_epochs(opts, opts.epochs, cfg, warnings)
        return
    corrupted = opts.corrupted(cfg.n)
    departures = parse_departures(opts.depart)
    if opts.out is not None:
        claim_out(opts.out, RUN_FILES, force=opts.force)
    if opts.transcript is not None:
        claim_file(opts.transcript, force=opts.force, field="transcript")
    result = _run_with_progress(cfg, departures, show=not opts.quiet)
    summary = summarize(result, corrupted)
    # A config warning already says why values leak; otherwise the measured leakage says it.
    far = None if warnings else far_beyond_warning(cfg, summary["leakage_probability"])
    if far is not None:
        typer.echo(far, err=True)
    summary["warnings"] = [*warnings, *([far] if far is not None else [])]
    if opts.out is not None:
        write_run(result, opts.out, summary)
    if opts.transcript is not None:
        from adversary.simulated import simulate_transcript

        summary["transcript"] = str(
            simulate_transcript(cfg, opts.transcript, corrupted=corrupted, departures=departures)
        )
    if opts.as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_table(summary)


def _sim_epochs(opts: SimOptions, epochs: int, cfg: Any, warnings: list[str]) -> None:
    """``nlagg sim --epochs K``: K epochs of a continuous deployment (:mod:`nlagg_node.sim.multiepoch`)."""
    from ..sim.multiepoch import simulate_epochs

    drift = 0.0 if opts.drift is None else opts.drift
    if not opts.quiet:
        _say_compiling()
    result = simulate_epochs(cfg, epochs, drift, warm=not opts.cold_start)
    summary: dict[str, Any] = {
        "op": cfg.op,
        "n": cfg.n,
        "trials": cfg.trials,
        "seed": cfg.seed,
        "value_range": list(cfg.value_range) if cfg.value_range is not None else None,
        **result.summary(),
        "warnings": warnings,
    }
    if opts.as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_epochs(summary)


def _print_epochs(summary: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    start = "warm" if summary["warm_start"] else "cold"
    console.print(
        f"[bold]{summary['op']}[/] n={summary['n']} trials={summary['trials']} epochs={summary['epochs']}"
        f" drift={summary['drift']:g} {start} start seed={summary['seed']}   {summary['wall_seconds']:.1f} s"
    )
    its = summary["iterations_by_epoch"]
    console.print(
        f"iterations per epoch (median): first {its[0]:.0f}, later {sum(its[1:]) / max(len(its) - 1, 1):.0f}"
    )
    columns = {
        "leakage per epoch (mean)": summary["leakage_probability"],
        "exposed in some epoch": summary["cumulative_leakage_probability"],
        "of which beyond the ideal world": summary["cumulative_beyond_ideal"],
    }
    title = "values the adversary's view determines (rank 0 = largest; cumulative: first epoch's ranks)"
    console.print(_rank_table(title, columns))


def _rank_table(
    title: str,
    columns: Mapping[str, Sequence[float]],
    *,
    caption: str | None = None,
    digits: Mapping[str, int] | None = None,
) -> Table:
    """A table of per-rank figures: a row per rank (0 = largest value), a column per series in
    ``columns`` (its heading: its series), printed with 3 decimals unless ``digits`` names others."""
    from rich.table import Table

    places = [(digits or {}).get(name, 3) for name in columns]
    table = Table("rank", *columns, title=title, caption=caption)
    for r, row in enumerate(zip(*columns.values(), strict=True)):
        table.add_row(str(r), *(f"{v:.{d}f}" for v, d in zip(row, places, strict=True)))
    return table


def _say_compiling() -> None:
    """One line on stderr before a first compile, so that it is not a minute of silence."""
    from ..compile_cache import COMPILING, simulator_cached

    if not simulator_cached():
        print(f"nlagg: {COMPILING}", file=sys.stderr, flush=True)


def _run_with_progress(cfg: Any, departures: dict[int, int], *, show: bool) -> Any:
    from ..compile_cache import COMPILING, simulator_cached
    from ..sim import simulate

    if not show:
        return simulate(cfg, departures=departures)
    if not sys.stderr.isatty():  # a log: one line, so a first compile is not silence
        _say_compiling()
        return simulate(cfg, departures=departures)
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        what = f"{cfg.op} x {cfg.trials} trials"
        task = bar.add_task(what if simulator_cached() else COMPILING, total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=what)

        return simulate(cfg, progress=report, departures=departures)


def _print_table(summary: SimSummary) -> None:
    from rich.console import Console

    console = Console()
    console.print(
        f"[bold]{summary['op']}[/] n={summary['n']} trials={summary['trials']} t_max={summary['t_max']} "
        f"c={summary['c']} init={summary['init']} seed={summary['seed']}"
    )
    console.print(
        f"MSE {summary['mse']:.3g}   converged (to {summary['tolerance']:g})"
        f" {summary['converged_fraction']:.3f}   "
        f"iterations to converge (median) {summary['iterations_to_converge']}"
        f"   {summary['wall_seconds']:.1f} s"
    )
    columns = {
        "leakage probability": summary["leakage_probability"],
        "of which matching events": summary["matching_probability"],
        "ideal world": summary["ideal_world"],
    }
    console.print(
        _rank_table(
            "values the adversary's view determines (rank 0 = largest value)",
            columns,
            caption="ideal world: 1 = every exact protocol exposes this rank too (it holds the output)",
            digits={"ideal world": 0},
        )
    )
    if summary.get("departed"):
        console.print(
            f"departed: {summary['departed']} (node: iteration); components: {summary['components']}"
        )
    if "departed_fraction" in summary:
        console.print(
            f"share of trials it left in (else it had stopped first): {summary['departed_fraction']}"
        )
