"""The Typer application, the options every command shares, and the boundary that turns errors into
one line on stderr and an exit code: 2 for bad input (a flag, a file), 1 for a run that failed."""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

# The help texts come from nlagg_node.defaults (plain Python): --help loads neither pydantic nor numpy.
from ..defaults import OPERATOR_DEFAULTS, RUN_DEFAULTS
from ..errors import ConfigError, NlaggError, StoppedBySignal
from ..inputs import make_output_dir

# rich_markup_mode=None: plain help, so text such as "[run]" is printed, not eaten as markup.
app = typer.Typer(
    name="nlagg",
    help="Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nlagg")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"nlagg {_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage."""


def _os_error_line(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Print one line naming the field (or the file) and the value, never a traceback.

    Exit 2 for bad input: a :class:`ConfigError`, a file that cannot be read (``OSError``), is not
    UTF-8 text or is not the SQLite file it should be. Exit 1 for a run that failed
    (any other :class:`NlaggError`, e.g. a node that did not finish).
    """
    try:
        yield
    except (StoppedBySignal, KeyboardInterrupt) as exc:
        from ..lifetime import exit_interrupted

        exit_interrupted(exc)  # one line (the command's clean-up has run) and exit 128 + signal
    except ConfigError as exc:
        _fail(str(exc), 2)
    except NlaggError as exc:
        _fail(str(exc), 1)
    except OSError as exc:
        _fail(_os_error_line(exc), 2)
    except UnicodeDecodeError as exc:
        _fail(f"input is not UTF-8 text ({exc.reason} at byte {exc.start})", 2)
    except sqlite3.Error as exc:
        _fail(f"SQLite: {exc}", 2)


def _fail(line: str, code: int) -> None:
    print(f"nlagg: error: {line}", file=sys.stderr)
    sys.exit(code)


# Options shared by several commands: one name, one meaning, one help text -------------------------


def op_defaults(key: str) -> str:
    """``max 100, median 10, ...``: an operator-dependent default, for a help text."""
    seen: dict[object, list[str]] = {}
    for op, d in OPERATOR_DEFAULTS.items():
        seen.setdefault(d[key], []).append(op)
    plain = "; ".join(f"{'/'.join(ops)}: {v:g}" for v, ops in seen.items())
    return plain + " (other defaults with --value-range: see README)"


CORRUPT_HELP = (
    "corrupted nodes, which forward their state to the adversary: a count (2 = nodes 0 and 1)"
    " or a list of ids (3,7)"
)
TRANSCRIPT_HELP = "the eavesdropper's SQLite transcript"
VERBOSE_HELP = "log the protocol's progress to stderr"
FORCE_HELP = "let --out replace the files of an earlier run (refused otherwise)"


def parse_corrupt(spec: str | None, n: int) -> set[int]:
    """The corrupted set of ``--corrupt`` (see :func:`nlagg_node.config.parse_corrupt`)."""
    from ..config import parse_corrupt as _parse_corrupt

    return set(_parse_corrupt(spec, n))


def claim_out(out: Path, names: Iterable[str], *, force: bool, field: str = "out") -> None:
    """The one ``--out`` rule: write into ``out`` (created if missing), never over an earlier run.

    ``names`` are the files (glob patterns) the command writes there. If any exists the command
    stops with exit 2 naming it, unless ``force``, which deletes them first.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(field, str(out), "exists and is not a directory")
    if out.is_dir():
        existing = sorted({p for name in names for p in out.glob(name) if p.is_file()})
        if existing and not force:
            held = existing[0].name
            why = f"already holds {held} of an earlier run; pass --force to replace"
            raise ConfigError(field, str(out), why)
        for p in existing:
            p.unlink()
    make_output_dir(out, field)


def claim_file(path: Path, *, force: bool, field: str) -> None:
    """The same rule for a single output file (a transcript: its -wal/-shm go with it)."""
    if path.is_dir():
        raise ConfigError(field, str(path), "is a directory; give a file name")
    if path.exists():
        if not force:
            raise ConfigError(field, str(path), "already exists; pass --force to replace it")
        for extra in ("", "-wal", "-shm", "-journal"):
            Path(str(path) + extra).unlink(missing_ok=True)


def _d(field: str) -> str:
    # Options that default to None (so a --config file can set them) state the real default.
    return f" [default: {RUN_DEFAULTS[field]}]"


OpOpt = Annotated[
    str | None,
    typer.Option(help="max, min, topk, median, quantile, trimmed-mean or average" + _d("op")),
]
NOpt = Annotated[int | None, typer.Option(help="number of nodes" + _d("n"))]
GraphOpt = Annotated[
    str | None,
    typer.Option(help="rgg, ring, complete, grid, erdos-renyi, star or file" + _d("graph")),
]
GraphFileOpt = Annotated[
    Path | None, typer.Option(help="edge list (CSV 'i,j' lines or JSON); implies --graph file")
]
TrialsOpt = Annotated[int | None, typer.Option(help="Monte Carlo trials" + _d("trials"))]
EarlyStopOpt = Annotated[
    bool | None,
    typer.Option(
        "--early-stop/--no-early-stop",
        help="end each phase once the network is quiet, t_max a cap (docs/protocol.md); --no-early-stop"
        " runs the paper's fixed schedule [default: on]",
    ),
]
MayDepartOpt = Annotated[
    bool | None,
    typer.Option(
        "--may-depart/--no-may-depart",
        help="nodes may leave for good: early stopping then waits n - 1 hops (not the diameter) and a"
        " departure voids a stop it could mislead, so the others go on and stop together (docs/protocol.md)"
        " [default: on with --depart, off otherwise]",
    ),
]
InitChannelOpt = Annotated[
    str | None,
    typer.Option(
        help="how z^(0) travel: sealed (encrypted per edge), plain, or auto: sealed for the average"
        " group (average, trimmed mean), plain for the nonlinear operators [default: auto]",
    ),
]
StopWindowOpt = Annotated[
    int | None,
    typer.Option(
        help="early stop: iterations x must stay within tolerance"
        " [default: 100; 200 for topk, 400 for trimmed-mean]"
    ),
]
ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        help="precision of the answer, a fraction of the value range (of the values' units without"
        " --value-range): early stop ends a phase once every x stays within it, and a result is exact"
        " within it of the true aggregate" + _d("tolerance"),
    ),
]
TMaxOpt = Annotated[int | None, typer.Option(help=f"iterations per phase [default: {op_defaults('t_max')}]")]
COpt = Annotated[
    float | None,
    typer.Option(help=f"PDMM step parameter c > 0, larger = smaller steps [default: {op_defaults('c')}]"),
]
MuZOpt = Annotated[
    float | None,
    typer.Option(help=f"mean offset of z^(0); x starts near mu_z / c [default: {op_defaults('mu_z')}]"),
]
SigmaZOpt = Annotated[float | None, typer.Option(help=f"std of z^(0) [default: {op_defaults('sigma_z')}]")]
InitOpt = Annotated[
    str | None,
    typer.Option(
        help="dual initialization: none, dp-gauss, dp-laplace, proposed, symmetric, from-above,"
        " from-below or prior" + _d("init")
    ),
]
SeedOpt = Annotated[
    int | None, typer.Option(help="run seed: graph, values and every z^(0) (recorded)" + _d("seed"))
]
KOpt = Annotated[int | None, typer.Option(help="K for topk and trimmed-mean" + _d("k"))]
QuantileOpt = Annotated[
    float | None,
    typer.Option(help="quantile level p in (0, 1); 0.75 = 75th percentile" + _d("quantile")),
]
ThetaOpt = Annotated[
    float | None, typer.Option(help="averaging constant in (0, 1]; 1/2 = ADMM" + _d("theta"))
]
ValuesOpt = Annotated[
    str | None,
    typer.Option(
        help="private values drawn from: normal, uniform, uniform-range or bimodal"
        " [default: uniform-range with --value-range, else normal]"
    ),
]
ValueRangeOpt = Annotated[
    tuple[float, float] | None,
    typer.Option(help="public range LO HI of the values; the protocol runs on (s - LO) / (HI - LO)"),
]
ValuesFileOpt = Annotated[
    Path | None,
    typer.Option(help="private values, CSV or whitespace-separated: one row per trial, or one row for all"),
]
ConfigOpt = Annotated[
    Path | None, typer.Option(help="TOML run config ([run] table or top level); flags override it")
]
CorruptOpt = Annotated[str | None, typer.Option(help=CORRUPT_HELP)]
ForceOpt = Annotated[bool, typer.Option("--force", help=FORCE_HELP)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)]
BrokerOpt = Annotated[str, typer.Option(help="broker URL, mqtt://host[:port]")]


def setup_logging(verbose: bool) -> None:
    """Log to stderr: the protocol's progress with ``--verbose``, warnings otherwise."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
