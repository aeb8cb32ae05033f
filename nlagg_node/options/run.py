"""The options of the run commands: ``sim``, ``testbed``, and the run parameters ``deploy`` shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from .epochs import EpochOptions
from .opt import (
    ADVERSARY,
    CA_OPT,
    CONFIG_OPT,
    CORRUPT_COUNT_HELP,
    CORRUPT_HELP,
    DEPART_HELP,
    FORCE_OPT,
    GRAPH,
    GRAPHS,
    INITS,
    JSON_OPT,
    NETWORK,
    OPERATORS,
    OUTPUT,
    PROTOCOL,
    QUIET_OPT,
    RUN,
    STOP_RULES,
    STOPPING,
    VALUE_CMD_OPT,
    VALUE_DISTRIBUTIONS,
    VALUE_FILE_OPT,
    VALUE_OPT,
    VALUES,
    VERBOSE_OPT,
    Needs,
    Opt,
    default_of,
    op_defaults,
    option_fields,
    refuse_ignored,
)

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..valuesource import ValueSource

__all__ = [
    "CorruptOptions",
    "ModelOptions",
    "RunOptions",
    "SimOptions",
    "TestbedOptions",
    "ValueSourceOptions",
]


# Fields shared by several option classes --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The run parameters every run command takes (sim, testbed, deploy plan/compose)."""

    op: Annotated[
        str | None,
        Opt(
            "max, min, topk, median, quantile, trimmed-mean or average" + default_of("op"),
            PROTOCOL,
            choices=OPERATORS,
        ),
    ] = None
    n: Annotated[int | None, Opt("number of nodes" + default_of("n"), GRAPH)] = None
    graph: Annotated[
        str | None,
        Opt(
            "rgg, ring, complete, grid, erdos-renyi, star or file" + default_of("graph"),
            GRAPH,
            choices=GRAPHS,
        ),
    ] = None
    graph_file: Annotated[
        Path | None, Opt("edge list (CSV 'i,j' lines or JSON); implies --graph file", GRAPH)
    ] = None
    t_max: Annotated[int | None, Opt(f"iterations per phase [default: {op_defaults('t_max')}]", PROTOCOL)] = (
        None
    )
    c: Annotated[
        float | None,
        Opt(f"PDMM step parameter c > 0, larger = smaller steps [default: {op_defaults('c')}]", PROTOCOL),
    ] = None
    mu_z: Annotated[
        float | None,
        Opt(f"mean offset of z^(0); x starts near mu_z / c [default: {op_defaults('mu_z')}]", PROTOCOL),
    ] = None
    k: Annotated[int | None, Opt("K for topk and trimmed-mean" + default_of("k"), PROTOCOL)] = None
    quantile: Annotated[
        float | None,
        Opt("quantile level p in (0, 1); 0.75 = 75th percentile" + default_of("quantile"), PROTOCOL),
    ] = None
    values: Annotated[
        str | None,
        Opt(
            "private values drawn from: normal, uniform, uniform-range or bimodal"
            " [default: uniform-range with --value-range, else normal]",
            VALUES,
            choices=VALUE_DISTRIBUTIONS,
        ),
    ] = None
    value_range: Annotated[
        tuple[float, float] | None,
        Opt(
            "public range LO HI of the values; the protocol runs on (s - LO) / (HI - LO)",
            VALUES,
            metavar="LO HI",
        ),
    ] = None
    early_stop: Annotated[
        bool | None,
        Opt(
            "end each phase once the network is quiet, t_max a cap (docs/protocol.md); --no-early-stop"
            " runs the paper's fixed schedule [default: on]",
            STOPPING,
            ("--early-stop/--no-early-stop",),
        ),
    ] = None
    may_depart: Annotated[
        bool | None,
        Opt(
            "nodes may leave for good: early stopping then waits n - 1 hops (not the diameter) and a"
            " departure voids a stop it could mislead, so the others go on and stop together"
            " (docs/protocol.md) [default: on with --depart, off otherwise]",
            STOPPING,
            ("--may-depart/--no-may-depart",),
        ),
    ] = None
    stop_window: Annotated[
        int | None,
        Opt(
            "early stop: iterations x must stay within tolerance"
            " [default: 100; 200 for topk, 400 for trimmed-mean]",
            STOPPING,
        ),
    ] = None
    stop_rule: Annotated[
        str | None,
        Opt(
            "early stop: certificate (max, min) ends a phase once the maximizer's pinned x has reached"
            " every node, which outputs it exactly; tolerance waits until every x stays within"
            " --tolerance (docs/protocol.md) [default: certificate for max and min, else tolerance]",
            STOPPING,
            choices=STOP_RULES,
        ),
    ] = None
    tolerance: Annotated[
        float | None,
        Opt(
            "precision of the answer, a fraction of the value range (of the values' units without"
            " --value-range): early stop ends a phase once every x stays within it, and a result is exact"
            " within it of the true aggregate" + default_of("tolerance"),
            STOPPING,
        ),
    ] = None

    def run_config(self, config: Path | None = None, **fixed: Any) -> RunConfig:
        """The validated :class:`RunConfig`: ``config`` file, then these options (set ones win), then
        ``fixed``; ``--graph-file`` alone implies ``--graph file``."""
        from ..config import RunConfig, load_config

        flags = {f: getattr(self, f) for f in option_fields(type(self)) if f in RunConfig.model_fields}
        if self.graph_file is not None and self.graph is None:
            flags["graph"] = "file"
        run = load_config(config, **{**flags, **fixed})
        refuse_ignored(self, run)
        return run


