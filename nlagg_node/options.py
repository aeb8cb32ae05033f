"""Every command-line option of nlagg's run commands, declared once.

Each option is a field of a frozen dataclass: its type, its default, and in :class:`Opt` its help
text, its help panel and its flag. The Typer commands (:func:`nlagg_node.cli.options.command`), the
``nlagg node`` argument vector (:func:`to_argv`), the node files and the plan spec are all built from
these classes, so a flag is written in one place. The values are validated where they are used: run
parameters by :class:`nlagg_node.config.RunConfig` (:meth:`RunOptions.run_config`), the rest by the
command (errors name the field). Plain Python on purpose: ``nlagg --help`` loads no pydantic.

Panels: :data:`RUN`, :data:`GRAPH`, :data:`PROTOCOL`, :data:`STOPPING`, :data:`VALUES`, :data:`ADVERSARY`,
:data:`NETWORK`, :data:`OUTPUT`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from .defaults import DEFAULT_BROKER, OPERATOR_DEFAULTS, RUN_DEFAULTS

if TYPE_CHECKING:
    from .config import RunConfig
    from .valuesource import ValueSource

__all__ = [
    "ADVERSARY",
    "GRAPH",
    "NETWORK",
    "OUTPUT",
    "PROTOCOL",
    "RUN",
    "STOPPING",
    "VALUES",
    "ComposeOptions",
    "CorruptOptions",
    "EavesdropOptions",
    "NodeOptions",
    "Opt",
    "PlanOptions",
    "PlanRunOptions",
    "RunOptions",
    "SimOptions",
    "TestbedOptions",
    "ValueSourceOptions",
    "flag_of",
    "option_fields",
    "to_argv",
]

RUN = "Run"
GRAPH = "Graph"
PROTOCOL = "Protocol"
STOPPING = "Stopping"
VALUES = "Values"
ADVERSARY = "Adversary"
NETWORK = "Network"
OUTPUT = "Output"


@dataclass(frozen=True)
class Opt:
    """How a field appears on the command line.

    ``flags``: the option's declarations (``"--early-stop/--no-early-stop"``, ``"--json"``); empty =
    ``--field-name``. ``argument``: a positional argument (``metavar`` names it). ``argv``: written by
    :func:`to_argv`; ``always``: written even at its default. ``extra``: more ``typer.Option`` keywords.
    """

    help: str
    panel: str | None = None
    flags: tuple[str, ...] = ()
    argument: bool = False
    metavar: str | None = None
    argv: bool = True
    always: bool = False
    extra: tuple[tuple[str, Any], ...] = ()


def _d(field: str) -> str:
    # Options that default to None (so a --config file can set them) state the real default.
    return f" [default: {RUN_DEFAULTS[field]}]"


def op_defaults(key: str) -> str:
    """``max/min: 100; median: 10 ...``: an operator-dependent default, for a help text."""
    seen: dict[object, list[str]] = {}
    for op, d in OPERATOR_DEFAULTS.items():
        seen.setdefault(d[key], []).append(op)
    plain = "; ".join(f"{'/'.join(ops)}: {v:g}" for v, ops in seen.items())
    return plain + " (other defaults with --value-range: see docs/cli.md)"


CORRUPT_HELP = (
    "ids of the corrupted nodes, which forward their state to the adversary: 0 is node 0, 1,4 nodes 1"
    " and 4 (see --corrupt-count for the first K)"
)
CORRUPT_COUNT_HELP = "corrupt the first K nodes (0..K-1), K >= 1; instead of --corrupt"
FORCE_HELP = "let --out replace the files of an earlier run (refused otherwise)"
VERBOSE_HELP = "log the protocol's progress to stderr"
QUIET_HELP = "print only the final result and errors (no progress, notes or warnings)"


# Fields shared by several option classes --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The run parameters every run command takes (sim, testbed, deploy plan/compose)."""

    op: Annotated[
        str | None,
        Opt("max, min, topk, median, quantile, trimmed-mean or average" + _d("op"), PROTOCOL),
    ] = None
    n: Annotated[int | None, Opt("number of nodes" + _d("n"), GRAPH)] = None
    graph: Annotated[
        str | None, Opt("rgg, ring, complete, grid, erdos-renyi, star or file" + _d("graph"), GRAPH)
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
    k: Annotated[int | None, Opt("K for topk and trimmed-mean" + _d("k"), PROTOCOL)] = None
    quantile: Annotated[
        float | None, Opt("quantile level p in (0, 1); 0.75 = 75th percentile" + _d("quantile"), PROTOCOL)
    ] = None
    values: Annotated[
        str | None,
        Opt(
            "private values drawn from: normal, uniform, uniform-range or bimodal"
            " [default: uniform-range with --value-range, else normal]",
            VALUES,
        ),
    ] = None
    value_range: Annotated[
        tuple[float, float] | None,
        Opt("public range LO HI of the values; the protocol runs on (s - LO) / (HI - LO)", VALUES),
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
    tolerance: Annotated[
        float | None,
        Opt(
            "precision of the answer, a fraction of the value range (of the values' units without"
            " --value-range): early stop ends a phase once every x stays within it, and a result is exact"
            " within it of the true aggregate" + _d("tolerance"),
            STOPPING,
        ),
    ] = None

    def run_config(self, config: Path | None = None, **fixed: Any) -> RunConfig:
        """The validated :class:`RunConfig`: ``config`` file, then these options (set ones win), then
        ``fixed``; ``--graph-file`` alone implies ``--graph file``."""
        from .config import RunConfig, load_config

        flags = {f: getattr(self, f) for f in option_fields(type(self)) if f in RunConfig.model_fields}
        if self.graph_file is not None and self.graph is None:
            flags["graph"] = "file"
        return load_config(config, **{**flags, **fixed})


@dataclass(frozen=True, kw_only=True)
class CorruptOptions:
    """Which nodes are corrupted: ids (``--corrupt``) or the first K (``--corrupt-count``)."""

    corrupt: Annotated[str | None, Opt(CORRUPT_HELP, ADVERSARY)] = None
    corrupt_count: Annotated[int | None, Opt(CORRUPT_COUNT_HELP, ADVERSARY)] = None

    def corrupted(self, n: int) -> list[int]:
        """The corrupted ids of an n-node run (:func:`nlagg_node.config.parse_corrupt`)."""
        from .config import parse_corrupt

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

    value: Annotated[float | None, Opt("the private value s_i", VALUES)] = None
    value_file: Annotated[str | None, Opt("file whose first line is s_i", VALUES)] = None
    value_cmd: Annotated[str | None, Opt("shell command printing s_i (e.g. a sensor read)", VALUES)] = None

    def value_source(self) -> ValueSource | None:
        """The declared source, None when none is given; two sources are refused."""
        from .valuesource import source_from_flags

        return source_from_flags(self.value, self.value_file, self.value_cmd)


_CONFIG = Opt("TOML run config ([run] table or top level); flags override it", RUN)
_JSON = Opt("print one JSON object", OUTPUT, ("--json",))
_FORCE = Opt(FORCE_HELP, OUTPUT, ("--force",))
_QUIET = Opt(QUIET_HELP, OUTPUT, ("--quiet", "-q"))
_VERBOSE = Opt(VERBOSE_HELP, OUTPUT, ("--verbose", "-v"))
_DEPART_HELP = "node@iteration,...: {} (docs/protocol.md 'Nodes that leave')"


@dataclass(frozen=True, kw_only=True)
class RunOptions(ModelOptions):
    """The run options of ``sim`` and ``testbed`` (both read a ``--config`` file under them)."""

    init: Annotated[
        str | None,
        Opt(
            "dual initialization: none, dp-gauss, dp-laplace, proposed, symmetric, from-above,"
            " from-below or prior" + _d("init"),
            PROTOCOL,
        ),
    ] = None
    sigma_z: Annotated[float | None, Opt(f"std of z^(0) [default: {op_defaults('sigma_z')}]", PROTOCOL)] = (
        None
    )
    theta: Annotated[
        float | None, Opt("averaging constant in (0, 1]; 1/2 = ADMM" + _d("theta"), PROTOCOL)
    ] = None
    seed: Annotated[
        int | None, Opt("run seed: graph, values and every z^(0) (recorded)" + _d("seed"), RUN)
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
        ),
    ] = None
    config: Annotated[Path | None, _CONFIG] = None

    def load(self, **fixed: Any) -> RunConfig:
        """The run's :class:`RunConfig` (``--config`` under the flags; ``fixed`` over both)."""
        return self.run_config(self.config, **fixed)


@dataclass(frozen=True, kw_only=True)
class SimOptions(RunOptions, CorruptOptions):
    """``nlagg sim``."""

    trials: Annotated[int | None, Opt("Monte Carlo trials" + _d("trials"), RUN)] = None
    sigma_s: Annotated[float | None, Opt("std of the DP baselines' value noise [default: 0.1]", PROTOCOL)] = (
        None
    )
    epsilon: Annotated[
        float | None, Opt("top-K tolerance for identified values [default: 1e-06]", PROTOCOL)
    ] = None
    prior_median: Annotated[float | None, Opt("prior median for --init prior [default: 0.0]", PROTOCOL)] = (
        None
    )
    record: Annotated[
        str | None,
        Opt("iterations to keep: none, all, every:K, log:N or 0,10,100 [default: every:10]", OUTPUT),
    ] = None
    depart: Annotated[
        str | None,
        Opt(_DEPART_HELP.format("these nodes leave for good at those iterations, in every trial"), RUN),
    ] = None
    transcript: Annotated[
        Path | None,
        Opt("also write trial 0 as an eavesdropper transcript (SQLite), for `nlagg attack`", ADVERSARY),
    ] = None
    as_json: Annotated[bool, _JSON] = False
    out: Annotated[
        Path | None, Opt("write summary.json, arrays.npz and manifest.json into this directory", OUTPUT)
    ] = None
    force: Annotated[bool, _FORCE] = False
    quiet: Annotated[bool, _QUIET] = False


@dataclass(frozen=True, kw_only=True)
class TestbedOptions(RunOptions, CorruptOptions):
    """``nlagg testbed``."""

    __test__ = False  # not a pytest class

    run_id: Annotated[str | None, Opt("run id [default: a fresh tb-xxxxxxxx]", NETWORK)] = None
    prefix: Annotated[str, Opt("topic prefix", NETWORK)] = "nlagg"
    broker: Annotated[
        str | None,
        Opt(
            "use this broker, mqtt:// or mqtts://host[:port] [default: a private one on a free port]", NETWORK
        ),
    ] = None
    ca_file: Annotated[
        Path | None, Opt("mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)", NETWORK)
    ] = None
    broker_kind: Annotated[str, Opt("private broker: auto, mosquitto or amqtt", NETWORK)] = "auto"
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
            _DEPART_HELP.format(
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
    force: Annotated[bool, _FORCE] = False
    dashboard: Annotated[
        str | None,
        Opt(
            "serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished run until Ctrl-C",
            OUTPUT,
        ),
    ] = None
    quiet: Annotated[bool, _QUIET] = False
    verbose: Annotated[bool, _VERBOSE] = False


@dataclass(frozen=True, kw_only=True)
class PlanRunOptions(ModelOptions, CorruptOptions, ValueSourceOptions):
    """The run options of ``deploy plan`` and ``deploy compose`` (both write a plan)."""

    run_id: Annotated[str, Opt("run id R (topics P/R/...): 1-64 of [A-Za-z0-9_-]", NETWORK)]
    radius: Annotated[float | None, Opt("rgg connection radius (default: connectivity)", GRAPH)] = None
    seed: Annotated[
        int | None, Opt("run seed for graph and values [default: drawn from OS entropy]", RUN)
    ] = None
    replay: Annotated[bool, Opt("give nodes the run seed so z^(0) replays the simulator (lab only)", RUN)] = (
        False
    )
    prefix: Annotated[str, Opt("topic prefix P", NETWORK)] = "nlagg"
    may_depart: Annotated[
        bool | None,
        Opt(
            "devices may leave for good: the early stop waits n - 1 hops and survives departures; off: the"
            " graph's diameter, and a departure fails the run (docs/protocol.md) [default: on]",
            STOPPING,
            ("--may-depart/--no-may-depart",),
        ),
    ] = None
    value_range: Annotated[
        tuple[float, float] | None,
        Opt("public range LO HI of the values (default: what the --value-cmd sensor declares)", VALUES),
    ] = None
    force: Annotated[bool, _FORCE] = False


@dataclass(frozen=True, kw_only=True)
class PlanOptions(PlanRunOptions):
    """``nlagg deploy plan``."""

    out: Annotated[Path, Opt("directory to write the plan into", OUTPUT)]
    broker: Annotated[
        str | None,
        Opt(
            "broker URL the nodes and the eavesdropper connect to (with --tls: mqtts://127.0.0.1:8883)"
            f" [default: {DEFAULT_BROKER}]",
            NETWORK,
        ),
    ] = None
    listen: Annotated[
        str | None,
        Opt("broker listener: PORT or HOST:PORT (PORT = every address; 1883, with --tls 8883)", NETWORK),
    ] = None
    tls: Annotated[
        bool, Opt("generate a private CA and the broker's certificate; a TLS-only listener", NETWORK)
    ] = False
    require_certificate: Annotated[
        bool, Opt("with --tls: a client certificate per user, required by the broker", NETWORK)
    ] = False
    tls_cafile: Annotated[str | None, Opt("broker TLS: CA certificate (PEM)", NETWORK)] = None
    tls_certfile: Annotated[str | None, Opt("broker TLS: server certificate (PEM)", NETWORK)] = None
    tls_keyfile: Annotated[str | None, Opt("broker TLS: server key (PEM)", NETWORK)] = None
    sites: Annotated[
        int,
        Opt(
            "K site brokers: the graph split into K balanced parts with few cut edges, the brokers"
            " bridged along the cut (docs/cli.md, 'deploy plan')",
            NETWORK,
        ),
    ] = 1
    sites_file: Annotated[
        Path | None, Opt("assign nodes to sites by hand: JSON [[ids of site 0], [site 1], ...]", NETWORK)
    ] = None
    site_broker: Annotated[
        list[str] | None,
        Opt("URL of each site's broker, in site order (default: --broker's host, its port + site)", NETWORK),
    ] = None


@dataclass(frozen=True, kw_only=True)
class ComposeOptions(PlanRunOptions):
    """``nlagg deploy compose``."""

    run_id: Annotated[str, Opt("run id R (topics P/R/...): 1-64 of [A-Za-z0-9_-]", NETWORK)] = "testbed"
    n: Annotated[int | None, Opt("number of nodes", GRAPH)] = 6
    out: Annotated[
        Path | None,
        Opt(
            "write docker-compose.yml, .env and a fresh plan here (default: . ; with --plan: stdout)", OUTPUT
        ),
    ] = None
    plan: Annotated[
        Path | None, Opt("use this existing plan (nlagg deploy plan) instead of a fresh one", RUN)
    ] = None
    plan_dir: Annotated[
        Path, Opt("where the fresh plan goes, relative to --out (gitignored by a .gitignore)", OUTPUT)
    ] = Path("plan")
    compose_dir: Annotated[
        Path | None, Opt("with --plan and no --out: where the printed file will live", OUTPUT)
    ] = None


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    """``nlagg node``: one node of a real run. :func:`to_argv` writes its command line."""

    id: Annotated[int, Opt("this node's id, 0..n-1", flags=("--id",), always=True)]
    config: Annotated[str, Opt("run config (TOML with [run] and optional [network], or JSON)", always=True)]
    value: Annotated[float | None, Opt("the private value s_i", VALUES)] = None
    value_file: Annotated[str | None, Opt("file whose first line is s_i", VALUES)] = None
    value_cmd: Annotated[str | None, Opt("shell command printing s_i (e.g. a sensor read)", VALUES)] = None
    broker: Annotated[str, Opt("broker URL, mqtt://host[:port]", NETWORK, always=True)] = DEFAULT_BROKER
    run_id: Annotated[str | None, Opt("run id (default: [network].run_id of the config)", NETWORK)] = None
    prefix: Annotated[str | None, Opt("topic prefix (default: [network].prefix or nlagg)", NETWORK)] = None
    username: Annotated[str | None, Opt("broker user name", NETWORK)] = None
    password_file: Annotated[str | None, Opt("file holding the broker password", NETWORK)] = None
    neighbour_timeout: Annotated[float, Opt("seconds to wait at a barrier before failing")] = 60.0
    seed: Annotated[
        int | None, Opt("seed of this node's generator rng_for(seed,'node',0,id); OS entropy if unset")
    ] = None
    seed_file: Annotated[str | None, Opt("file whose first line is the seed (keeps it out of ps)")] = None
    state_dir: Annotated[
        str | None, Opt("keep a checkpoint here (before every publish); a restart resumes from it")
    ] = None
    ca_file: Annotated[
        str | None, Opt("mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)", NETWORK)
    ] = None
    cert_file: Annotated[str | None, Opt("mqtts://: client certificate, when the broker asks", NETWORK)] = (
        None
    )
    key_file: Annotated[str | None, Opt("mqtts://: the client certificate's private key", NETWORK)] = None
    leave_after: Annotated[
        int | None, Opt("publish x^(0)..x^(T-1), then leave the run (for tests)", extra=(("min", 1),))
    ] = None
    leave_by: Annotated[
        str,
        Opt(
            "how --leave-after leaves: status (a clean 'leaving') or kill (SIGKILL itself once every"
            " neighbour holds its last x: the last will)"
        ),
    ] = "status"
    as_json: Annotated[bool, Opt("print the result as one JSON object", OUTPUT, ("--json",))] = False
    corrupt: Annotated[
        bool, Opt("forward s_i and the duals to adv/{i}/state (passive adversary)", ADVERSARY, ("--corrupt",))
    ] = False
    value_range: Annotated[
        tuple[float, float] | None,
        Opt("public range LO HI of the values (overrides the config's value_range)", VALUES),
    ] = None
    startup_timeout: Annotated[float, Opt("seconds to wait for the neighbours to come online")] = 120.0
    departure_timeout: Annotated[
        float | None,
        Opt(
            "seconds a neighbour's last will must stay before it counts as departed for good "
            "(docs/protocol.md 'Nodes that leave') [default: 3/4 of --neighbour-timeout]"
        ),
    ] = None
    verbose: Annotated[bool, _VERBOSE] = False


@dataclass(frozen=True, kw_only=True)
class EavesdropOptions:
    """``nlagg eavesdrop``: capture a run. :func:`to_argv` writes its command line."""

    broker: Annotated[
        list[str] | None,
        Opt(
            "broker URL, mqtt://host[:port]; repeat it for every site broker of a run with sites"
            f" (one transcript, each message once) [default: {DEFAULT_BROKER}]",
            NETWORK,
        ),
    ] = None
    run_id: Annotated[str, Opt("the run to capture", NETWORK)]
    transcript: Annotated[
        Path,
        Opt(
            "the eavesdropper's SQLite transcript to write (created, or continued when it holds this run)",
            OUTPUT,
        ),
    ] = Path("transcript.sqlite")
    prefix: Annotated[str, Opt("topic prefix", NETWORK)] = "nlagg"
    username: Annotated[str | None, Opt("broker user name", NETWORK)] = None
    password_file: Annotated[str | None, Opt("file holding the broker password", NETWORK)] = None
    ca_file: Annotated[
        str | None, Opt("mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)", NETWORK)
    ] = None
    cert_file: Annotated[str | None, Opt("mqtts://: client certificate, when the broker asks", NETWORK)] = (
        None
    )
    key_file: Annotated[str | None, Opt("mqtts://: the client certificate's private key", NETWORK)] = None
    events: Annotated[
        bool, Opt("print JSON-line events (for a supervising process)", OUTPUT, ("--events/--no-events",))
    ] = False
    live: Annotated[
        bool | None, Opt("live view (default: when stdout is a terminal)", OUTPUT, ("--live/--no-live",))
    ] = None
    verbose: Annotated[bool, _VERBOSE] = False
    timeout: Annotated[float | None, Opt("stop after this many seconds")] = None
    config: Annotated[
        str | None, Opt("the run's config file, if the retained P/R/config is not published")
    ] = None
    broker_cluster: Annotated[
        bool,
        Opt(
            "the broker is a cluster (RabbitMQ, EMQX, VerneMQ) whose members may forward messages"
            " out of causal order: an x that overtook the x's it was computed from waits for them (5 s)",
            NETWORK,
        ),
    ] = False
    dashboard: Annotated[
        str | None,
        Opt(
            "serve the live dashboard at :PORT or HOST:PORT (loopback unless a host is given);"
            " it keeps serving the finished capture until Ctrl-C",
            OUTPUT,
        ),
    ] = None


# Reading the declarations --------------------------------------------------------------------------


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def option_fields(cls: type) -> dict[str, tuple[Any, Opt, Any]]:
    """``name -> (type, Opt, default)`` of an option class, in declaration order (required: MISSING)."""
    hints = _hints(cls)
    out: dict[str, tuple[Any, Opt, Any]] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        base, *meta = typing.get_args(hint)
        opt = next(m for m in meta if isinstance(m, Opt))
        out[f.name] = (base, opt, f.default)
    return out


def flag_of(name: str, opt: Opt) -> str:
    """The option's first flag: ``--field-name`` unless declared."""
    return opt.flags[0].split("/")[0] if opt.flags else "--" + name.replace("_", "-")


def _words(value: object) -> list[str]:
    if isinstance(value, list | tuple):
        return [w for v in value for w in _words(v)]
    if isinstance(value, float | int) and not isinstance(value, bool):
        return [repr(value)]
    return [str(value)]


def to_argv(opts: object) -> list[str]:
    """The command-line words that give ``opts`` (options at their default are left out).

    The inverse of parsing: ``nlagg <command> *to_argv(opts)`` builds ``opts`` again.
    """
    argv: list[str] = []
    for name, (_, opt, default) in option_fields(type(opts)).items():
        value = getattr(opts, name)
        if not opt.argv or value is None or (value == default and not opt.always):
            continue
        if isinstance(value, bool):
            on, _, off = (opt.flags[0] if opt.flags else "--" + name.replace("_", "-")).partition("/")
            argv.append(on if value else off or "--no-" + on.removeprefix("--"))
        elif isinstance(value, list):
            argv += [w for v in value for w in (flag_of(name, opt), *_words(v))]
        else:
            argv += [flag_of(name, opt), *_words(value)]
    return argv


def replace(opts: Any, **changes: Any) -> Any:
    """A copy of an options object with ``changes``."""
    return dataclasses.replace(opts, **changes)
