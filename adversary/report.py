"""HTML pages: the index of every experiment, and the report of one testbed run.

``write_index(out, docs)`` lists every figure of ``nlagg experiment all`` with its caption,
what it should show, its parameters and its numbers. ``render_testbed_report(run_dir)`` turns a
testbed run directory (``transcript.sqlite``, ``summary.json``, ``manifest.json`` written by
``nlagg testbed --out DIR``) into the same kind of page: trajectories with the exposures
marked, what the adversary learned when, and each node against the ideal-world bound.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from nlagg_node.errors import ConfigError
from nlagg_node.inputs import make_output_dir
from nlagg_node.verdict import beyond_ideal, verdict

from .analysis.panels import ExperimentDoc, PanelDoc

if TYPE_CHECKING:
    from nlagg_node.config import RunConfig

    from .attack import NodeFinding
    from .bounds import IdealBound

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
img { max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.expect { background: #f6f9ff; border-left: 3px solid #58f; padding: 0.4em 0.8em; }
code { font-size: 12px; }
"""


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return html.escape(str(v))


def _rank_table(panels: list[PanelDoc]) -> str:
    n = len(panels[0]["leakage_probability"])
    head = "".join(f"<th>{r}</th>" for r in range(n))
    rows = []
    for p in panels:
        name = html.escape(p["label"] + (f" / {p['series']}" if p.get("series") else ""))
        for numbers, what in (
            (p["leakage_probability"], "leak prob."),
            (p["nmi_final"], "NMI final"),
            (p["ideal_bound"], "ideal bound"),
            (p["nmi_peak"], "NMI peak"),
            (p["gap_peak"], "gap (peak - bound)"),
        ):
            cells = "".join(f"<td>{_fmt(v)}</td>" for v in numbers)
            rows.append(f"<tr><td class='l'>{name}</td><td class='l'>{what}</td>{cells}</tr>")
    return f"<table><tr><th class='l'>panel</th><th class='l'>rank</th>{head}</tr>{''.join(rows)}</table>"


def _param_table(panels: list[PanelDoc]) -> str:
    keys = ["op", "graph", "init", "c", "mu_z", "sigma_z", "sigma_s", "t_max", "k", "quantile", "values"]
    head = "".join(f"<th>{k}</th>" for k in keys)
    rows = []
    for p in panels:
        cfg = p["config"]
        name = html.escape(p["label"] + (f" / {p['series']}" if p.get("series") else ""))
        cells = "".join(f"<td>{_fmt(cfg.get(k))}</td>" for k in keys)
        extra = f"<td>{_fmt(p['final_mse'])}</td><td>{_fmt(p['seconds'].get('simulate'))}</td>"
        rows.append(f"<tr><td class='l'>{name}</td>{cells}{extra}</tr>")
    header = f"<tr><th class='l'>panel</th>{head}<th>final MSE</th><th>sim s</th></tr>"
    return f"<table>{header}{''.join(rows)}</table>"


def write_index(out: Path, docs: list[ExperimentDoc], *, wall_seconds: float, simulations: int) -> Path:
    """``index.html`` with every experiment of ``nlagg experiment all``."""
    parts = [
        f"<p>{len(docs)} experiments, {simulations} distinct simulations of {docs[0]['trials']} trials each "
        f"(seed {docs[0]['seed']}), {wall_seconds / 60:.1f} minutes in total. NMI curves: KSG estimator "
        "(k = 3) over the trials, nodes relabelled by rank (0 = largest). Legends give each rank's empirical "
        "leakage probability; triangles at the right edge mark the ideal-world bound of each rank.</p>"
    ]
    for d in docs:
        name = html.escape(d["experiment"])
        parts.append(f"<h2 id='{name}'>{name}: {html.escape(d['title'])}</h2>")
        parts.append(f"<p><img src='{name}.png' alt='{name}'></p><p>{html.escape(d['caption'])}</p>")
        parts.append(f"<p class='expect'><b>What to see.</b> {html.escape(d['expect'])}</p>")
        parts.append(
            f"<p>Files: <a href='{name}.pdf'>{name}.pdf</a>, <a href='{name}.json'>{name}.json</a></p>"
        )
        parts.append(_param_table(d["panels"]))
        parts.append(_rank_table(d["panels"]))
    path = out / "index.html"
    path.write_text(_page("nlagg: the paper's experiments", "".join(parts)))
    return path


