"""Run configuration: one pydantic model shared by the simulator, the testbed and the nodes.

Loaded from TOML (``--config run.toml``) with command-line flags layered on top.
Validation errors are turned into :class:`~nlagg_node.errors.ConfigError` naming the
field and the value received.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .defaults import DEFAULT_BROKER as DEFAULT_BROKER
from .defaults import NORMALIZED_DEFAULTS as NORMALIZED_DEFAULTS
from .defaults import OPERATOR_DEFAULTS as OPERATOR_DEFAULTS
from .defaults import OPERATORS as OPERATORS
from .defaults import PROPOSED_INIT as PROPOSED_INIT
from .defaults import START_RISK, STOP_WINDOW, T_MAX_GROWTH
from .errors import ConfigError
from .graphs import GraphKind, GraphSpec
from .inputs import parse_document, read_input_text
from .limits import MAX_ITERATIONS, MAX_NODE_ITERATIONS, MAX_NODES, MAX_T_MAX
from .pdmm import order_of
from .termination import CERTIFYING_OPERATORS, certifies
from .threat import InitChannel

Operator = Literal["max", "min", "topk", "median", "quantile", "trimmed-mean", "average"]
InitName = Literal[
    "none", "dp-gauss", "dp-laplace", "proposed", "symmetric", "from-above", "from-below", "prior"
]
ValueDist = Literal["normal", "uniform", "bimodal", "uniform-range"]
StopRule = Literal["certificate", "tolerance"]


class RunConfig(BaseModel):
    """Everything that defines a run, public and private parts alike.

    ``t_max`` is the number of iterations of one phase; top-K runs ``k`` phases
    and the trimmed mean ``2k + 1`` (see :mod:`nlagg_node.schedule`).
    ``None`` for ``c``, ``mu_z`` or ``t_max`` means the operator's default.
    With ``early_stop`` (the default) a phase ends at the first iteration where the network is
    detected quiet (every x within ``tolerance`` of its value ``stop_window`` iterations earlier,
    see :mod:`nlagg_node.termination`); ``t_max`` is then a cap. ``early_stop=False`` runs the
    paper's fixed schedule (its figures). ``stop_rule`` ``certificate`` (max and min's default) ends
    a phase once the maximizer's pinned x has reached every node instead, and each node outputs
    that value exactly (:mod:`nlagg_node.termination`, "the certified stop"). ``may_depart`` makes
    early stopping survive nodes that leave for good: the stop waits ``n - 1`` hops in place of the
    graph's diameter, and a departure voids a stop it could have misled (docs/protocol.md).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Operator = "max"
    n: int = Field(15, ge=2, le=MAX_NODES)
    graph: GraphKind = "rgg"
    radius: float | None = Field(None, gt=0)
    edge_probability: float | None = Field(None, gt=0, le=1)
    graph_file: Path | None = None
    trials: int = Field(1000, ge=1)
    t_max: int | None = Field(None, ge=1, le=MAX_T_MAX)
    c: float | None = Field(None, gt=0)
    theta: float = Field(0.5, gt=0, le=1)
    init: InitName = "proposed"
    mu_z: float | None = None
    sigma_z: float | None = Field(None, ge=0)
    sigma_s: float = Field(0.1, ge=0)
    k: int = Field(3, ge=1, le=MAX_NODES)
    quantile: float = Field(0.5, gt=0, lt=1)
    epsilon: float = Field(1e-6, ge=0)
    prior_median: float | None = None
    avg_c: float = Field(1.0, gt=0)
    avg_sigma_z: float = Field(100.0, ge=0)
    avg_t_max: int = Field(400, ge=1, le=MAX_T_MAX)
    values: ValueDist | None = None
    values_file: Path | None = None
    value_range: tuple[float, float] | None = None
    seed: int = Field(0, ge=0)
    record: str = "every:10"
    tolerance: float = Field(1e-9, gt=0)
    early_stop: bool = True
    stop_window: int | None = Field(None, ge=1, le=MAX_T_MAX)
    stop_rule: StopRule | None = None
    may_depart: bool = False
    init_channel: InitChannel = "auto"

    @field_validator(
        "c",
        "mu_z",
        "theta",
        "sigma_z",
        "sigma_s",
        "quantile",
        "epsilon",
        "prior_median",
        "radius",
        "tolerance",
    )
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("record")
    @classmethod
    def _record_spec(cls, value: str) -> str:
        parse_record_spec(value, 10)  # raises ValueError on a bad spec
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.op == "topk" and self.k >= self.n:
            raise ValueError(f"k={self.k}: must be smaller than n={self.n} for topk")
        if self.op == "trimmed-mean" and 2 * self.k >= self.n:
            raise ValueError(f"k={self.k}: trims 2k >= n={self.n} values for trimmed-mean")
        if self.stop_rule == "certificate" and self.op not in CERTIFYING_OPERATORS:
            raise ValueError(
                f"stop_rule='certificate': only {' and '.join(CERTIFYING_OPERATORS)} certify their output"
                f" (op={self.op!r}); use stop_rule='tolerance'"
            )
        if self.graph == "file" and self.graph_file is None:
            raise ValueError("graph=file: give the edge list with --graph-file (or graph_file in the config)")
        total = self.t_total
        if total > MAX_ITERATIONS:
            raise ValueError(
                f"t_max={self.t_max_value}: the run would take {total} iterations (at most {MAX_ITERATIONS})"
            )
        if self.n * total > MAX_NODE_ITERATIONS:
            raise ValueError(
                f"n={self.n}: n times the {total} iterations of the run exceeds {MAX_NODE_ITERATIONS}"
            )
        if self.value_range is not None:
            lo, hi = self.value_range
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise ValueError(f"value_range={[lo, hi]}: needs two finite numbers LO < HI")
        if self.values == "uniform-range" and self.value_range is None:
            raise ValueError("values='uniform-range': needs value_range = [LO, HI]")
        return self

    # Resolved parameters --------------------------------------------------------------
    def default(self, key: str) -> float | int:
        """The operator's default for ``key`` (calibrated for [0, 1] when a value range is declared).

        Calibrated at n = 15; beyond, t_max grows as ``(n / 15)^(1/3)`` (:data:`T_MAX_GROWTH`), and
        without a range mu_z grows so that the start mu_z / c stays above the largest of n N(0, 1)
        values (:func:`start_height`).
        """
        table = (NORMALIZED_DEFAULTS if self.value_range is not None else OPERATOR_DEFAULTS)[self.op]
        if key == "t_max":
            return self._grown_t_max(int(table["t_max"]))
        if key == "mu_z" and table["mu_z"] > 0 and self.value_range is None:
            return table["c"] * max(table["mu_z"] / table["c"], start_height(self.n))
        return table[key]

    def _grown_t_max(self, calibrated: int) -> int:
        """``calibrated`` grown as ``(n / 15)^(1/3)``, rounded up to 100, within the run's limit on n times
        its iterations (:data:`~nlagg_node.limits.MAX_NODE_ITERATIONS`)."""
        growth = max(1.0, (self.n / 15.0) ** T_MAX_GROWTH)
        grown: int = math.ceil(calibrated * growth / 100.0 - 1e-9) * 100
        phases = {"topk": self.k, "trimmed-mean": 2 * self.k}.get(self.op, 1)
        average = self.avg_t_max if self.op == "trimmed-mean" else 0
        room = (MAX_NODE_ITERATIONS // self.n - average) // phases // 100 * 100
        return max(calibrated, min(grown, room))

    @property
    def c_value(self) -> float:
        return float(self.c if self.c is not None else self.default("c"))

    @property
    def mu_z_value(self) -> float:
        return float(self.mu_z if self.mu_z is not None else self.default("mu_z"))

    @property
    def sigma_z_value(self) -> float:
        return float(self.sigma_z if self.sigma_z is not None else self.default("sigma_z"))

    @property
    def t_max_value(self) -> int:
        return int(self.t_max if self.t_max is not None else self.default("t_max"))

    @property
    def certified(self) -> bool:
        """Whether the run's phases end on the certified stop (:func:`nlagg_node.termination.certifies`)."""
        return certifies(self.op, self.early_stop, self.stop_rule)

    @property
    def stop_rule_value(self) -> StopRule:
        """The stop rule in effect: ``certificate`` or ``tolerance`` (also without early stopping)."""
        return "certificate" if self.certified else "tolerance"

    @property
    def stop_window_value(self) -> int:
        """Early stopping's window W: ``stop_window``, or the operator's (:data:`STOP_WINDOW`)."""
        return int(self.stop_window if self.stop_window is not None else STOP_WINDOW[self.op])

    @property
    def values_value(self) -> str:
        """The value distribution: ``uniform-range`` when a range is declared, else ``normal``."""
        if self.values is not None:
            return self.values
        return "uniform-range" if self.value_range is not None else "normal"

    @property
    def level(self) -> float:
        """The conventional quantile level of the output: ``quantile`` for the quantile, else 1/2."""
        return self.quantile if self.op == "quantile" else 0.5

    @property
    def prior_median_value(self) -> float:
        """The public prior in the user's units where x starts for ``--init prior``.

        By default where the prior puts the value the run outputs, the ``k``-th smallest of ``n``
        (:func:`~nlagg_node.pdmm.order_of`): its level ``(k - 1/2) / n`` of the range, ``lo + level
        (hi - lo)``, or of N(0, 1) (the values' default source) without a range. For the median of an
        odd n that is the midpoint (0 without a range); for an even n it lies half a value's share
        below it, at the lower middle value the run outputs, which keeps the transient off the upper
        middle value as an odd n's start keeps it off the median's neighbours (benchmarks/RESULTS.md,
        "the median at even n").
        """
        if self.prior_median is not None:
            return float(self.prior_median)
        level = (order_of(self.n, self.level) - 0.5) / self.n
        if self.value_range is None:
            return NormalDist().inv_cdf(level)
        return self.value_range[0] + level * (self.value_range[1] - self.value_range[0])

    @property
    def t_total(self) -> int:
        """Iterations of the whole run: ``t_max`` per phase (``avg_t_max`` for the average part)."""
        t = self.t_max_value
        if self.op == "topk":
            return self.k * t
        if self.op == "trimmed-mean":
            return 2 * self.k * t + self.avg_t_max
        return t

    def resolved(self) -> RunConfig:
        """A copy with the operator defaults written in (what a manifest records)."""
        return self.model_copy(
            update={
                "c": self.c_value,
                "mu_z": self.mu_z_value,
                "sigma_z": self.sigma_z_value,
                "t_max": self.t_max_value,
                "values": self.values_value,
                "prior_median": self.prior_median_value,
                "stop_window": self.stop_window_value,
                "stop_rule": self.stop_rule_value,
            }
        )

    def graph_spec(self) -> GraphSpec:
        return GraphSpec(
            kind=self.graph, n=self.n, radius=self.radius, p=self.edge_probability, path=self.graph_file
        )


def start_height(n: int) -> float:
    """The level the largest of n N(0, 1) values exceeds with probability ``START_RISK / n``, rounded
    up to 0.01.

    The default one-sided start without a value range is the larger of this and the calibrated 3
    (:data:`nlagg_node.defaults.START_RISK`): 3 up to n = 15, 3.67 at n = 50, 4.01 at 100, 4.33 at
    200, 4.99 at 1000.
    """
    from statistics import NormalDist

    return math.ceil(100.0 * NormalDist().inv_cdf((1.0 - START_RISK / n) ** (1.0 / n))) / 100.0


def parse_corrupt(spec: str | None, n: int, *, count: int | None = None) -> list[int]:
    """The corrupted nodes of ``--corrupt`` / ``--corrupt-count``, one meaning for every command.

    ``spec`` lists ids: ``"0"`` is node 0, ``"1,4"`` nodes 1 and 4 (``None``, ``""`` or ``"none"``:
    nobody). ``count`` K >= 1 is the first K nodes, 0..K-1 (private values are drawn independently of
    the id, so which ids is immaterial). Give one of the two. At least one node must stay honest.
    """
    if count is not None:
        if spec is not None and spec.strip() not in ("", "none"):
            raise ConfigError("corrupt_count", count, "give --corrupt (ids) or --corrupt-count, not both")
        if count < 1:
            raise ConfigError(
                "corrupt_count", count, "must be at least 1 (leave it out for no corrupted node)"
            )
        if count >= n:
            raise ConfigError("corrupt_count", count, f"must lie in 1..{n - 1} (one node stays honest)")
        return list(range(count))
    if spec is None or spec.strip() in ("", "none"):
        return []
    try:
        listed = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        why = "use node ids (0 is node 0; 1,4 are nodes 1 and 4), or --corrupt-count K for the first K"
        raise ConfigError("corrupt", spec, why) from None
    ids = sorted(set(listed))
    twice = sorted({i for i in listed if listed.count(i) > 1})
    if twice:
        raise ConfigError("corrupt", spec, f"lists node {twice[0]} twice: name each corrupted node once")
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise ConfigError("corrupt", spec, f"node ids must lie in 0..{n - 1}")
    if len(ids) >= n:
        raise ConfigError("corrupt", spec, "at least one node must stay honest")
    return ids


def parse_record_spec(spec: str, t_total: int) -> list[int]:
    """Iterations whose x is kept: ``none``, ``all``, ``every:K``, ``log:N`` or ``0,10,100``."""
    spec = spec.strip()
    if spec == "none":
        return []
    if spec == "all":
        return list(range(t_total))
    kind, _, arg = spec.partition(":")
    try:
        if kind == "every" and int(arg) >= 1:
            return list(range(0, t_total, int(arg)))
        if kind == "log" and int(arg) >= 1:
            import numpy as np

            pts = np.unique(np.geomspace(1, max(t_total, 1), int(arg)).astype(int) - 1)
            return [int(p) for p in pts if p < t_total]
        if not arg and all(part.strip().isdigit() for part in spec.split(",")):
            return sorted({int(p) for p in spec.split(",") if int(p) < t_total})
    except ValueError:
        pass
    raise ValueError(f"record spec {spec!r}: use none, all, every:K, log:N or a list like 0,10,100")


CONFIG_SUFFIXES = (".toml", ".json")


def load_config(path: Path | None = None, **overrides: Any) -> RunConfig:
    """Build a :class:`RunConfig` from a TOML or manifest JSON file (optional) and overrides (flags win).

    Overrides equal to ``None`` are ignored, so unset command-line flags keep the
    file's value or the default.
    """
    data: dict[str, Any] = {}
    if path is not None:
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml", ".ini", ".cfg"):
            raise ConfigError("config", str(path), "use a TOML (.toml) or JSON (.json) file")
        text = read_input_text(path, "config")
        if not text.strip():
            raise ConfigError("config", str(path), "is empty (it sets nothing; leave --config out)")
        doc = parse_document(text, "JSON" if suffix == ".json" else "TOML", "config", path)
        # A run.toml may hold a [run] table; a manifest.json holds {"config": {...}}.
        table = doc.get("run", doc.get("config", doc)) if isinstance(doc, dict) else None
        if not isinstance(table, dict):
            raise ConfigError("config", str(path), "expected a table of run settings (keys as the flags)")
        data.update(table)
        if isinstance(data.get("graph_file"), str) and not Path(data["graph_file"]).is_absolute():
            # A graph file named in a config file is relative to that file, not to the cwd.
            data["graph_file"] = str(path.parent / data["graph_file"])
    from_file = set(data)
    flags = {k.replace("-", "_"): v for k, v in overrides.items() if v is not None}
    data.update(flags)
    try:
        return validate_config(data)
    except ConfigError as exc:
        if path is None or exc.field.split(".")[0] not in from_file - set(flags):
            raise
        raise ConfigError(exc.field, exc.value, f"{exc.reason} (in {path})") from None


def _literal(shown: str) -> Any:
    """The value a cross-field message shows as ``repr`` (``'uniform-range'``, ``[5.0, 1.0]``), so the
    error does not quote it twice; the text itself when it is not a Python literal."""
    try:
        return ast.literal_eval(shown)
    except (ValueError, SyntaxError):
        return shown


_PYDANTIC_WHY = {
    "int_parsing": "expected an integer",
    "float_parsing": "expected a number",
    "bool_parsing": "expected true or false",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
}


def pydantic_reason(error: Any) -> str:
    """One of pydantic's errors (an item of ``ValidationError.errors()``) as the reason of a one-line
    error: ``must be at least 2``, not ``Input should be greater than or equal to 2``."""
    why = _PYDANTIC_WHY.get(error.get("type", ""))
    if why is not None:
        return why.format(**error.get("ctx", {}))
    msg = str(error.get("msg", "")).removeprefix("Value error, ").replace("Input should be", "must be", 1)
    return msg[:1].lower() + msg[1:]


def validate_config(data: dict[str, Any]) -> RunConfig:
    """Validate a mapping, turning pydantic's report into a one-line :class:`ConfigError`."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        value = err.get("input")
        msg = pydantic_reason(err) if err["loc"] else err["msg"].removeprefix("Value error, ")
        if not err["loc"]:
            # Cross-field checks phrase their message as "field=value: reason".
            head, _, reason = msg.partition(": ")
            loc, _, shown = head.partition("=")
            value = _literal(shown)
            msg = reason
        raise ConfigError(loc, value, msg) from None
