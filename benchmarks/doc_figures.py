"""The measured figures of the README and the docs, written by the script that measures them.

A figure block is the text between ``<!-- NAME:begin (python benchmarks/doc_figures.py GROUP writes it)
-->`` and ``<!-- NAME:end -->`` in a page (the comments do not show when it is rendered). Each GROUP
measures once and rewrites its blocks; nothing outside the markers changes, so the prose around a
block is worded not to repeat its figures. tests/unit/test_doc_figures.py (and, for COMMAND_GROUPS,
tests/integration/test_doc_commands.py) measures every group again and fails when a committed figure
has drifted.

Groups:

* ``defaults``: the README's "Defaults at a glance" table, its leakage over seeds 0-3, and
  docs/reference.md's iterations run (benchmarks/defaults_table.py: ``nlagg sim --op OP --seed S`` at
  every operator's defaults).
* ``slowest-trials``: docs/attack.md, "The slowest trials": ``nlagg sim --op max --json --stop-rule
  tolerance`` (1000 trials, seed 0), its unconverged trials and what the iterations needed correlate
  with.
* ``tolerance``: docs/reference.md, ``--tolerance``: the median iterations run at 1e-6 against 1e-9
  (the median at its defaults, max with ``--stop-rule tolerance``; 1000 trials, seed 0).
* ``attack-example``: docs/attack.md, "The issue's case": the documented ``nlagg sim`` and ``nlagg
  attack`` commands, run as typed in an empty folder, and what the attack reports.
* ``stop-timing``: docs/attack.md, "When a phase stops": that the tolerance rule's last iteration is
  t_q + 2D + W - 1 in every trial (max, ``--stop-rule tolerance``, 100 trials, seed 0, every x
  recorded), and how long after convergence the stop comes; docs/reference.md the same for the median
  at its defaults (1000 trials).

Run: python benchmarks/doc_figures.py [GROUP ...]   (every group when none is named)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nlagg_node.arrays import FloatArray, IntArray
    from nlagg_node.sim.engine import SimResult

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"
ATTACK = ROOT / "docs" / "attack.md"
FIGURE_TRIALS = 1000  # the trials a figure is measured with where its group names no other
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))  # where blocks may live


@dataclass(frozen=True)
class Block:
    """The text of the block ``name`` in ``page`` (on lines of its own unless ``inline``)."""

    page: Path
    name: str
    text: str
    inline: bool = False


def markers(name: str, group: str) -> tuple[str, str]:
    """The comments around a generated block (invisible in the rendered page)."""
    return (
        f"<!-- {name}:begin (python benchmarks/doc_figures.py {group} writes it) -->",
        f"<!-- {name}:end -->",
    )


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- {re.escape(name)}:begin[^>]*-->(.*?)<!-- {re.escape(name)}:end -->", re.DOTALL)


def between(text: str, name: str) -> str:
    """The generated block ``name`` of ``text``."""
    found = _pattern(name).search(text)
    if found is None:
        raise KeyError(f"no block {name!r}")
    return found.group(1).strip()


def block_names(text: str) -> list[str]:
    """Every block ``text`` holds, in order."""
    return re.findall(r"<!-- ([a-z0-9-]+):begin", text)


def with_block(text: str, block: Block, group: str) -> str:
    """``text`` with ``block`` written between its markers (marked as ``group``'s)."""
    begin, end = markers(block.name, group)
    pattern = _pattern(block.name)
    if pattern.search(text) is None:
        raise SystemExit(f"doc_figures: error: {block.page.name}: no {begin} ... {end} markers")
    sep = "" if block.inline else "\n"
    return pattern.sub(lambda _: f"{begin}{sep}{block.text}{sep}{end}", text)


def _g(x: float) -> str:
    """A figure to three significant digits, as the docs write it: 7.63e-6."""
    return f"{x:.3g}".replace("e-0", "e-")


def slowest_trials_blocks(trials: int = FIGURE_TRIALS) -> list[Block]:
    """docs/attack.md's slowest trials: ``nlagg sim --op max --json --stop-rule tolerance``."""
    from nlagg_node.config import load_config
    from nlagg_node.sim import simulate
    from nlagg_node.sim.output import summarize

    result = simulate(load_config(None, op="max", trials=trials, seed=0, stop_rule="tolerance"))
    s = summarize(result)
    worst = [f"trial {t['trial']} ({_g(t['error'])})" for t in s["unconverged_trials"]]
    listed = " and ".join(worst) if len(worst) <= 2 else ", ".join(worst[:-1]) + f" and {worst[-1]}"
    ran = {int(result.phase_iterations[t["trial"]].sum()) for t in s["unconverged_trials"]}
    capped = (
        f"; each ran the full {result.t_total} iterations: the cap, not the stop rule, ended them"
        if ran == {result.t_total}
        else f"; they ran {', '.join(map(str, sorted(ran)))} of at most {result.t_total} iterations"
    )
    summary = (
        f"`converged_fraction` {s['converged_fraction']:.3f}, `max_error` {_g(s['max_error'])}, "
        f"`unconverged_trials` {listed or 'none'}{capped}"
    )
    return [
        Block(ATTACK, "slowest-trials", summary, inline=True),
        Block(ATTACK, "slowest-iterations", _iterations_sentence(result), inline=True),
    ]


def _iterations_sentence(result: SimResult) -> str:
    """What the iterations the converged trials needed correlate with (Spearman), and their spread."""
    import networkx as nx
    from scipy.stats import spearmanr

    conv = result.converged_iterations
    ok = np.flatnonzero(conv >= 0)
    features: dict[str, list[float]] = {"degree": [], "gap": [], "diameter": [], "connectivity": []}
    for b in ok:
        g = nx.Graph()
        g.add_nodes_from(range(result.values.shape[1]))
        g.add_edges_from(map(tuple, result.graphs[b]))
        top = np.sort(result.values[b])[::-1]
        features["degree"].append(g.degree(int(np.argmax(result.values[b]))))
        features["gap"].append(top[0] - top[1])
        features["diameter"].append(nx.diameter(g))
        laplacian = nx.laplacian_matrix(g).toarray().astype(float)
        features["connectivity"].append(np.linalg.eigvalsh(laplacian)[1])
    rho = {k: float(spearmanr(v, conv[ok]).statistic) for k, v in features.items()}
    needed = conv[ok]
    return (
        f"Over the {ok.size} trials that converge, the iterations needed correlate with the holder's "
        f"degree (Spearman {rho['degree']:.2f}) and the top gap ({rho['gap']:.2f}), not with the diameter "
        f"({rho['diameter']:.2f}) or the algebraic connectivity ({rho['connectivity']:.2f}); median "
        f"{np.median(needed):.0f}, 99th percentile {np.percentile(needed, 99):.0f}, max {needed.max()}"
    )


def tolerance_blocks(trials: int = FIGURE_TRIALS) -> list[Block]:
    """docs/reference.md's ``--tolerance``: the median iterations run at 1e-6 against 1e-9."""
    from nlagg_node.config import load_config
    from nlagg_node.sim import simulate
    from nlagg_node.sim.output import summarize

    def ran(op: str, tolerance: float, **rule: str) -> str:
        cfg = load_config(None, op=op, trials=trials, seed=0, tolerance=tolerance, **rule)
        return f"{summarize(simulate(cfg))['iterations_run']:.0f}"

    cap = load_config(None, op="median").resolved().t_max_value
    text = (
        f"the median at 1e-6 runs a median {ran('median', 1e-6)} of {cap} iterations against "
        f"{ran('median', 1e-9)} at 1e-9 (`nlagg sim --op median --trials {trials}`); max with "
        f"`--stop-rule tolerance` {ran('max', 1e-6, stop_rule='tolerance')} against "
        f"{ran('max', 1e-9, stop_rule='tolerance')}"
    )
    return [Block(REFERENCE, "tolerance-runs", text, inline=True)]


def _after_convergence(result: SimResult) -> IntArray:
    """Iterations from convergence (every x within tolerance for good) to the last iteration run."""
    ok = result.converged_iterations >= 0
    return np.asarray(result.phase_iterations.sum(axis=1)[ok] - 1 - result.converged_iterations[ok])


def _quiet_from(x: FloatArray, window: int, tolerance: float) -> int:
    """t_q: the first iteration from which every node's x stays within ``tolerance`` of its value
    ``window`` iterations earlier (``x``: iterations x nodes, up to the last iteration run)."""
    quiet = np.zeros(len(x), dtype=bool)
    quiet[window:] = (np.abs(x[window:] - x[:-window]) <= tolerance).all(axis=1)
    loud = np.flatnonzero(~quiet)
    return int(loud[-1]) + 1 if loud.size else 0


def stop_timing_blocks(trials: int = 100) -> list[Block]:
    """docs/attack.md's "When a phase stops" and docs/reference.md's wait after convergence."""
    import networkx as nx

    from nlagg_node.config import load_config
    from nlagg_node.sim import simulate

    cfg = load_config(None, op="max", trials=trials, seed=0, stop_rule="tolerance", record="all")
    result = simulate(cfg)
    window, tolerance = cfg.stop_window_value, cfg.tolerance
    spans, exact = [], 0
    for b, ran in enumerate(result.phase_iterations.sum(axis=1)):
        g = nx.Graph()
        g.add_nodes_from(range(result.values.shape[1]))
        g.add_edges_from(map(tuple, result.graphs[b]))
        span = 2 * nx.diameter(g) + window - 1
        spans.append(span)
        exact += ran - 1 == _quiet_from(result.recorded_x[:ran, b, :], window, tolerance) + span
    held = "in every trial" if exact == trials else f"in {exact} of {trials} trials"
    after = _after_convergence(result)
    attack = (
        f"Measured, max defaults with `--stop-rule tolerance`, {trials} trials, seed 0, `record all`: "
        f"equality holds {held} (median 2D + W - 1 = {np.median(spans):.0f}); counted from convergence "
        "(every x within `tolerance` of the exact aggregate for good, the simulator's "
        f"`converged_iterations`), the stop comes a median {np.median(after):.0f} iterations later "
        f"(min {after.min()}, max {after.max()})"
    )
    median = _after_convergence(simulate(load_config(None, op="median", trials=FIGURE_TRIALS, seed=0)))
    reference = (
        f"for the median at the defaults a median {np.median(median):.0f} iterations after convergence"
        f" (`nlagg sim --op median --trials {FIGURE_TRIALS}`)"
    )
    return [
        Block(ATTACK, "stop-timing", attack, inline=True),
        Block(REFERENCE, "median-stop-lag", reference, inline=True),
    ]


PATH_VALUES = (0.1, -0.3, 0.5, 2.0, 0.2, -0.1, -2.0)
PATH_COMMANDS = (
    "printf '0,1\\n1,2\\n2,3\\n3,4\\n4,5\\n5,6\\n' > path.csv",
    f"echo {','.join(map(repr, PATH_VALUES))} > values.csv",
    "nlagg sim --op trimmed-mean --k 1 --n 7 --graph file --graph-file path.csv --values-file values.csv \\\n"
    "  --trials 1 --t-max 3000 --transcript path.sqlite --corrupt 1,4",
    "nlagg attack path.sqlite",
)


def _nlagg(commands: tuple[str, ...], cwd: Path) -> str:
    """Run ``commands`` in bash in ``cwd``, ``nlagg`` being this checkout's; what they print."""
    bash = f'nlagg() {{ {sys.executable} -m nlagg_node "$@"; }}\n' + "\n".join(commands)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-euc", bash], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"doc_figures: error: {commands[-1]}: exit {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


def _nodes(nodes: list[int]) -> str:
    names = [str(i) for i in nodes]
    return ("node " if len(names) == 1 else "nodes ") + (
        names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    )


def attack_example_blocks() -> list[Block]:
    """docs/attack.md's path example: its commands as run, and what ``nlagg attack`` reports."""
    import json
    import math
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        _nlagg(PATH_COMMANDS, cwd)
        report = json.loads(_nlagg(("nlagg attack path.sqlite --json",), cwd))
        relation_run = (
            *PATH_COMMANDS[:2],
            PATH_COMMANDS[2].replace("path.sqlite --corrupt 1,4", "p0.sqlite --corrupt 0"),
        )
        _nlagg(relation_run, cwd)
        printed = _nlagg(("nlagg attack p0.sqlite",), cwd)
    found: dict[str, list[tuple[int, int | None, float]]] = {}  # how -> (node, t, value)
    for node in report["nodes"]:
        found.setdefault(node["how"], []).append((node["node"], node["t"], node["value"]))
    parts = []
    for how, nodes in found.items():
        when = sorted({t for _, t, _ in nodes if t is not None})
        at = f" (t = {', '.join(map(str, when))})" if when else ""
        parts.append(f"`{how}` for {_nodes([i for i, _, _ in nodes])}{at}")
    error = max(abs(v - PATH_VALUES[i]) for nodes in found.values() for i, _, v in nodes)
    bound = f"within 1e{math.ceil(math.log10(error))} of" if error > 0 else "equal to"
    reported = f"reports {', '.join(parts[:-1])} and {parts[-1]}: every value {bound} the truth."
    relation = next(line for line in printed.splitlines() if "fixes" in line).strip()
    fence = "```bash\n" + "\n".join(PATH_COMMANDS) + "\n```"
    return [
        Block(ATTACK, "attack-path-example", f"{fence}\n\n{reported}"),
        Block(ATTACK, "attack-path-relation", f"`{relation}`", inline=True),
    ]


def defaults_blocks() -> list[Block]:
    from benchmarks.defaults_table import readme_blocks

    return readme_blocks()


# Groups that run the documented commands as processes (their test is in tests/integration/).
COMMAND_GROUPS = ("attack-example",)
GROUPS: dict[str, Callable[[], list[Block]]] = {
    "defaults": defaults_blocks,
    "slowest-trials": slowest_trials_blocks,
    "tolerance": tolerance_blocks,
    "stop-timing": stop_timing_blocks,
    "attack-example": attack_example_blocks,
}


def write(blocks: list[Block], group: str) -> None:
    """Write each block into its page."""
    for block in blocks:
        block.page.write_text(with_block(block.page.read_text(), block, group))
        print(f"wrote {block.name} into {block.page.relative_to(ROOT)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("groups", nargs="*", help=f"groups to measure, of {', '.join(GROUPS)} (default: all)")
    args = ap.parse_args()
    for group in args.groups:
        if group not in GROUPS:
            ap.error(f"group={group}: not one of {', '.join(GROUPS)}")
    for group in args.groups or list(GROUPS):
        write(GROUPS[group](), group)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: benchmarks.defaults_table is imported from the checkout
    main()