MC_TRIALS = 1000
"""Value draws of the Monte Carlo ideal-world bound behind :func:`leakage_verdicts`."""


def leakage_verdicts(
    cfg: RunConfig,
    findings: Sequence[NodeFinding],
    values: NDArray[np.float64],
    corrupted: Sequence[int],
    edges: NDArray[np.int64],
    *,
    base_values: Any = None,
    trials: int = MC_TRIALS,
) -> tuple[list[dict[str, Any]], IdealBound]:
    """Each node's finding beside the ideal-world bound of its rank (the report's table, any front end).

    Parameters
    ----------
    cfg : the run (operator, n, K, quantile).
    findings : :attr:`AttackReport.findings` of the run.
    values : the private values (ground truth: the testbed's ``summary.json``); they give each node's rank.
    corrupted : corrupted node ids.
    edges : the run's graph.
    base_values : the ``values`` distribution of the run's config (the manifest's) for the Monte Carlo
        draws; the config's own when None.
    trials : Monte Carlo value draws for :func:`adversary.bounds.ideal_leakage`.

    Returns
    -------
    rows, bound
        One dict per node (node, rank, value, status, t, lower, upper, side, bound = ideal NMI of its
        rank, verdict: :func:`nlagg_node.verdict.verdict` of the node, the ideal world being
        :attr:`IdealBound.full` at its rank), and the :class:`~adversary.bounds.IdealBound` itself.
    """
    from nlagg_node.config import validate_config
    from nlagg_node.sim import draw_values

    from .bounds import ideal_leakage

    n = cfg.n
    rank = np.argsort(np.argsort(-values, kind="stable"), kind="stable")
    mc_cfg = validate_config(
        {
            **cfg.model_dump(mode="json"),
            "trials": trials,
            "record": "none",
            **({"values": base_values} if base_values is not None else {}),
        }
    )
    mc_values = draw_values(mc_cfg.values_value, 12345, trials, n, mc_cfg.value_range)
    bound = ideal_leakage(mc_cfg, mc_values, corrupted=list(corrupted), graphs=[edges] * trials)
    rows: list[dict[str, Any]] = []
    for f in findings:
        r = int(rank[f.node])
        label = verdict(
            exposed=f.status == "exposed", ideal=bool(bound.full[r]), corrupted=f.status == "corrupted"
        )
        rows.append(
            {
                "node": f.node,
                "rank": r,
                "value": float(values[f.node]),
                "status": f.status,
                "t": f.t,
                "lower": f.lower,
                "upper": f.upper,
                "side": f.side,
                "bound": float(bound.nmi[r]),
                "verdict": label,
            }
        )
    return rows, bound


def _read_json(path: Path) -> dict[str, Any]:
    from nlagg_node.inputs import parse_document, read_input_text

    doc = parse_document(read_input_text(path, path.stem), "JSON", path.stem, path)
    if not isinstance(doc, dict):
        raise ConfigError(path.stem, str(path), "expected a JSON object")
    return doc


def _departures_html(departed: dict[int, int], summary: dict[str, Any]) -> str:
    """Who left the run and when (the statuses say so), and each surviving component's result."""
    if not departed:
        return ""
    who = ", ".join(f"node {j} at t={t}" for j, t in sorted(departed.items()))
    parts = [f"<p>Departed for good: {html.escape(who)}; the truth is the survivors' aggregate."]
    comps = summary.get("components") or []
    if summary.get("graph_split"):
        parts.append(" The departures split the graph: one result per component.")
    for c in comps:
        ok = "exact" if c.get("exact") else "NOT exact"
        parts.append(
            f" Component {html.escape(str(c.get('members')))}: {html.escape(str(c.get('true_value')))}, {ok}."
        )
    return "".join(parts) + "</p>"


