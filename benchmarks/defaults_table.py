"""The measured tables of the defaults: the README's "Defaults at a glance" and the per-init table behind
the default initializations (docs/experiments.md, "Default initializations").

``readme_blocks``: every operator at its defaults, as ``nlagg sim --n N --trials T --seed 0`` runs it
(RGG; n = 15 with 1000 trials, n = 100 with 300: README_SIZES): the share of exact trials, the worst
leakage over the ranks the ideal world does not expose and the median iterations to converge, for
README.md's ``defaults-table`` block; and the median iterations each run took against its cap (early
stopping), for docs/reference.md's ``iterations-run`` block. ``python benchmarks/doc_figures.py
defaults`` writes both (tests/unit/test_doc_figures.py measures them again and checks each figure).

Run as a script, for every operator, every initialization (``--inits``) is run at the operator's defaults on
values drawn uniformly over a declared range (RGG of each ``--n``, the given trials, seed 0), and on the
paper's N(0, 1) values without a range. A row gives the largest leakage over the ranks the ideal world
does not expose, whether the run is exact (every trial within 1e-9 of the aggregate, relative to the
range), and iterations to converge. The default (``--init proposed``) must be the least leaky exact one.

Run: python benchmarks/defaults_table.py [--trials 1000] [--ops max,median] [--n 15,100] [--inits proposed]

"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __name__ == "__main__":  # run as a script: import benchmarks.doc_figures from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.doc_figures import README, REFERENCE, Block, between
from nlagg_node.config import OPERATORS, load_config
from nlagg_node.tune import Setting, evaluate

INITS = ("proposed", "none", "symmetric", "prior", "from-above", "from-below")
README_TRIALS = 1000
README_SIZES = {15: README_TRIALS, 100: 300}  # network size -> trials its rows are measured with
README_SEEDS = range(4)  # the seeds the README's leakage range at n = 15 spans
README_HEAD = (
    "| operator | n | exact trials | leakage beyond the ideal world (worst rank) | iterations (median) |\n"
    "|---|---|---|---|---|"
)


@dataclass(frozen=True)
class DefaultsRow:
    """One operator at its defaults: the share of exact trials, the worst leakage over the ranks the
    ideal world does not expose (0 where it exposes every rank), the median iterations."""

    op: str
    exact: float
    leak: float
    iterations: float | None
    ran: float | None = None  # median iterations a trial ran (every phase, early stopping)
    cap: int | None = None  # the most it may run: t_max per phase, every phase
    n: int = 15

    def line(self) -> str:
        its = "-" if self.iterations is None else f"{self.iterations:.0f}"
        return f"| {self.op} | {self.n} | {self.exact:.3f} | {self.leak:.3f} | {its} |"


def measure_defaults(op: str, trials: int, seed: int = 0, n: int = 15) -> DefaultsRow:
    """``nlagg sim --op OP --n N --trials TRIALS --seed SEED`` at the defaults, as one table row."""
    from nlagg_node.sim import simulate
    from nlagg_node.sim.output import summarize

    result = simulate(load_config(None, op=op, n=n, trials=trials, seed=seed))
    s = summarize(result)
    beyond = [p for p, ideal in zip(s["leakage_probability"], s["ideal_world"], strict=True) if not ideal]
    ran = float(np.median(result.phase_iterations.sum(axis=1)))
    worst = max(beyond, default=0.0)
    return DefaultsRow(
        op, s["converged_fraction"], worst, s["iterations_to_converge"], ran, result.t_total, n
    )


def read_readme_rows(text: str) -> list[DefaultsRow]:
    """The rows the README holds between its ``defaults-table`` markers."""
    rows = []
    for line in between(text, "defaults-table").splitlines()[2:]:
        op, n, exact, leak, its = (cell.strip() for cell in line.strip("|").split("|"))
        iterations = None if its == "-" else float(its)
        rows.append(DefaultsRow(op, float(exact), float(leak), iterations, n=int(n)))
    return rows


def table_block(rows: list[DefaultsRow]) -> Block:
    """The README's ``defaults-table`` block of ``rows``."""
    return Block(README, "defaults-table", "\n".join([README_HEAD, *(r.line() for r in rows)]))


