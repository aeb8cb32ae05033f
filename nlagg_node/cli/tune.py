"""``nlagg tune``: pick c, mu_z, sigma_z, t_max and the init for a leakage target and a budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..options import TuneOptions
from ..options.opt import refuse_ignored
from ._app import app, claim_file
from ._command import options_command

if TYPE_CHECKING:
    from ..tune import EpochPlan


@options_command(app, TuneOptions)
def tune(opts: TuneOptions) -> None:
    """Search the initialization's parameters with the simulator; print the Pareto table, write run.toml."""
    from ..config import load_config
    from ..tune import candidate_settings, run_toml
    from ..tune import tune as run_tune

    plan = _checked(opts)
    claim_file(opts.out, force=opts.force, field="out")  # before the search, like every --out
    base = load_config(
        None,
        op=opts.op,
        n=opts.n,
        graph="file" if opts.graph_file is not None and opts.graph is None else opts.graph,
        graph_file=opts.graph_file,
        value_range=opts.value_range,
        trials=opts.trials,
        k=opts.k,
        quantile=opts.quantile,
        seed=opts.seed,
    )
    refuse_ignored(opts, base)
    grid = candidate_settings(base, opts.budget)
    if base.graph_file is not None:  # a bad edge list is refused before the search starts
        from ..graphs import load_edge_list

        load_edge_list(base.graph_file, base.n)
    if not opts.quiet and not sys.stderr.isatty():  # a log gets one line; a terminal the bar
        print(f"nlagg: tune: {len(grid)} settings x {opts.trials} trials", file=sys.stderr, flush=True)
    mapper = None
    if opts.scheduler is not None:
        from ..sweep import run_on_scheduler

        scheduler = opts.scheduler
        mapper = lambda fn, items: run_on_scheduler(fn, list(items), scheduler)  # noqa: E731
    result = _with_progress(
        lambda report: run_tune(
            base, max_leak=opts.max_leak, budget=opts.budget, progress=report, epochs=plan, mapper=mapper
        ),
        len(grid),
        show=not opts.quiet,
    )
    opts.out.write_text(run_toml(base, result.chosen_setting))
    doc = {**result.to_json(), "run_toml": str(opts.out)}
    if plan is not None:
        doc["epochs"] = {"epochs": plan.epochs, "drift": plan.drift, "warm_start": plan.warm}
    if opts.as_json:
        print(json.dumps(doc))
        return
    from rich.console import Console

    print_result(result, opts.out, Console())


def _checked(opts: TuneOptions) -> EpochPlan | None:
    """Refuse a target, budget or epoch option out of bounds; the epochs the settings are judged over."""
    from ..tune import EpochPlan

    if not 0 < opts.max_leak <= 1:
        raise ConfigError("max_leak", opts.max_leak, "must lie in (0, 1]")
    if opts.budget < 1:
        raise ConfigError("budget", opts.budget, "must be at least 1 iteration")
    if opts.epochs is not None and opts.epochs < 1:
        raise ConfigError("epochs", opts.epochs, "must be at least 1")
    return EpochPlan(opts.epochs, opts.drift, not opts.cold_start) if opts.epochs is not None else None


def _with_progress(job: Any, total: int, *, show: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
        disable=not (show and sys.stderr.isatty()),
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
