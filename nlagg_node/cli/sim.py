"""``nlagg sim``: the batched Monte Carlo simulator."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ._app import app, parse_corrupt


@app.command()
def sim(
    op: Annotated[
        str | None, typer.Option(help="max, min, topk, median, quantile, trimmed-mean or average")
    ] = None,
    n: Annotated[int | None, typer.Option(help="number of nodes")] = None,
    graph: Annotated[
        str | None, typer.Option(help="rgg, ring, complete, grid, erdos-renyi, star or file")
    ] = None,
    graph_file: Annotated[
        Path | None, typer.Option(help="edge list (CSV 'i,j' lines or JSON); implies --graph file")
    ] = None,
    trials: Annotated[int | None, typer.Option(help="Monte Carlo trials")] = None,
    t_max: Annotated[
        int | None, typer.Option(help="iterations per phase (operator default if unset)")
    ] = None,
    c: Annotated[
        float | None, typer.Option(help="PDMM step parameter c > 0 (larger = smaller steps)")
    ] = None,
    init: Annotated[
        str | None,
        typer.Option(help="none, dp-gauss, dp-laplace, proposed, symmetric, from-above, from-below, prior"),
    ] = None,
    mu_z: Annotated[float | None, typer.Option(help="mean offset of z^(0)")] = None,
    sigma_z: Annotated[float | None, typer.Option(help="std of z^(0)")] = None,
    seed: Annotated[int | None, typer.Option(help="run seed (recorded in the manifest)")] = None,
    k: Annotated[int | None, typer.Option(help="K for topk and trimmed-mean")] = None,
    quantile: Annotated[
        float | None, typer.Option(help="quantile level p in (0, 1); 0.75 = 75th percentile")
    ] = None,
    sigma_s: Annotated[float | None, typer.Option(help="std of the DP baselines' value noise")] = None,
    theta: Annotated[float | None, typer.Option(help="averaging constant in (0, 1]; 1/2 = ADMM")] = None,
    epsilon: Annotated[float | None, typer.Option(help="top-K tolerance for identified values")] = None,
    prior_median: Annotated[float | None, typer.Option(help="prior median for --init prior")] = None,
    values: Annotated[str | None, typer.Option(help="private values: normal, uniform or bimodal")] = None,
    record: Annotated[
        str | None, typer.Option(help="iterations to keep: none, all, every:K, log:N or 0,10,100")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="TOML run config; flags override it")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary object")] = False,
    out: Annotated[
        Path | None, typer.Option(help="write summary.json, arrays.npz and manifest.json here")
    ] = None,
    transcript: Annotated[
        Path | None,
        typer.Option(help="also write trial 0 as an eavesdropper transcript (SQLite), for `nlagg attack`"),
    ] = None,
    corrupt: Annotated[
        str | None,
        typer.Option(help="corrupted nodes in the transcript: a count (2: nodes 0 and 1) or ids (3,7)"),
    ] = None,
) -> None:
    """Simulate many trials of private PDMM aggregation and report accuracy and leakage per rank."""
    from ..config import load_config
    from ..sim.output import summarize, write_run

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
        record=record,
    )
    corrupted = sorted(parse_corrupt(corrupt, cfg.n))
    result = _run_with_progress(cfg)
    summary = summarize(result)
    if out is not None:
        write_run(result, out, summary)
    if transcript is not None:
        from adversary.simulated import simulate_transcript

        summary["transcript"] = str(simulate_transcript(cfg, transcript, corrupted=corrupted))
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        _print_table(summary)


def _run_with_progress(cfg: Any) -> Any:
    from ..sim import simulate

    if not sys.stderr.isatty():
        return simulate(cfg)
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        task = bar.add_task(f"{cfg.op} x {cfg.trials} trials", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return simulate(cfg, progress=report)


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{summary['op']}[/] n={summary['n']} trials={summary['trials']} t_max={summary['t_max']} "
        f"c={summary['c']} init={summary['init']} seed={summary['seed']}"
    )
    console.print(
        f"MSE {summary['mse']:.3g}   converged {summary['converged_fraction']:.3f}   "
        f"iterations to converge (median) {summary['iterations_to_converge']}"
        f"   {summary['wall_seconds']:.1f} s"
    )
    table = Table(
        "rank", "leakage probability", title="matching events x_i^(t) = s_i (rank 0 = largest value)"
    )
    for r, p in enumerate(summary["leakage_probability"]):
        table.add_row(str(r), f"{p:.3f}")
    console.print(table)
