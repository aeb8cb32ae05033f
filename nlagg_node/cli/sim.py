"""``nlagg sim``: the batched Monte Carlo simulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._app import (
    CORRUPT_HELP,
    ConfigOpt,
    COpt,
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
    TrialsOpt,
    ValueRangeOpt,
    ValuesFileOpt,
    ValuesOpt,
    app,
    claim_file,
    claim_out,
    parse_corrupt,
)

RUN_FILES = ("summary.json", "arrays.npz", "manifest.json")
"""What ``nlagg sim --out`` writes."""

if TYPE_CHECKING:
    from ..sim.output import SimSummary


@app.command()
def sim(
    op: OpOpt = None,
    n: NOpt = None,
    graph: GraphOpt = None,
    graph_file: GraphFileOpt = None,
    trials: TrialsOpt = None,
    t_max: TMaxOpt = None,
    c: COpt = None,
    init: InitOpt = None,
    mu_z: MuZOpt = None,
    sigma_z: SigmaZOpt = None,
    seed: SeedOpt = None,
    k: KOpt = None,
    quantile: QuantileOpt = None,
    sigma_s: Annotated[
        float | None, typer.Option(help="std of the DP baselines' value noise [default: 0.1]")
    ] = None,
    theta: ThetaOpt = None,
    epsilon: Annotated[
        float | None, typer.Option(help="top-K tolerance for identified values [default: 1e-06]")
    ] = None,
    prior_median: Annotated[
        float | None, typer.Option(help="prior median for --init prior [default: 0.0]")
    ] = None,
    values: ValuesOpt = None,
    values_file: ValuesFileOpt = None,
    value_range: ValueRangeOpt = None,
    record: Annotated[
        str | None,
        typer.Option(help="iterations to keep: none, all, every:K, log:N or 0,10,100 [default: every:10]"),
    ] = None,
    early_stop: EarlyStopOpt = None,
    may_depart: MayDepartOpt = None,
    stop_window: StopWindowOpt = None,
    tolerance: ToleranceOpt = None,
    init_channel: InitChannelOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary object")] = False,
    out: Annotated[
        Path | None, typer.Option(help="write summary.json, arrays.npz and manifest.json into this directory")
    ] = None,
    transcript: Annotated[
        Path | None,
        typer.Option(help="also write trial 0 as an eavesdropper transcript (SQLite), for `nlagg attack`"),
    ] = None,
    corrupt: Annotated[
        str | None, typer.Option(help=CORRUPT_HELP + " in the --transcript (needs --transcript)")
    ] = None,
    depart: Annotated[
        str | None,
        typer.Option(
            help="node@iteration,...: these nodes leave for good at those iterations, in every trial"
            " (README 'Nodes that leave')"
        ),
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Simulate many trials of private PDMM aggregation and report accuracy and leakage per rank."""
    from ..config import load_config
    from ..departure import departure_defaults, parse_departures
    from ..errors import ConfigError
    from ..scale import config_warnings
    from ..sim.output import summarize, write_run
    from ..verdict import far_beyond_warning

    early_stop, may_depart = departure_defaults(early_stop, may_depart, depart, op)
    cfg = load_config(
        config,
        op=op,
        n=n,
        graph="file" if graph_file is not None and graph is None else graph,
        graph_file=graph_file,
        trials=trials,
        t_max=t_max,
        c=c,
        init=init,
        mu_z=mu_z,
        sigma_z=sigma_z,
        seed=seed,
        k=k,
        quantile=quantile,
        sigma_s=sigma_s,
        theta=theta,
        epsilon=epsilon,
        prior_median=prior_median,
        values=values,
        values_file=values_file,
        value_range=value_range,
        record=record,
        early_stop=early_stop,
        may_depart=may_depart,
        stop_window=stop_window,
        tolerance=tolerance,
        init_channel=init_channel,
    )
    warnings = config_warnings(cfg)
    for line in warnings:
        typer.echo(line, err=True)
    corrupted = sorted(parse_corrupt(corrupt, cfg.n))
    departures = parse_departures(depart)
    if corrupted and transcript is None:
        raise ConfigError("corrupt", corrupt, "only shapes the --transcript; give --transcript too")
    if out is not None:
        claim_out(out, RUN_FILES, force=force)
    if transcript is not None:
        claim_file(transcript, force=force, field="transcript")
    result = _run_with_progress(cfg, departures)
    summary = summarize(result)
    # A config warning already says why values leak; otherwise the measured leakage says it.
    far = None if warnings else far_beyond_warning(cfg, summary["leakage_probability"])
    if far is not None:
        typer.echo(far, err=True)
    summary["warnings"] = [*warnings, *([far] if far is not None else [])]
    if out is not None:
        write_run(result, out, summary)
    if transcript is not None:
        from adversary.simulated import simulate_transcript

        summary["transcript"] = str(
            simulate_transcript(cfg, transcript, corrupted=corrupted, departures=departures)
        )
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_table(summary)


def _run_with_progress(cfg: Any, departures: dict[int, int]) -> Any:
    from ..sim import simulate

    if not sys.stderr.isatty():
        return simulate(cfg, departures=departures)
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        task = bar.add_task(f"{cfg.op} x {cfg.trials} trials", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return simulate(cfg, progress=report, departures=departures)


def _print_table(summary: SimSummary) -> None:
    from rich.console import Console
    from rich.table import Table

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
    table = Table(
        "rank",
        "leakage probability",
        "of which matching events",
        "ideal world",
        title="values the adversary's view determines (rank 0 = largest value)",
        caption="ideal world: 1 = every exact protocol exposes this rank too (it holds the output)",
    )
    for r, (p, m, ideal) in enumerate(
        zip(
            summary["leakage_probability"],
            summary["matching_probability"],
            summary["ideal_world"],
            strict=True,
        )
    ):
        table.add_row(str(r), f"{p:.3f}", f"{m:.3f}", f"{ideal:.0f}")
    console.print(table)
    if summary.get("departed"):
        console.print(
            f"departed: {summary['departed']} (node: iteration); components: {summary['components']}"
        )
    if "departed_fraction" in summary:
        console.print(
            f"share of trials it left in (else it had stopped first): {summary['departed_fraction']}"
        )
