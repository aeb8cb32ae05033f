"""The measured table behind the default initializations (docs/experiments.md, "Default initializations").

For every operator, every initialization is run at the operator's defaults on values drawn
uniformly over a declared range (RGG n = 15, the given trials, seed 0), and on the paper's
N(0, 1) values without a range. A row gives the largest leakage over the ranks the ideal world
does not expose, whether the run is exact (every trial within 1e-9 of the aggregate, relative
to the range), and iterations to converge. The default (``--init proposed``) must be the least
leaky exact one.

Run: python benchmarks/defaults_table.py [--trials 1000] [--ops max,median]
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
    args = ap.parse_args()
    head = "| operator | values | init | c | mu_z | exact | worst leak | iterations median / p99 |"
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for op in args.ops.split(","):
        for which in args.ranges.split(","):
            rng = (15.0, 35.0) if which == "range" else None
            base = load_config(None, op=op, trials=args.trials, value_range=rng, seed=0).resolved()
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


if __name__ == "__main__":
    main()
