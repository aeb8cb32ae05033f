"""How an option is declared (:class:`Opt`, the help panels, the shared help texts) and read back
(:func:`option_fields`, :func:`to_argv`)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import PurePath
from typing import Any

from ..defaults import OPERATOR_DEFAULTS, OPERATORS, RUN_DEFAULTS

__all__ = [
    "ADVERSARY",
    "EPOCHS",
    "GRAPH",
    "GRAPHS",
    "INITS",
    "NETWORK",
    "ONLY_WITH",
    "OPERATORS",
    "OUTPUT",
    "PANELS",
    "PROTOCOL",
    "RUN",
    "STOPPING",
    "STOP_RULES",
    "VALUES",
    "VALUE_DISTRIBUTIONS",
    "Needs",
    "Opt",
    "flag_of",
    "op_defaults",
    "option_fields",
    "refuse_conflicts",
    "refuse_ignored",
    "to_argv",
]

GRAPHS = ("rgg", "ring", "complete", "grid", "erdos-renyi", "star", "file")
INITS = ("none", "dp-gauss", "dp-laplace", "proposed", "symmetric", "from-above", "from-below", "prior")
STOP_RULES = ("certificate", "tolerance")
VALUE_DISTRIBUTIONS = ("normal", "uniform", "uniform-range", "bimodal")
"""The values of ``--graph``, ``--init``, ``--stop-rule`` and ``--values`` (the shell completes them;
a test keeps them equal to :mod:`nlagg_node.config`'s literals). ``--op``: :data:`OPERATORS`."""

RUN = "Run"
GRAPH = "Graph"
PROTOCOL = "Protocol"
STOPPING = "Stopping"
VALUES = "Values"
ADVERSARY = "Adversary"
NETWORK = "Network"
OUTPUT = "Output"
EPOCHS = "Epochs"
PANELS = (RUN, GRAPH, PROTOCOL, STOPPING, VALUES, ADVERSARY, NETWORK, EPOCHS, OUTPUT)
"""The order the panels are shown in (options without a panel come first)."""


@dataclass(frozen=True)
class Opt:
    """How a field appears on the command line.

    ``flags``: the option's declarations (``"--early-stop/--no-early-stop"``, ``"--json"``); empty =
    ``--field-name`` (``--x/--no-x`` for a bool). ``always``: :func:`to_argv` writes it even at its
    default. ``min``: the least number it takes (the command line refuses less, naming the option).
    ``metavar``: how the help shows its value (default: from the type). ``choices``: the values the
    shell completes (the option's validation stays with its field in :class:`~nlagg_node.config.RunConfig`).
    """

    help: str
    panel: str | None = None
    flags: tuple[str, ...] = ()
    always: bool = False
    min: float | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()


CA_OPT = Opt("mqtts://: CA certificate that verifies the broker (a plan's tls/ca.pem)", NETWORK)
CERT_OPT = Opt("mqtts://: client certificate, when the broker asks", NETWORK)
KEY_OPT = Opt("mqtts://: the client certificate's private key", NETWORK)


# A node's value source (nlagg_node.valuesource); deploy plan/compose give every node the same one.
VALUE_OPT = Opt("the private value s_i (deploy: the same constant on every node)", VALUES)
VALUE_FILE_OPT = Opt("file whose first line is s_i (deploy: each node reads its own copy)", VALUES)
VALUE_CMD_OPT = Opt("shell command printing s_i, e.g. a sensor script (deploy: each node runs it)", VALUES)


def default_of(field: str) -> str:
    # Options that default to None (so a --config file can set them) state the real default.
    return f" [default: {RUN_DEFAULTS[field]}]"


def op_defaults(key: str) -> str:
    """``max/min: 100; median: 10 ...``: an operator-dependent default, for a help text."""
    seen: dict[object, list[str]] = {}
    for op, d in OPERATOR_DEFAULTS.items():
        seen.setdefault(d[key], []).append(op)
    plain = "; ".join(f"{'/'.join(ops)}: {v:g}" for v, ops in seen.items())
    if key in ("t_max", "mu_z"):  # nlagg_node.config.RunConfig.default
        return (
            plain
            + " up to n = 15, more beyond (and other defaults with --value-range: see docs/reference.md)"
        )
    return plain + " (other defaults with --value-range: see docs/cli.md)"


SCHEDULER_HELP = (
    "run the jobs on the Dask scheduler at tcp://HOST:PORT (pip install 'nlagg[dask]'); the results"
    " equal a local run's"
)
CORRUPT_HELP = (
    "ids of the corrupted nodes, which forward their state to the adversary: 0 is node 0, 1,4 nodes 1"
    " and 4 (see --corrupt-count for the first K)"
)
CORRUPT_COUNT_HELP = "corrupt the first K nodes (0..K-1), K >= 1; instead of --corrupt"
FORCE_HELP = "let --out replace the files of an earlier run (refused otherwise)"
VERBOSE_HELP = "log the protocol's progress to stderr"
QUIET_HELP = (
    "print only the final result and errors: no progress or notes (warnings about privacy still print)"
)


CONFIG_OPT = Opt("TOML run config ([run] table or top level); flags override it", RUN)
JSON_OPT = Opt("print one JSON object", OUTPUT, ("--json",))
FORCE_OPT = Opt(FORCE_HELP, OUTPUT, ("--force",))
QUIET_OPT = Opt(QUIET_HELP, OUTPUT, ("--quiet", "-q"))
VERBOSE_OPT = Opt(VERBOSE_HELP, OUTPUT, ("--verbose", "-v"))
DEPART_HELP = "node@iteration,...: {} (docs/protocol.md 'Nodes that leave')"


# Options that contradict each other ---------------------------------------------------------------


def _given(value: object) -> bool:
    return True


_EITHER = "give one of {} and {}"
_NOT_FIXED = "it sets early stopping, which that turns off"
CONFLICTS: tuple[tuple[str, str, Callable[[Any], bool], str], ...] = (
    ("graph", "graph_file", lambda graph: graph != "file", _EITHER.format("--graph", "--graph-file")),
    ("values", "values_file", _given, _EITHER.format("--values", "--values-file")),
    (
        "corrupt",
        "corrupt_count",
        lambda spec: spec.strip() not in ("", "none"),
        _EITHER.format("--corrupt", "--corrupt-count"),
    ),
    ("stop_rule", "early_stop", _given, _NOT_FIXED),
    ("stop_window", "early_stop", _given, _NOT_FIXED),
    ("broker_kind", "broker", lambda kind: kind != "auto", "picks the private broker: not with --broker"),
)
"""``(first, second, whether first's value contradicts a given second, why)``: options that contradict
each other (``second`` given: not None; ``early_stop`` only when False, ``--no-early-stop``).
``--graph file --graph-file F`` says the same thing twice; ``--graph ring --graph-file F`` does not."""


Needs = tuple[tuple[str, str, str], ...]
"""``(option, the option it needs, what that one is)``: an option class's ``NEEDS`` (a class variable),
options that do nothing without another (``sim --drift`` without ``--epochs``); and ``(option, the
option it cannot go with, why)``: its ``EXCLUDES``, options another makes moot (``deploy compose --n 8
--plan P``: the plan sets n)."""

ONLY_WITH: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("k", "op", ("topk", "trimmed-mean")),
    ("quantile", "op", ("quantile",)),
    ("epsilon", "op", ("topk", "trimmed-mean")),
    ("sigma_s", "init", ("dp-gauss", "dp-laplace")),
    ("prior_median", "init", ("prior",)),
    ("radius", "graph", ("rgg",)),
)
"""``(option, the run's setting, the values it applies to)``: options the run would ignore otherwise
(``--k 3`` on a max run), judged on the run's config, where a ``--config`` file may set op and init."""