@dataclass(frozen=True, kw_only=True)
class CorruptOptions:
    """Which nodes are corrupted: ids (``--corrupt``) or the first K (``--corrupt-count``)."""

    corrupt: Annotated[str | None, Opt(CORRUPT_HELP, ADVERSARY)] = None
    corrupt_count: Annotated[int | None, Opt(CORRUPT_COUNT_HELP, ADVERSARY)] = None

    def corrupted(self, n: int) -> list[int]:
        """The corrupted ids of an n-node run (:func:`nlagg_node.config.parse_corrupt`)."""
        from ..config import parse_corrupt

        return parse_corrupt(self.corrupt, n, count=self.corrupt_count)

    @property
    def corrupt_field(self) -> tuple[str, object]:
        """The option that named the corrupted set, and its value (for an error)."""
        if self.corrupt_count is not None:
            return "corrupt_count", self.corrupt_count
        return "corrupt", self.corrupt


@dataclass(frozen=True, kw_only=True)
class ValueSourceOptions:
    """One node's private value: a constant, a file or a command (:mod:`nlagg_node.valuesource`)."""

    value: Annotated[float | None, VALUE_OPT] = None
    value_file: Annotated[str | None, VALUE_FILE_OPT] = None
    value_cmd: Annotated[str | None, VALUE_CMD_OPT] = None

    def value_source(self) -> ValueSource | None:
        """The declared source, None when none is given; two sources are refused."""
        from ..valuesource import source_from_flags

        return source_from_flags(self.value, self.value_file, self.value_cmd)


@dataclass(frozen=True, kw_only=True)
class RunOptions(ModelOptions):
    """The run options of ``sim`` and ``testbed`` (both read a ``--config`` file under them)."""

    init: Annotated[
        str | None,
        Opt(
            "dual initialization: none, dp-gauss, dp-laplace, proposed, symmetric, from-above,"
            " from-below or prior" + default_of("init"),
            PROTOCOL,
            choices=INITS,
        ),
    ] = None
    sigma_z: Annotated[float | None, Opt(f"std of z^(0) [default: {op_defaults('sigma_z')}]", PROTOCOL)] = (
        None
    )
    theta: Annotated[
        float | None, Opt("averaging constant in (0, 1]; 1/2 = ADMM" + default_of("theta"), PROTOCOL)
    ] = None
    seed: Annotated[
        int | None, Opt("run seed: graph, values and every z^(0) (recorded)" + default_of("seed"), RUN)
    ] = None
    values_file: Annotated[
        Path | None,
        Opt("private values, CSV or whitespace-separated: one row per trial, or one row for all", VALUES),
    ] = None
    init_channel: Annotated[
        str | None,
        Opt(
            "how z^(0) travel: sealed (encrypted per edge), plain, or auto: sealed for the average"
            " group (average, trimmed mean), plain for the nonlinear operators [default: auto]",
            PROTOCOL,
            choices=("sealed", "plain", "auto"),
        ),
    ] = None
    config: Annotated[Path | None, CONFIG_OPT] = None

    def load(self, **fixed: Any) -> RunConfig:
        """The run's :class:`RunConfig` (``--config`` under the flags; ``fixed`` over both)."""
        return self.run_config(self.config, **fixed)


_EPOCHS = "a multi-epoch run"


