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

# The help texts come from nlagg_node.options (plain Python): --help loads neither pydantic nor numpy.
from ..errors import ConfigError, NlaggError, StoppedBySignal
from ..inputs import make_output_dir
from ..options import FORCE_HELP, QUIET_HELP, VERBOSE_HELP

# rich_markup_mode=None: plain help, so text such as "[run]" is printed, not eaten as markup.
app = typer.Typer(
    name="nlagg",
    help="Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
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
    (any other :class:`NlaggError`, e.g. a node that did not finish). A lab module missing from a
    node's install (:data:`~nlagg_node.extras.LAB_MODULES`): exit 2, naming the ``lab`` extra.
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
    except ModuleNotFoundError as exc:  # a lean install (a node's) running a command of the lab
        from ..extras import missing_lab_line

        line = missing_lab_line(exc)
        if line is None:
            raise
        _fail(line, 2)


def _fail(line: str, code: int) -> None:
    print(f"nlagg: error: {line}", file=sys.stderr)
    sys.exit(code)


# Options shared by several commands: one name, one meaning, one help text -------------------------

TRANSCRIPT_HELP = "the eavesdropper's SQLite transcript"


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


ForceOpt = Annotated[bool, typer.Option("--force", help=FORCE_HELP)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help=QUIET_HELP)]


def setup_logging(verbose: bool) -> None:
    """Log to stderr: the protocol's progress with ``--verbose``, warnings otherwise."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