def ran_sentence(rows: list[DefaultsRow]) -> str:
    """``max 1289 of 7000, min ...``: the median iterations run against the cap, per operator."""
    return ", ".join(f"{r.op} {r.ran:.0f} of {r.cap}" for r in rows)


def read_ran(text: str) -> dict[str, tuple[float, int]]:
    """The ``iterations-run`` block of docs/reference.md: operator -> (median run, cap)."""
    found = re.findall(r"([a-z-]+) (\d+) of (\d+)", between(text, "iterations-run"))
    return {op: (float(ran), int(cap)) for op, ran, cap in found}


def seeds_sentence(rows: list[DefaultsRow], seeds: range = README_SEEDS) -> str:
    """``at n = 15 over seeds 0-3 ... max 0.012-0.015, min ...``: each operator's worst leakage over
    ``rows``, one row per operator and seed."""
    spans = []
    for op in dict.fromkeys(r.op for r in rows):
        leaks = [r.leak for r in rows if r.op == op]
        spans.append(f"{op} {min(leaks):.3f}-{max(leaks):.3f}")
    return (
        f"at n = 15, over seeds {seeds[0]}-{seeds[-1]} ({README_TRIALS} trials each), the worst leakage "
        f"beyond the ideal world spans {', '.join(spans)}"
    )


def readme_blocks(sizes: dict[int, int] = README_SIZES) -> list[Block]:
    """The README's table and its leakage over seeds, and docs/reference.md's iterations run, measured
    (benchmarks/doc_figures.py ``defaults`` writes them)."""
    rows = []
    for n, trials in sizes.items():
        for op in OPERATORS:
            rows.append(measure_defaults(op, trials, n=n))
            print(rows[-1].line(), flush=True)
    seed0 = [r for r in rows if r.n == 15]
    return [
        table_block(rows),
        Block(REFERENCE, "iterations-run", ran_sentence(seed0), inline=True),
        seeds_block(seed0 + measure_seeds()),
    ]


def measure_seeds(seeds: range = README_SEEDS[1:]) -> list[DefaultsRow]:
    """Every operator at its defaults at n = 15 and README_TRIALS trials, at each of ``seeds``."""
    return [measure_defaults(op, README_TRIALS, seed) for op in OPERATORS for seed in seeds]


def seeds_block(rows: list[DefaultsRow]) -> Block:
    """The README's ``defaults-seeds`` block: each operator's worst leakage over the seeds of ``rows``."""
    return Block(README, "defaults-seeds", seeds_sentence(rows), inline=True)


def per_init_table(trials: int, ops: list[str], ranges: list[str], n: int, inits: list[str]) -> None:
    head = "| operator | values | init | c | mu_z | exact | worst leak | iterations median / p99 |"
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for op in ops:
        for which in ranges:
            rng = (15.0, 35.0) if which == "range" else None
            base = load_config(None, op=op, n=n, trials=trials, value_range=rng, seed=0).resolved()
            for init in inits:
                if op in ("average", "trimmed-mean") and init in ("from-above", "from-below"):
                    continue
                s = Setting(init, base.c_value, base.mu_z_value, base.sigma_z_value, base.t_max_value)
                e = evaluate(base, s)
                its = (
                    f"{e.iterations_median:.0f} / {e.iterations_p99:.0f}"
                    if e.iterations_median is not None and e.iterations_p99 is not None
                    else "-"
                )
                label = ("U[15, 35]" if rng else "N(0, 1)") + (f", n = {n}" if n != 15 else "")
                print(
                    f"| {op} | {label} | {init} | {s.c:g} | {s.mu_z:g} | {'yes' if e.exact else 'no'}"
                    f" | {e.leak:.3f} | {its} |",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trials", type=int, default=README_TRIALS)
    ap.add_argument("--ops", default=",".join(OPERATORS))
    ap.add_argument("--ranges", default="range,none", help="range (uniform over [15, 35]), none (N(0, 1))")
    ap.add_argument("--n", default="15", help="network sizes of the per-init table, comma-separated")
    ap.add_argument("--inits", default=",".join(INITS), help="initializations, comma-separated")
    args = ap.parse_args()
    for n in (int(v) for v in args.n.split(",")):
        per_init_table(args.trials, args.ops.split(","), args.ranges.split(","), n, args.inits.split(","))


if __name__ == "__main__":
    main()
