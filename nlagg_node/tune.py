"""``nlagg tune``: search the private initialization's parameters against leakage and iterations.

One setting (init, c, mu_z, sigma_z, t_max) is evaluated by :func:`evaluate`, a pure function of
the base configuration and the setting (the fast simulator with a pinned seed), so a process pool
can map it over the grid. The result is a Pareto table of leakage (the largest per-rank leakage
over the ranks the ideal world does not expose) against iterations to converge (median and p99),
and a choice: the fastest setting (by p99) whose leakage meets the target with 95% confidence and
that is exact within the iteration budget, or the closest one when none is.

With ``epochs`` (``nlagg tune --epochs K``) a setting is judged over K epochs of a continuous
deployment (:func:`evaluate_epochs`): its leakage is the largest *cumulative* exposure beyond the
ideal world, over the ranks of the first epoch's values (exposed in at least one epoch in which the
node did not hold the output), and its iterations those of every epoch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .arrays import FloatArray, IntArray
from .config import PROPOSED_INIT, RunConfig
from .verdict import ideal_ranks

__all__ = [
    "EpochPlan",
    "Evaluation",
    "Setting",
    "TuneResult",
    "candidate_settings",
    "choose",
    "evaluate",
    "evaluate_epochs",
    "ideal_ranks",
    "pareto",
    "run_toml",
    "tune",
]

EXACT_CONVERGED = 0.99
"""A setting is exact when at least this fraction of trials settles within the tolerance (1e-9,
relative to the range) by t_max ..."""
EXACT_ERROR = 1e-6
"""... and every trial ends within this (relative) of the aggregate: the rare trial with two top
values almost equal needs more iterations to settle to 1e-9 and still ends within about 1e-7."""

Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Setting:
    """One point of the search: what ``--init``, ``--c``, ``--mu-z``, ``--sigma-z``, ``--t-max`` set."""

    init: str
    c: float
    mu_z: float
    sigma_z: float
    t_max: int


@dataclass(frozen=True)
class Evaluation:
    """A setting measured with the simulator.

    ``leak`` is the largest leakage probability over the ranks that the ideal world does not
    expose and ``leak_upper`` its 95% Wilson upper bound; ``iterations_median`` / ``_p99`` count
    the iterations every phase needed to stay within the tolerance (over converged trials).
    """

    setting: Setting
    trials: int
    leak: float
    leak_upper: float
    leak_by_rank: tuple[float, ...]
    converged: float
    exact: bool
    iterations_median: float | None
    iterations_p99: float | None
    seconds: float

    @classmethod
    def measured(
        cls,
        setting: Setting,
        trials: int,
        *,
        leak: float,
        leak_by_rank: FloatArray,
        converged: float,
        exact: bool,
        iterations: IntArray,
        started: float,
    ) -> Evaluation:
        """The evaluation of ``setting`` over ``trials`` trials begun at ``started``
        (:func:`time.perf_counter`): ``leak`` its worst leakage (the Wilson bound is computed here),
        ``iterations`` the sample its median and p99 come from (None for both when it is empty)."""
        some = iterations.size > 0
        return cls(
            setting=setting,
            trials=trials,
            leak=leak,
            leak_upper=wilson_upper(leak, trials),
            leak_by_rank=tuple(round(float(v), 4) for v in leak_by_rank),
            converged=converged,
            exact=exact,
            iterations_median=float(np.median(iterations)) if some else None,
            iterations_p99=float(np.percentile(iterations, 99)) if some else None,
            seconds=time.perf_counter() - started,
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["leak_by_rank"] = list(self.leak_by_rank)
        return out


def wilson_upper(p: float, trials: int, z: float = 1.96) -> float:
    """Upper end of the Wilson score interval of a binomial proportion."""
    if trials <= 0:
        return 1.0
    den = 1.0 + z * z / trials
    centre = p + z * z / (2 * trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return min(1.0, (centre + half) / den)


def apply(base: RunConfig, setting: Setting) -> RunConfig:
    """The run configuration of a setting."""
    from .config import validate_config

    data = base.model_dump()
    data.update(init=setting.init, c=setting.c, mu_z=setting.mu_z, sigma_z=setting.sigma_z)
    data.update(t_max=setting.t_max, record="none")
    return validate_config(data)


def evaluate(base: RunConfig, setting: Setting) -> Evaluation:
    """Simulate ``base.trials`` trials of a setting (pure: same inputs, same numbers)."""
    from .sim import simulate

    started = time.perf_counter()
    res = simulate(apply(base, setting))
    leak = res.leakage_probability()
    exposed_anyway = set(ideal_ranks(base))
    others = [float(leak[r]) for r in range(base.n) if r not in exposed_anyway]
    worst = max(others, default=0.0)
    conv = res.converged_iterations
    ok = conv >= 0
    span = 1.0 if base.value_range is None else base.value_range[1] - base.value_range[0]
    exact = float(ok.mean()) >= EXACT_CONVERGED and float(res.mse.max()) <= (EXACT_ERROR * span) ** 2
    return Evaluation.measured(
        setting,
        base.trials,
        leak=worst,
        leak_by_rank=leak,
        converged=float(ok.mean()),
        exact=exact,
        iterations=conv[ok],
        started=started,
    )


@dataclass(frozen=True)
class EpochPlan:
    """How :func:`evaluate_epochs` runs a setting: K epochs, the declared drift, warm or cold starts."""

    epochs: int
    drift: float = 0.0
    warm: bool = True


def evaluate_epochs(base: RunConfig, setting: Setting, plan: EpochPlan) -> Evaluation:
    """Simulate ``plan.epochs`` epochs of ``base.trials`` deployments of a setting (pure).

    ``leak`` is the largest cumulative exposure beyond the ideal world over the ranks
    (:meth:`~nlagg_node.sim.multiepoch.EpochsResult.cumulative_beyond_ideal`); ``converged`` the share
    of (epoch, trial) pairs that ended exact; the iterations count every epoch's (warm run and any
    cold rerun).
    """
    from .sim.multiepoch import simulate_epochs

    started = time.perf_counter()
    res = simulate_epochs(apply(base, setting), plan.epochs, plan.drift, warm=plan.warm)
    cum = res.cumulative_beyond_ideal()
    worst = float(cum.max(initial=0.0))
    its = res.iterations.ravel()
    converged = float(res.exact.mean())
    return Evaluation.measured(
        setting,
        base.trials,
        leak=worst,
        leak_by_rank=cum,
        converged=converged,
        exact=converged >= EXACT_CONVERGED,
        iterations=its,
        started=started,
    )


def _one_sided(op: str) -> bool:
    return PROPOSED_INIT[op] in ("from-above", "from-below")


def candidate_settings(base: RunConfig, budget: int) -> list[Setting]:
    """The search grid for ``base.op`` with ``budget`` iterations per phase.

    One-sided operators (max, min, top-K, the trimmed mean's extremes) vary c and the start
    mu_z / c just beyond the range (or beyond 3, the N(0, 1) tail, without one); the median and
    quantiles vary c over the prior-informed, symmetric and one-sided starts.
    """
    # mu_z / c: how far beyond the centre x starts (the range's midpoint, or 0 for raw values).
    reach = (0.6, 1.0) if base.value_range is not None else (3.0, 4.0)
    out: list[Setting] = []
    if base.op == "average":
        return [Setting("symmetric", c, 0.0, sz, budget) for c in (0.3, 1.0) for sz in (10.0, 100.0)]
    if _one_sided(base.op):
        init = "proposed"
        for c in (30.0, 100.0, 300.0, 1000.0):
            for r in reach:
                out.append(Setting(init, c, round(c * r, 6), 1.0, budget))
        return out
    for c in (3.0, 10.0, 30.0, 100.0):
        out.append(Setting("prior", c, 0.0, 1.0, budget))
        out.append(Setting("symmetric", c, 0.0, 1.0, budget))
        out.append(Setting("from-above", c, round(c * reach[0], 6), 1.0, budget))
    return out


def pareto(evals: Sequence[Evaluation]) -> list[Evaluation]:
    """Exact settings not dominated in (leakage, p99 iterations), by increasing leakage."""
    ok = [e for e in evals if e.exact and e.iterations_p99 is not None]
    front: list[Evaluation] = []
    for e in sorted(ok, key=lambda e: (e.leak, e.iterations_p99 or 0.0)):
        if not front or (e.iterations_p99 or 0.0) < (front[-1].iterations_p99 or 0.0):
            front.append(e)
    return front


def choose(evals: Sequence[Evaluation], max_leak: float) -> tuple[Evaluation, bool]:
    """The fastest exact setting whose leakage meets ``max_leak`` (95% upper bound), or the closest.

    Returns the choice and whether it meets the target. The closest is the exact setting with
    the least leakage (or, when none is exact, the one that converged most often).
    """
    exact = [e for e in evals if e.exact]
    meeting = [e for e in exact if e.leak_upper <= max_leak]
    if meeting:
        return min(meeting, key=lambda e: (e.iterations_p99 or math.inf, e.leak)), True
    if exact:
        return min(exact, key=lambda e: (e.leak, e.iterations_p99 or math.inf)), False
    return max(evals, key=lambda e: (e.converged, -e.leak)), False


def final_t_max(e: Evaluation, budget: int, observed_max: int | None = None) -> int:
    """t_max of the written config: 1.5 x the p99 iterations, rounded up to 500, within the budget."""
    p99 = e.iterations_p99 or budget
    want = max(p99 * 1.5, float(observed_max or 0))
    return int(min(budget, max(500, math.ceil(want / 500) * 500)))


@dataclass
class TuneResult:
    evaluations: list[Evaluation]
    front: list[Evaluation]
    choice: Evaluation
    chosen_setting: Setting
    meets_target: bool
    max_leak: float
    budget: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "max_leak": self.max_leak,
            "budget": self.budget,
            "meets_target": self.meets_target,
            "choice": {**self.choice.to_json(), "written": asdict(self.chosen_setting)},
            "pareto": [e.to_json() for e in self.front],
            "evaluated": [e.to_json() for e in self.evaluations],
            "seconds": self.seconds,
        }


def tune(
    base: RunConfig,
    *,
    max_leak: float,
    budget: int,
    mapper: Mapper | None = None,
    settings: Sequence[Setting] | None = None,
    progress: Callable[[Evaluation], None] | None = None,
    epochs: EpochPlan | None = None,
) -> TuneResult:
    """Evaluate the grid (with ``mapper``, e.g. a pool's ``map``), build the Pareto table, choose.

    ``epochs``: judge each setting over several epochs (:func:`evaluate_epochs`).
    """
    started = time.perf_counter()
    grid = list(settings) if settings is not None else candidate_settings(base, budget)
    run = mapper or map
    evals: list[Evaluation] = []
    for e in run(_Evaluate(base, epochs), grid):
        evals.append(e)
        if progress is not None:
            progress(e)
    choice, met = choose(evals, max_leak)
    s = choice.setting
    chosen = Setting(s.init, s.c, s.mu_z, s.sigma_z, final_t_max(choice, budget))
    return TuneResult(
        evaluations=evals,
        front=pareto(evals),
        choice=choice,
        chosen_setting=chosen,
        meets_target=met,
        max_leak=max_leak,
        budget=budget,
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class _Evaluate:
    """``evaluate`` (``evaluate_epochs`` with a plan) bound to a base config: picklable, for a
    process pool's ``map``."""

    base: RunConfig
    epochs: EpochPlan | None = None

    def __call__(self, setting: Setting) -> Evaluation:
        if self.epochs is not None:
            return evaluate_epochs(self.base, setting, self.epochs)
        return evaluate(self.base, setting)


def run_toml(base: RunConfig, setting: Setting) -> str:
    """The chosen ``run.toml``: the base run with the setting written in (``[run]`` table)."""
    import tomli_w

    data = base.model_dump(mode="json", exclude_none=True, exclude={"record", "trials"})
    data.update(init=setting.init, c=setting.c, mu_z=setting.mu_z, sigma_z=setting.sigma_z)
    data["t_max"] = setting.t_max
    return "# written by nlagg tune\n" + tomli_w.dumps({"run": data})
