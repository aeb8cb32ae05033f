"""The paper's experiments (Sec. VI and the supplement), one per figure, as reproducible commands.

Every panel is one batched simulation (:func:`nlagg_node.sim.simulate`) of the paper's setup
(RGG with n = 15 unless stated, s_i ~ N(0, 1), nodes relabelled by rank per trial) followed
by the leakage measurement: NMI ``I(S_r; X_r^(t)) / I(S_r; S_r)`` per rank at about 300
recorded iterations (:func:`adversary.analysis.mi.nmi_curves`), the empirical leakage probability
(matching events), the MSE per recorded iteration, and the ideal-world bound per rank
(:func:`adversary.bounds.ideal_leakage`). Operator parameters not set by an experiment come
from :class:`nlagg_node.config.RunConfig` (the measured operator defaults).

``run_experiment(name, trials, out)`` writes ``<name>.png``, ``<name>.pdf`` and
``<name>.json``; ``run_all`` runs every experiment, reusing identical simulations across
figures, and writes ``index.html``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from nlagg_node.arrays import FloatArray
from nlagg_node.config import RunConfig, validate_config
from nlagg_node.errors import ConfigError
from nlagg_node.inputs import make_output_dir
from nlagg_node.schedule import Schedule, plan_phases

from .panels import Experiment, ExperimentDoc, Panel, PanelDoc, PanelResult

Log = Callable[[str], None]

RECORDED_POINTS = 300


def _approaches(op: str) -> tuple[Panel, ...]:
    return (
        Panel(op, {"op": op}, "proposed"),
        Panel(op, {"op": op, "init": "none"}, "non-private"),
        Panel(op, {"op": op, "init": "dp-gauss", "sigma_s": 0.1}, "DP Gaussian, sigma_s = 0.1"),
        Panel(op, {"op": op, "init": "dp-laplace", "sigma_s": 0.1}, "DP Laplace, sigma_s = 0.1"),
    )


_SYMMETRIC_MEDIAN: dict[str, Any] = {"op": "median", "init": "symmetric"}

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "mse",
            "Output accuracy",
            "MSE (paper eq. (mse)) against iteration for maximum and median consensus: the proposed "
            "initialization, the non-private counterpart and the DP baselines (sigma_s = 0.1).",
            "mse",
            (*_approaches("max"), *_approaches("median")),
            "The proposed and the non-private runs fall to zero error (exact aggregation); both DP "
            "baselines level off at a floor set by the injected noise.",
        ),
        Experiment(
            "nmi-max",
            "Maximum consensus under four (c, mu_z)",
            "Maximum consensus: NMI I(S_i; X_i^(t)) / I(S_i; S_i) per rank (0 = largest) as c and mu_z grow "
            "(sigma_z = 1); the last panel is the operator default. Legend: empirical leakage probability.",
            "nmi",
            (
                Panel("c = 1, mu_z = 10", {"op": "max", "c": 1.0, "mu_z": 10.0}),
                Panel("c = 10, mu_z = 100", {"op": "max", "c": 10.0, "mu_z": 100.0}),
                Panel("c = 30, mu_z = 300", {"op": "max", "c": 30.0, "mu_z": 300.0}),
                Panel("default c, mu_z", {"op": "max"}),
            ),
            "The largest value always reaches NMI 1 (unavoidable). With small c, values close to the "
            "maximum leak too (leakage probability near 1 for rank 1 and decreasing with rank); as c "
            "and mu_z grow the avoidable leakage vanishes and every other rank stays at its ideal bound.",
        ),
        Experiment(
            "nmi-median",
            "Median consensus under four initializations",
            "Median consensus: NMI per rank for a symmetric random initialization, a one-sided "
            "initialization from below, one from above, and the prior-informed initialization on "
            "bimodal data (N(-5,1) / N(5,1) halves plus one N(0,1) value, x started at the prior median 0).",
            "nmi",
            (
                Panel("symmetric", {"op": "median", "init": "symmetric"}),
                Panel("from below", {"op": "median", "init": "from-below"}),
                Panel("from above", {"op": "median", "init": "from-above"}),
                Panel(
                    "prior-informed, bimodal",
                    {"op": "median", "init": "prior", "values": "bimodal", "prior_median": 0.0},
                ),
            ),
            "The median (rank 7) always leaks. Symmetric random duals let nodes on both sides hit their "
            "values; a one-sided start protects the nodes on the far side only (about half); with the "
            "prior the trajectories stay out of every non-median node's window and only the median leaks.",
        ),
        Experiment(
            "topology",
            "Ring against complete graph",
            "NMI per rank on a ring (d_i = 2) and on the complete graph (d_i = n - 1): maximum consensus "
            "with the default parameters, median consensus with symmetric random duals (where the leakage "
            "depends on the window 2/(c d_i) rather than on the side of the median).",
            "nmi",
            (
                Panel("max, ring", {"op": "max", "graph": "ring"}),
                Panel("max, complete", {"op": "max", "graph": "complete"}),
                Panel("median, symmetric init, ring", {**_SYMMETRIC_MEDIAN, "graph": "ring"}),
                Panel("median, symmetric init, complete", {**_SYMMETRIC_MEDIAN, "graph": "complete"}),
            ),
            "Denser graphs leak less: the complete graph shows lower leakage probabilities than the "
            "ring for the non-target nodes, for both operators (larger d_i, smaller window 2/(c d_i)).",
        ),
        Experiment(
            "dp",
            "Non-private counterpart and DP baselines",
            "NMI per rank for the non-private counterpart (z^(0) = 0) and the DP baselines with Gaussian "
            "and Laplace noise (sigma_s = 0.1), maximum and median consensus.",
            "nmi",
            (
                Panel("max, non-private", {"op": "max", "init": "none"}),
                Panel("max, DP Gaussian", {"op": "max", "init": "dp-gauss", "sigma_s": 0.1}),
                Panel("max, DP Laplace", {"op": "max", "init": "dp-laplace", "sigma_s": 0.1}),
                Panel("median, non-private", {"op": "median", "init": "none"}),
                Panel("median, DP Gaussian", {"op": "median", "init": "dp-gauss", "sigma_s": 0.1}),
                Panel("median, DP Laplace", {"op": "median", "init": "dp-laplace", "sigma_s": 0.1}),
            ),
            "Without masking most nodes reach high NMI early (x_i^(0) = s_i for many of them); DP noise "
            "lowers the NMI below 1 but not to the ideal bound, and (figure mse) costs accuracy.",
        ),
        Experiment(
            "min",
            "Minimum consensus",
            "Minimum consensus with the default parameters: trajectories of one trial (left) and NMI per "
            "rank (right).",
            "trajectory+nmi",
            (Panel("min", {"op": "min"}),),
            "x rises from below every value to the minimum; only the smallest value (rank 14) reaches NMI 1.",
        ),
        Experiment(
            "topk",
            "Top-K (K = 3)",
            "Top-3 aggregation (three max rounds, duals carried over): trajectories of one trial and NMI "
            "per rank.",
            "trajectory+nmi",
            (Panel("top-3", {"op": "topk", "k": 3}),),
            "The three largest values are identified in turn and leak (NMI near 1 for ranks 0-2, slightly "
            "lower where epsilon misclassifies); every other rank stays near 0.",
        ),
        Experiment(
            "quantile",
            "Quantile (5th largest of 15)",
            "Quantile consensus for the 5th-largest value of 15 (p = 5/7, the paper's q = 2/7): "
            "trajectories of one trial and NMI per rank.",
            "trajectory+nmi",
            (Panel("5th largest", {"op": "quantile", "quantile": 5.0 / 7.0}),),
            "x descends from above; rank 4 leaks fully, and the values above the target, which the "
            "trajectory passes, carry more leakage than those below.",
        ),
        Experiment(
            "trimmed-mean",
            "Trimmed mean (2 + 2 trimmed)",
            "Trimmed mean without the 2 largest and 2 smallest values (top-2 max, top-2 min, then average "
            "consensus): trajectories of one trial and NMI per rank.",
            "trajectory+nmi",
            (Panel("K = 2", {"op": "trimmed-mean", "k": 2}),),
            "Only the four trimmed extremes (ranks 0, 1, 13, 14) reach NMI 1; the middle ranks stay low.",
        ),
    )
}


def panel_config(params: dict[str, Any], trials: int, seed: int) -> RunConfig:
    """The run of one panel: the paper's setup (its fixed schedule), the panel's fields, ~300
    recorded iterations."""
    cfg = validate_config({"trials": trials, "seed": seed, "early_stop": False, **params}).resolved()
    t_total = Schedule.of(plan_phases(cfg)).t_total
    return cfg.model_copy(update={"record": f"every:{max(1, t_total // RECORDED_POINTS)}"})


def measure(cfg: RunConfig, log: Log | None = None, bootstrap: int = 0) -> PanelResult:
    """Simulate one configuration and measure its leakage (``bootstrap`` > 1: 90% bands too)."""
    from nlagg_node.sim import simulate

    from ..bounds import ideal_leakage
    from .mi import mse_curve, nmi_curves, nmi_with_bootstrap

    started = time.perf_counter()
    res = simulate(cfg)
    sim_s = time.perf_counter() - started
    x = res.recorded_by_rank()
    s = np.asarray(res.by_rank(res.values), dtype=np.float64)
    t1 = time.perf_counter()
    band = nmi_with_bootstrap(s, x, resamples=bootstrap, seed=cfg.seed) if bootstrap > 1 else None
    nmi = band.nmi if band is not None else nmi_curves(s, x, seed=cfg.seed)
    nmi_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    bound = ideal_leakage(cfg, res.values, seed=cfg.seed).nmi
    lo, hi = res.truth_lo, res.truth_hi
    mse = (
        mse_curve(res.recorded_x, lo, hi)
        if lo.ndim == 1
        else np.full(len(res.recorded_t), np.nan)  # top-K has K outputs; MSE per round is not one curve
    )
    ends = list(np.cumsum([p.t_len for p in res.phases]) - 1)
    out = PanelResult(
        config=cfg.model_dump(mode="json"),
        recorded_t=[int(t) for t in res.recorded_t],
        nmi=nmi,
        leak=res.leakage_probability(),
        mse=mse,
        final_mse=float(res.mse.mean()),
        bound=bound,
        trajectory=np.asarray(x[:, 0, :], dtype=np.float64),
        phase_ends=[int(e) for e in ends],
        seconds={"simulate": sim_s, "nmi": nmi_s, "bound": time.perf_counter() - t2},
        nmi_lower=band.lower if band is not None else None,
        nmi_upper=band.upper if band is not None else None,
    )
    if log is not None:
        log(_describe(cfg, out))
    return out


def _describe(cfg: RunConfig, r: PanelResult) -> str:
    sim_s, nmi_s = r.seconds["simulate"], r.seconds["nmi"]
    return (
        f"  {cfg.op:<12} init={cfg.init:<10} graph={cfg.graph:<8} c={cfg.c} mu_z={cfg.mu_z}: "
        f"simulate {sim_s:.1f} s, NMI {nmi_s:.1f} s, leak(rank 0..2) {np.round(r.leak[:3], 3).tolist()}"
    )


def _measure_job(job: tuple[RunConfig, int]) -> PanelResult:
    """One panel in a worker process of :func:`nlagg_node.sweep.run_sweep`."""
    return measure(job[0], None, job[1])


class PanelCache:
    """Simulations shared between figures within one ``experiment all`` run.

    :meth:`prefetch` measures many panels at once on all cores (each panel's numbers
    depend only on its configuration and seed, not on where or in which order it runs).
    """

    def __init__(
        self,
        log: Log | None = None,
        bootstrap: int = 0,
        workers: int | None = None,
        scheduler: str | None = None,
    ) -> None:
        self.results: dict[str, PanelResult] = {}
        self.log = log
        self.bootstrap = bootstrap
        self.workers = workers
        self.scheduler = scheduler

    @staticmethod
    def _key(cfg: RunConfig) -> str:
        return json.dumps(cfg.model_dump(mode="json"), sort_keys=True)

    def prefetch(self, cfgs: list[RunConfig], on_measured: Callable[[], None] | None = None) -> None:
        """Measure every configuration not measured yet, spread over worker processes.

        The longest schedules go first, so that no long panel is left running alone at
        the end. ``on_measured`` is called in this process after each panel is stored;
        ``run_all`` draws a figure there as soon as its panels are in, while the
        workers go on with the rest.
        """
        from nlagg_node.sweep import run_sweep

        todo: dict[str, RunConfig] = {}
        for cfg in cfgs:
            key = self._key(cfg)
            if key not in self.results:
                todo.setdefault(key, cfg)
        if not todo:
            return  # also keeps a second progress bar from starting inside the first
        keys = sorted(todo, key=lambda k: -Schedule.of(plan_phases(todo[k])).t_total)
        jobs = [(todo[k], self.bootstrap) for k in keys]

        def done(i: int, r: PanelResult) -> None:
            self.results[keys[i]] = r
            if self.log is not None:
                self.log(_describe(jobs[i][0], r))
            if on_measured is not None:
                on_measured()

        run_sweep(
            _measure_job,
            jobs,
            workers=self.workers,
            description="panels",
            on_result=done,
            scheduler=self.scheduler,
        )

    def has(self, cfg: RunConfig) -> bool:
        """Whether ``cfg`` is measured already."""
        return self._key(cfg) in self.results

    def get(self, cfg: RunConfig) -> PanelResult:
        key = self._key(cfg)
        if key not in self.results:
            self.results[key] = measure(cfg, self.log, self.bootstrap)
        return self.results[key]


def experiment_names() -> list[str]:
    return list(EXPERIMENTS)


def run_experiment(
    name: str,
    trials: int = 1000,
    out: Path = Path("experiments"),
    *,
    seed: int = 0,
    cache: PanelCache | None = None,
    log: Log | None = None,
    bootstrap: int = 0,
    workers: int | None = None,
    scheduler: str | None = None,
) -> ExperimentDoc:
    """Run one experiment; write ``<name>.png``, ``<name>.pdf`` and ``<name>.json`` into ``out``.

    The panels run on ``workers`` processes (default: one per core; 1: in this process), or on
    the workers of the Dask scheduler at ``scheduler`` (:func:`nlagg_node.sweep.run_sweep`).
    """
    from ..reporting.plots import draw_experiment

    if name not in EXPERIMENTS:
        raise ConfigError("experiment", name, f"choose one of {', '.join(EXPERIMENTS)} or all")
    if trials < 10:
        raise ConfigError("trials", trials, "the KSG estimate needs at least 10 trials")
    exp = EXPERIMENTS[name]
    if bootstrap == 1 or bootstrap < 0:
        raise ConfigError("bootstrap", bootstrap, "use 0 (no bands) or at least 2 resamples")
    cache = cache if cache is not None else PanelCache(log, bootstrap, workers, scheduler)
    started = time.perf_counter()
    if log is not None:
        log(f"{name}: {exp.title} ({len(exp.panels)} panels, {trials} trials)")
    cfgs = [panel_config(p.params, trials, seed) for p in exp.panels]
    cache.prefetch(cfgs)
    results = [cache.get(cfg) for cfg in cfgs]
    make_output_dir(out, "out")
    files = draw_experiment(exp, results, out)
    panels: list[PanelDoc] = []
    for p, r in zip(exp.panels, results, strict=True):
        # cast: mypy wants the optional bands named in a literal that unpacks another TypedDict
        panel = cast(
            PanelDoc,
            {
                "label": p.label,
                "series": p.series,
                **r.summary(),
                "recorded_t": r.recorded_t,
                "nmi": _nested(r.nmi),
            },
        )
        if r.nmi_lower is not None and r.nmi_upper is not None:
            panel["nmi_lower"], panel["nmi_upper"] = _nested(r.nmi_lower), _nested(r.nmi_upper)
        panels.append(panel)
    doc: ExperimentDoc = {
        "experiment": name,
        "title": exp.title,
        "caption": exp.caption,
        "expect": exp.expect,
        "trials": trials,
        "seed": seed,
        "panels": panels,
        "files": [f.name for f in files],
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    return doc


def _nested(a: FloatArray) -> list[list[float]]:
    return [[round(float(v), 4) for v in row] for row in a]


def run_all(
    trials: int = 1000,
    out: Path = Path("experiments"),
    *,
    seed: int = 0,
    log: Log | None = None,
    names: list[str] | None = None,
    bootstrap: int = 0,
    workers: int | None = None,
    scheduler: str | None = None,
) -> Path:
    """Every experiment (or ``names``), sharing identical simulations; writes ``index.html``.

    All distinct panels are measured first, spread over ``workers`` processes (default:
    one per core) or a Dask scheduler's workers; the figures are drawn afterwards. The numbers do
    not depend on ``workers`` or ``scheduler``.
    """
    from ..report import write_index

    chosen = list(EXPERIMENTS) if names is None else names
    unknown = [nm for nm in chosen if nm not in EXPERIMENTS]
    if unknown or not chosen:
        raise ConfigError("experiment", unknown or chosen, f"choose from {', '.join(EXPERIMENTS)}")
    started = time.perf_counter()
    if bootstrap == 1 or bootstrap < 0:
        raise ConfigError("bootstrap", bootstrap, "use 0 (no bands) or at least 2 resamples")
    if trials < 10:
        raise ConfigError("trials", trials, "the KSG estimate needs at least 10 trials")
    cache = PanelCache(log, bootstrap, workers, scheduler)
    wanted = {
        name: [panel_config(p.params, trials, seed) for p in EXPERIMENTS[name].panels] for name in chosen
    }
    docs: dict[str, ExperimentDoc] = {}

    def draw_ready() -> None:
        # Drawing takes about 1.3 s a figure: done here while the workers measure other panels.
        for name, cfgs in wanted.items():
            if name not in docs and all(cache.has(cfg) for cfg in cfgs):
                docs[name] = run_experiment(name, trials, out, seed=seed, cache=cache, log=log)

    cache.prefetch([cfg for cfgs in wanted.values() for cfg in cfgs], on_measured=draw_ready)
    draw_ready()  # experiments with nothing left to measure (or measured in this process)
    wall = time.perf_counter() - started
    return write_index(
        out, [docs[name] for name in chosen], wall_seconds=wall, simulations=len(cache.results)
    )
