"""The measured table behind the default initializations (docs/experiments.md, "Default initializations").

For every operator, every initialization is run at the operator's defaults on values drawn
uniformly over a declared range (RGG n = 15, the given trials, seed 0), and on the paper's
N(0, 1) values without a range. A row gives the largest leakage over the ranks the ideal world
does not expose, whether the run is exact (every trial within 1e-9 of the aggregate, relative
to the range; in brackets the share of trials that converged), and iterations to converge. The
default (``--init proposed``) must be the least leaky exact one.

``--n 15,100`` measures each network size in turn (RGG; rows of n other than 15 name it in the values
column); ``--inits proposed`` only the default initialization.

Run: python benchmarks/defaults_table.py [--trials 1000] [--ops max,median] [--n 15] [--inits proposed]
"""

from __future__ import annotations

import argparse

from nlagg_node.config import OPERATORS, load_config
from nlagg_node.tune import Setting, evaluate

INITS = ("proposed", "none", "symmetric", "prior", "from-above", "from-below")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--ops", default=",".join(OPERATORS))
    ap.add_argument("--ranges", default="range,none", help="range (uniform over [15, 35]), none (N(0, 1))")
    ap.add_argument("--n", default="15", help="network sizes, comma-separated")
    ap.add_argument("--inits", default=",".join(INITS), help="initializations, comma-separated")
    args = ap.parse_args()
    head = "| operator | values | init | c | mu_z | exact | worst leak | iterations median / p99 |"
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(v) for v in args.n.split(",")):
        for op in args.ops.split(","):
            for which in args.ranges.split(","):
                _rows(op, n, (15.0, 35.0) if which == "range" else None, args.trials, args.inits.split(","))


def _rows(op: str, n: int, rng: tuple[float, float] | None, trials: int, inits: list[str]) -> None:
    """The table's rows of one operator, network size and value source."""
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
            f" ({e.converged:.3f}) | {e.leak:.3f} | {its} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
