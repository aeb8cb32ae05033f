"""The options of ``nlagg tune``: the run to tune, the target, the search and the epochs it is judged over."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

from .opt import FORCE_HELP, GRAPHS, OPERATORS, QUIET_HELP, SCHEDULER_HELP, Needs, Opt

__all__ = ["TuneOptions"]


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """``nlagg tune``."""

    NEEDS: ClassVar[Needs] = (
        ("drift", "epochs", "settings judged over epochs"),
        ("cold_start", "epochs", "settings judged over epochs"),
    )

    op: Annotated[
        str, Opt("max, min, topk, median, quantile, trimmed-mean or average", choices=OPERATORS)
    ] = "max"
    n: Annotated[int, Opt("number of nodes")] = 15
    graph: Annotated[
        str | None, Opt("rgg, ring, complete, grid, erdos-renyi, star or file", choices=GRAPHS)
    ] = None
    graph_file: Annotated[Path | None, Opt("edge list; implies --graph file")] = None
    value_range: Annotated[
        tuple[float, float] | None, Opt("public range LO HI of the values", metavar="LO HI")
    ] = None
    max_leak: Annotated[
        float, Opt("target: largest per-rank leakage over the ranks the ideal world does not expose")
    ] = 0.02
    budget: Annotated[int, Opt("iteration budget per phase (the largest t_max tried)")] = 10000
    trials: Annotated[int, Opt("Monte Carlo trials per setting")] = 300
    k: Annotated[int | None, Opt("K for topk and trimmed-mean")] = None
    quantile: Annotated[float | None, Opt("quantile level p")] = None
    seed: Annotated[int, Opt("seed of the evaluation runs (written to run.toml)")] = 0
    epochs: Annotated[
        int | None,
        Opt(
            "judge each setting over K epochs of a continuous deployment: --max-leak then bounds the"
            " cumulative exposure beyond the ideal world (docs/epochs.md)"
        ),
    ] = None
    drift: Annotated[
        float, Opt("with --epochs: the declared drift, a fraction of --value-range (value units without)")
    ] = 0.0
    cold_start: Annotated[
        bool, Opt("with --epochs: start every epoch cold (default: warm starts)", flags=("--cold-start",))
    ] = False
    scheduler: Annotated[str | None, Opt(SCHEDULER_HELP, metavar="tcp://HOST:PORT")] = None
    out: Annotated[Path, Opt("where to write the chosen run config")] = Path("run.toml")
    as_json: Annotated[bool, Opt("print the table and the choice as JSON", flags=("--json",))] = False
    force: Annotated[bool, Opt(FORCE_HELP, flags=("--force",))] = False
    quiet: Annotated[bool, Opt(QUIET_HELP, flags=("--quiet", "-q"))] = False
