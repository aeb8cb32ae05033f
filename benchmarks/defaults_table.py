"""The measured tables of the defaults: the README's "Defaults at a glance" and the per-init table
behind the default initializations (docs/experiments.md, "Default initializations").

``--readme``: every operator at its defaults, as ``nlagg sim --trials 1000 --seed 0`` runs it (RGG,
n = 15): the share of exact trials, the worst leakage over the ranks the ideal world does not expose
and the median iterations; the table is written into README.md between its markers
(tests/unit/test_readme_figures.py measures it again at fewer trials and checks each figure).

Otherwise, for every operator, every initialization is run at the operator's defaults on values drawn
uniformly over a declared range (RGG n = 15, the given trials, seed 0), and on the paper's
N(0, 1) values without a range. A row gives the largest leakage over the ranks the ideal world
does not expose, whether the run is exact (every trial within 1e-9 of the aggregate, relative
to the range), and iterations to converge. The default (``--init proposed``) must be the least
leaky exact one.

Run: python benchmarks/defaults_table.py --readme [--trials 1000]
     python benchmarks/defaults_table.py [--trials 1000] [--ops max,median]
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from nlagg_node.config import OPERATORS, load_config
from nlagg_node.tune import Setting, evaluate

INITS = ("proposed", "none", "symmetric", "prior", "from-above", "from-below")
README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- defaults-table:begin (python benchmarks/defaults_table.py --readme writes it) -->"
END = "<!-- defaults-table:end -->"
README_TRIALS = 1000
README_HEAD = (
    "| operator | exact trials | leakage beyond the ideal world (worst rank) | iterations (median) |\n"
    "|---|---|---|---|"
)


@dataclass(frozen=True)
class DefaultsRow:
    """One operator at its defaults: the share of exact trials, the worst leakage over the ranks the
    ideal world does not expose (0 where it exposes every rank), the median iterations."""

    op: str
    exact: float
    leak: float
    iterations: float | None

    def line(self) -> str:
        its = "-" if self.iterations is None else f"{self.iterations:.0f}"
        return f"| {self.op} | {self.exact:.3f} | {self.leak:.3f} | {its} |"


def measure_defaults(op: str, trials: int, seed: int = 0) -> DefaultsRow:
    """``nlagg sim --op OP --trials TRIALS --seed SEED`` at the defaults, as one table row."""
    from nlagg_node.sim import simulate
    from nlagg_node.sim.output import summarize

    s = summarize(simulate(load_config(None, op=op, trials=trials, seed=seed)))
    beyond = [p for p, ideal in zip(s["leakage_probability"], s["ideal_world"], strict=True) if not ideal]
    return DefaultsRow(op, s["converged_fraction"], max(beyond, default=0.0), s["iterations_to_converge"])


def read_readme_rows(text: str) -> list[DefaultsRow]:
    """The rows the README holds between its markers."""
    block = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    rows = []
    for line in block.strip().splitlines()[2:]:
        op, exact, leak, its = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append(DefaultsRow(op, float(exact), float(leak), None if its == "-" else float(its)))
    return rows


def with_table(text: str, rows: list[DefaultsRow]) -> str:
    """``text`` (the README) with the table between its markers replaced by ``rows``."""
    table = "\n".join([README_HEAD, *(r.line() for r in rows)])
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    if pattern.search(text) is None:
        raise SystemExit(f"README.md holds no {BEGIN} ... {END} markers")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text)


def write_readme(trials: int) -> None:
    rows = []
    for op in OPERATORS:
        rows.append(measure_defaults(op, trials))
        print(rows[-1].line(), flush=True)
    README.write_text(with_table(README.read_text(), rows))
    print(f"wrote the table into {README}")


def per_init_table(trials: int, ops: list[str], ranges: list[str]) -> None:
    head = "| operator | values | init | c | mu_z | exact | worst leak | iterations median / p99 |"
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for op in ops:
        for which in ranges:
            rng = (15.0, 35.0) if which == "range" else None
            base = load_config(None, op=op, trials=trials, value_range=rng, seed=0).resolved()
            for init in INITS:
                if op in ("average", "trimmed-mean") and init in ("from-above", "from-below"):
                    continue
                s = Setting(init, base.c_value, base.mu_z_value, base.sigma_z_value, base.t_max_value)
                e = evaluate(base, s)
                its = (
                    f"{e.iterations_median:.0f} / {e.iterations_p99:.0f}"
                    if e.iterations_median is not None and e.iterations_p99 is not None
                    else "-"
                )
                label = "U[15, 35]" if rng else "N(0, 1)"
                print(
                    f"| {op} | {label} | {init} | {s.c:g} | {s.mu_z:g} | {'yes' if e.exact else 'no'}"
                    f" | {e.leak:.3f} | {its} |",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--readme", action="store_true", help="measure the README's table and write it there")
    ap.add_argument("--trials", type=int, default=README_TRIALS)
    ap.add_argument("--ops", default=",".join(OPERATORS))
    ap.add_argument("--ranges", default="range,none", help="range (uniform over [15, 35]), none (N(0, 1))")
    args = ap.parse_args()
    if args.readme:
        write_readme(args.trials)
    else:
        per_init_table(args.trials, args.ops.split(","), args.ranges.split(","))


if __name__ == "__main__":
    main()