@dataclass(frozen=True, kw_only=True)
class SimOptions(RunOptions, CorruptOptions):
    """``nlagg sim``."""

    NEEDS: ClassVar[Needs] = (("drift", "epochs", _EPOCHS), ("cold_start", "epochs", _EPOCHS))
    EXCLUDES: ClassVar[Needs] = tuple(
        (name, "epochs", "sim --epochs does not support it")
        for name in ("depart", "transcript", "out", "corrupt", "corrupt_count")
    )

    trials: Annotated[int | None, Opt("Monte Carlo trials" + default_of("trials"), RUN)] = None
    sigma_s: Annotated[float | None, Opt("std of the DP baselines' value noise [default: 0.1]", PROTOCOL)] = (
        None
    )
    epsilon: Annotated[
        float | None, Opt("top-K tolerance for identified values [default: 1e-06]", PROTOCOL)
    ] = None
    prior_median: Annotated[
        float | None, Opt("where x starts for --init prior [default: where the output is expected]", PROTOCOL)
    ] = None
    record: Annotated[
        str | None,
        Opt("iterations to keep: none, all, every:K, log:N or 0,10,100 [default: every:10]", OUTPUT),
    ] = None
    depart: Annotated[
        str | None,
        Opt(DEPART_HELP.format("these nodes leave for good at those iterations, in every trial"), RUN),
    ] = None
    transcript: Annotated[
        Path | None,
        Opt("also write trial 0 as an eavesdropper transcript (SQLite), for `nlagg attack`", ADVERSARY),
    ] = None
    epochs: Annotated[
        int | None,
        Opt(
            "simulate K epochs of a continuous deployment (same graph, fresh z^(0) each epoch) and report"
            " leakage per epoch and cumulative (docs/epochs.md); --values-file then holds one row per"
            " epoch, or one per epoch per trial",
            RUN,
        ),
    ] = None
    drift: Annotated[
        float | None,
        Opt(
            "with --epochs: the declared drift D, the most a value moves between epochs, a fraction of"
            " --value-range (value units without one); the values walk by steps uniform in [-D, D]"
            " [default: 0]",
            RUN,
        ),
    ] = None
    cold_start: Annotated[
        bool,
        Opt(
            "with --epochs: start every epoch cold, as a single run does (default: max, min, median and"
            " quantile with --init proposed warm-start at the last output)",
            RUN,
            ("--cold-start",),
        ),
    ] = False
    as_json: Annotated[bool, JSON_OPT] = False
    out: Annotated[
        Path | None, Opt("write summary.json, arrays.npz and manifest.json into this directory", OUTPUT)
    ] = None
    force: Annotated[bool, FORCE_OPT] = False
    quiet: Annotated[bool, QUIET_OPT] = False


@dataclass(frozen=True, kw_only=True)
class TestbedOptions(RunOptions, CorruptOptions, EpochOptions):
    """``nlagg testbed``."""

    __test__ = False  # not a pytest class

    NEEDS: ClassVar[Needs] = (("every", "epochs", "a testbed's epochs are counted"),)
    EXCLUDES: ClassVar[Needs] = tuple(
        (name, "every", "a testbed of epochs does not support it")
        for name in ("corrupt", "corrupt_count", "depart", "dashboard", "ca_file")
    )

    run_id: Annotated[str | None, Opt("run id [default: a fresh tb-xxxxxxxx]", NETWORK)] = None
    prefix: Annotated[str, Opt("topic prefix", NETWORK)] = "nlagg"
    broker: Annotated[
        str | None,
        Opt(
            "use this broker, mqtt:// or mqtts://host[:port] [default: a private one on a free port]", NETWORK
        ),
    ] = None
    ca_file: Annotated[Path | None, CA_OPT] = None
    auth: Annotated[
        bool,
        Opt(
            "give every node an Ed25519 identity and authenticate every message, as a deployed plan"
            " does (off by default in the lab; docs/protocol.md 'Signed messages')",
            NETWORK,
            ("--auth/--no-auth",),
        ),
    ] = False
    broker_kind: Annotated[
        str, Opt("private broker: auto, mosquitto or amqtt", NETWORK, choices=("auto", "mosquitto", "amqtt"))
    ] = "auto"
    in_process: Annotated[
        bool | None,
        Opt(
            "host all nodes as tasks on one connection (large n), or one process per node"
            " [default: processes, except on the embedded broker]",
            NETWORK,
            ("--in-process/--processes",),
        ),
    ] = None
    neighbour_timeout: Annotated[float, Opt("seconds a node waits at a barrier", NETWORK)] = 60.0
    depart: Annotated[
        str | None,
        Opt(
            DEPART_HELP.format(
                "SIGKILL these node processes for good at those iterations; the others finish with their"
                " own aggregate"
            ),
            RUN,
        ),
    ] = None
    as_json: Annotated[bool, Opt("print the summary as one JSON object", OUTPUT, ("--json",))] = False
    out: Annotated[
        Path | None,
        Opt(
            "keep transcript.sqlite, summary.json, manifest.json and the nodes' and the"
            " eavesdropper's logs in this directory",
            OUTPUT,
        ),
    ] = None
    force: Annotated[bool, FORCE_OPT] = False
    dashboard: Annotated[
        str | None,
        Opt(
            "serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished run until Ctrl-C",
            OUTPUT,
        ),
    ] = None
    quiet: Annotated[bool, QUIET_OPT] = False
    verbose: Annotated[bool, VERBOSE_OPT] = False
