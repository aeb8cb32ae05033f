"""``nlagg tune``: pick c, mu_z, sigma_z, t_max and the init for a leakage target and a budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError
from ._app import ForceOpt, app, claim_file


@app.command()
def tune(
    op: Annotated[
        str, typer.Option(help="max, min, topk, median, quantile, trimmed-mean or average")
    ] = "max",
    n: Annotated[int, typer.Option(help="number of nodes")] = 15,
    graph: Annotated[
        str | None, typer.Option(help="rgg, ring, complete, grid, erdos-renyi, star or file")
    ] = None,
    graph_file: Annotated[Path | None, typer.Option(help="edge list; implies --graph file")] = None,
    value_range: Annotated[
        tuple[float, float] | None, typer.Option(help="public range LO HI of the values")
    ] = None,
    max_leak: Annotated[
        float,
        typer.Option(help="target: largest per-rank leakage over the ranks the ideal world does not expose"),
    ] = 0.02,
    budget: Annotated[int, typer.Option(help="iteration budget per phase (the largest t_max tried)")] = 10000,
    trials: Annotated[int, typer.Option(help="Monte Carlo trials per setting")] = 300,
    k: Annotated[int | None, typer.Option(help="K for topk and trimmed-mean")] = None,
    quantile: Annotated[float | None, typer.Option(help="quantile level p")] = None,
    seed: Annotated[int, typer.Option(help="seed of the evaluation runs (written to run.toml)")] = 0,
    epochs: Annotated[
        int | None,
        typer.Option(
            help="judge each setting over K epochs of a continuous deployment: --max-leak then bounds the"
            " cumulative exposure beyond the ideal world (docs/epochs.md)"
        ),
    ] = None,
    drift: Annotated[
        float,
        typer.Option(
            help="with --epochs: the declared drift, a fraction of --value-range (value units without)"
        ),
    ] = 0.0,
    cold_start: Annotated[
        bool,
        typer.Option("--cold-start", help="with --epochs: start every epoch cold (default: warm starts)"),
    ] = False,
    out: Annotated[Path, typer.Option(help="where to write the chosen run config")] = Path("run.toml"),
    as_json: Annotated[bool, typer.Option("--json", help="print the table and the choice as JSON")] = False,
    force: ForceOpt = False,
) -> None:
    """Search the initialization's parameters with the simulator; print the Pareto table, write run.toml."""
    from ..config import load_config
    from ..tune import run_toml
    from ..tune import tune as run_tune

    if not 0 < max_leak <= 1:
        raise ConfigError("max_leak", max_leak, "must lie in (0, 1]")
    if budget < 1:
        raise ConfigError("budget", budget, "must be at least 1 iteration")
    if epochs is not None and epochs < 1:
        raise ConfigError("epochs", epochs, "must be at least 1")
    if epochs is None and (drift != 0.0 or cold_start):
        flag, value = ("drift", drift) if drift != 0.0 else ("cold_start", cold_start)
        raise ConfigError(flag, value, "applies with --epochs K only")
    claim_file(out, force=force, field="out")  # before the search, like every --out
    base = load_config(
        None,
        op=op,
        n=n,
        graph="file" if graph_file is not None and graph is None else graph,
        graph_file=graph_file,
        value_range=value_range,
        trials=trials,
        k=k,
        quantile=quantile,
        seed=seed,
    )
    from ..tune import EpochPlan, candidate_settings

    grid = candidate_settings(base, budget)
    plan = EpochPlan(epochs, drift, not cold_start) if epochs is not None else None
    result = _with_progress(
        lambda report: run_tune(base, max_leak=max_leak, budget=budget, progress=report, epochs=plan),
        len(grid),
    )
    out.write_text(run_toml(base, result.chosen_setting))
    doc = {**result.to_json(), "run_toml": str(out)}
    if plan is not None:
        doc["epochs"] = {"epochs": plan.epochs, "drift": plan.drift, "warm_start": plan.warm}
    if as_json:
        print(json.dumps(doc))
        return
    from rich.console import Console

    print_result(result, out, Console())


def _with_progress(job: Any, total: int) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("tune: settings", total=total)
        return job(lambda _e: bar.advance(task))


def print_result(result: Any, out: Path, console: Any) -> None:
    """The Pareto table and the choice (or why none meets the target) on a rich ``console``."""
    from rich.table import Table

    columns = ("init", "c", "mu_z", "sigma_z", "leakage", "95% upper", "iterations median", "p99")
    title = f"Pareto front: leakage against iterations ({result.choice.trials} trials per setting)"
    table = Table(*columns, title=title)
    for e in result.front:
        s = e.setting
        mark = " (chosen)" if e.setting == result.choice.setting else ""
        table.add_row(
            s.init + mark,
            f"{s.c:g}",
            f"{s.mu_z:g}",
            f"{s.sigma_z:g}",
            f"{e.leak:.3f}",
            f"{e.leak_upper:.3f}",
            f"{e.iterations_median:.0f}",
            f"{e.iterations_p99:.0f}",
        )
    console.print(table)
    s = result.chosen_setting
    if result.meets_target:
        console.print(
            f"chosen: --init {s.init} --c {s.c:g} --mu-z {s.mu_z:g} --sigma-z {s.sigma_z:g} --t-max {s.t_max}"
            f" meets leakage <= {result.max_leak:g}; written to {out}"
        )
    else:
        c = result.choice
        if c.exact:  # exact settings exist, but none is private enough (at the 95% upper bound)
            why = (
                f"no exact setting meets leakage <= {result.max_leak:g} at the 95% upper bound within"
                f" {result.budget} iterations; the closest leaks {c.leak:.3f} (upper {c.leak_upper:.3f} over"
                f" {c.trials} trials: more --trials tighten it, a larger --budget allows slower settings)"
            )
        else:
            why = (
                f"no setting is exact within {result.budget} iterations (the closest converged in"
                f" {c.converged:.0%} of its trials): raise --budget"
            )
        console.print(
            f"[red]{why};[/red] written to {out} anyway: --init {s.init} --c {s.c:g} --mu-z {s.mu_z:g}"
            f" --t-max {s.t_max}"
        )
    console.print(f"{len(result.evaluations)} settings in {result.seconds:.0f} s")