def _value(opts: object, name: str) -> object:
    """The value of option ``name`` as an error shows it (a path as typed)."""
    value = getattr(opts, name)
    return str(value) if isinstance(value, PurePath) else value


def _is_given(opts: object, name: str) -> bool:
    default = option_fields(type(opts))[name][2]
    return default is dataclasses.MISSING or getattr(opts, name) != default


def _refuse_declared(opts: object) -> None:
    """The ``NEEDS`` and ``EXCLUDES`` of ``opts``'s class and its bases."""
    from ..errors import ConfigError

    fields = option_fields(type(opts))
    for cls in type(opts).__mro__:
        for name, needed, what in vars(cls).get("NEEDS", ()):
            if _is_given(opts, name) and not _is_given(opts, needed):
                why = f"needs {flag_of(needed, fields[needed][1])} ({what})"
                raise ConfigError(name, _value(opts, name), why)
        for name, other, why in vars(cls).get("EXCLUDES", ()):
            if _is_given(opts, name) and _is_given(opts, other):
                flag = flag_of(other, fields[other][1])
                raise ConfigError(name, _value(opts, name), f"not with {flag}: {why}")


def refuse_ignored(opts: object, run: object) -> None:
    """Refuse an option of ``opts`` that ``run`` (its :class:`~nlagg_node.config.RunConfig`) ignores,
    naming the setting it would need (:data:`ONLY_WITH`)."""
    from ..errors import ConfigError

    for name, setting, applies in ONLY_WITH:
        value = getattr(opts, name, None)
        actual = getattr(run, setting)
        if value is not None and actual not in applies:
            only = " or ".join(applies)
            why = f"applies to --{setting} {only} only, and this run's {setting} is {actual!r}"
            raise ConfigError(name, value, why)


def refuse_conflicts(opts: object) -> None:
    """Refuse two options of ``opts`` that contradict each other, naming both (neither wins silently),
    an option given without the one it needs (``NEEDS``) and one another makes moot (``EXCLUDES``)."""
    from ..errors import ConfigError

    _refuse_declared(opts)
    for first, second, contradicts, why in CONFLICTS:
        a, b = getattr(opts, first, None), getattr(opts, second, None)
        given = b is False if second == "early_stop" else b is not None
        if a is not None and given and contradicts(a):
            other = (
                "--no-early-stop" if second == "early_stop" else f"--{second.replace('_', '-')}={str(b)!r}"
            )
            raise ConfigError(first, a, f"contradicts {other}: {why}")


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
        if value is None or (value == default and not opt.always):
            continue
        if isinstance(value, bool):
            on, _, off = (opt.flags[0] if opt.flags else "--" + name.replace("_", "-")).partition("/")
            argv.append(on if value else (off or "--no-" + on.removeprefix("--")))
        elif isinstance(value, list):
            argv += [w for v in value for w in (flag_of(name, opt), *_words(v))]
        else:
            argv += [flag_of(name, opt), *_words(value)]
    return argv