def render_testbed_report(
    run_dir: Path, out: Path | None = None, say: Callable[[str], None] | None = None
) -> Path:
    """Turn one testbed run directory into ``report.html`` (+ figure); returns the page's path.

    ``say`` hears one line once the run's files are checked, before the replay (which takes a while).
    """
    from .attack import attack_transcript
    from .reporting.plots import draw_testbed, params_line
    from .transcript.arrays import load_transcript_arrays
    from .transcript.writer import Transcript

    run_dir = Path(run_dir)
    transcript = run_dir / "transcript.sqlite"
    summary_path = run_dir / "summary.json"
    if not run_dir.is_dir():
        why = "is a file, not a run directory" if run_dir.exists() else "no such directory"
        raise ConfigError("run_dir", str(run_dir), f"{why} (expected the --out of nlagg testbed)")
    for p in (transcript, summary_path):
        if not p.is_file():
            raise ConfigError("run_dir", str(run_dir), f"missing {p.name} (expected nlagg testbed --out)")
    summary = _read_json(summary_path)
    manifest_path = run_dir / "manifest.json"
    manifest = _read_json(manifest_path) if manifest_path.is_file() else {}
    if not isinstance(summary.get("private_values"), dict):
        why = "holds no private_values (expected nlagg testbed --out)"
        raise ConfigError("summary", str(summary_path), why)
    out = run_dir if out is None else Path(out)
    make_output_dir(out, "out")
    Transcript.open_read_only(transcript).close()  # a file that is no transcript is refused at once
    if say is not None:
        say(f"replaying {transcript} and drawing the report")
    report = attack_transcript(transcript, truth=summary_path)
    data = load_transcript_arrays(transcript)
    cfg = data["cfg"]
    x = np.asarray(data["scale"].to_user(data["x"]), dtype=np.float64)  # in the user's units
    n = cfg.n
    values = np.array([float(summary["private_values"][str(i)]) for i in range(n)])
    base = manifest.get("config", {})
    verdicts, bound = leakage_verdicts(
        cfg, report.findings, values, sorted(data["corrupted"]), data["edges"], base_values=base.get("values")
    )
    rank = np.array([v["rank"] for v in verdicts])

    marks = [(f.node, f.t) for f in report.findings if f.status == "exposed" and f.t >= 0]
    title = (
        f"{cfg.op} on {n} nodes {params_line({'c': cfg.c_value, 'mu_z': cfg.mu_z_value})}:"
        " trajectories coloured by the rank of each node's value"
    )
    revealed = np.where(np.asarray(bound.full, dtype=bool), 1.0, np.asarray(bound.nmi, dtype=np.float64))
    draw_testbed(out / "report.png", x, rank, revealed, marks, title)

    rows = [
        f"<tr><td>{v['node']}</td><td>{v['rank']}</td><td>{v['value']:.6g}</td>"
        f"<td class='l'>{v['status']}</td>"
        f"<td>{v['t'] if v['t'] >= 0 else '-'}</td><td>{_fmt(v['lower'])}</td><td>{_fmt(v['upper'])}</td>"
        f"<td class='l'>{v['side']}</td><td>{_fmt(v['bound'])}</td><td class='l'>{v['verdict']}</td></tr>"
        for v in verdicts
    ]
    beyond = beyond_ideal(v["verdict"] for v in verdicts)
    body = (
        f"<p>Run <code>{html.escape(str(summary.get('run_id')))}</code>: {html.escape(cfg.op)}, n = {n}, "
        f"graph {html.escape(cfg.graph)}, init {html.escape(cfg.init)}, c = {cfg.c}, mu_z = {cfg.mu_z}, "
        f"{report.iterations} iterations, exact output: {summary.get('exact')}, "
        f"{summary.get('messages_captured')} messages captured. "
        f"Corrupted: {sorted(data['corrupted']) or 'none'}.</p>"
        f"{_departures_html(data['departed'], summary)}"
        f"<p><img src='report.png' alt='trajectories'></p>"
        f"<p>Attack: precision {_fmt(report.precision)}, recall of matching events {_fmt(report.recall)}, "
        f"intervals sound {_fmt(report.interval_soundness)}. {beyond} honest node(s) leaked beyond the "
        "ideal world.</p>"
        "<table><tr><th>node</th><th>rank</th><th>s_i</th><th class='l'>adversary learned</th><th>at t</th>"
        "<th>lower</th><th>upper</th><th class='l'>side</th><th>ideal NMI bound (rank)</th>"
        f"<th class='l'>verdict</th></tr>{''.join(rows)}</table>"
        f"<p>Ideal bound: {html.escape(bound.method)} "
        f"(Monte Carlo over {MC_TRIALS} simulated value draws).</p>"
    )
    page = out / "report.html"
    page.write_text(_page(f"nlagg testbed run {summary.get('run_id', '')}", body))
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=1))
    return page
