"""The Typer application, the options every command shares, and the boundary that turns errors into
one line on stderr and an exit code: 2 for bad input (a flag, a file), 1 for a run that failed."""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

# The help texts come from nlagg_node.options (plain Python): --help loads neither pydantic nor numpy.
from ..errors import ConfigError, NlaggError, StoppedBySignal
from ..inputs import make_output_dir
from ..options import FORCE_HELP, QUIET_HELP, VERBOSE_HELP


class NlaggGroup(TyperGroup):
    """The ``nlagg`` group: run as ``app(standalone_mode=False)`` (so a parse error reaches
    :func:`exit_on_error`), a Ctrl-C or SIGTERM still leaves it as standalone Typer leaves it, a
    ``SystemExit(130)`` chained to the interrupt, which :func:`~nlagg_node.lifetime.stop_on_signals`
    reads (non-standalone Typer would return 130 and drop the interrupt's signal)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise SystemExit(130) from exc


# The group's own help is plain, so that `nlagg --help` loads no rich (benchmarks/bench_startup.py);
# every command's is rich, in panels (nlagg_node.cli._command.NlaggCommand).
app = typer.Typer(
    name="nlagg",
    help="Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=NlaggGroup,
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
    _created.clear()  # this command's folders only (tests run several commands in one process)
    try:
        yield
    except (StoppedBySignal, KeyboardInterrupt) as exc:
        from ..lifetime import exit_interrupted

        remove_empty_outputs()
        exit_interrupted(exc)  # one line (the command's clean-up has run) and exit 128 + signal
    except ConfigError as exc:
        _fail(str(exc), 2)
    except typer.TyperException as exc:  # what click and typer refuse while parsing the command line
        _click_error(exc)
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


def _click_error(exc: typer.TyperException) -> None:
    """A command-line error of click or typer in the project's one line (their usage block is the help's)."""
    from typer._click.exceptions import NoArgsIsHelpError  # typer 0.29 vendors click: no public name

    if isinstance(exc, NoArgsIsHelpError):  # ``nlagg deploy``: its help, as in standalone mode
        exc.show()
        sys.exit(exc.exit_code)
    _fail(click_error_line(exc), exc.exit_code)


_CLICK_USAGE = (
    (
        re.compile(r"No such command '(?P<value>[^']*)'\.?(?: Did you mean (?P<near>.*)\?)?$"),
        "command",
        "no such command of {path}{near}",
    ),
    (
        re.compile(r"Got unexpected extra argument\(s\) \((?P<value>.*)\)$"),
        "argument",
        "{path} does not take it",
    ),
    (re.compile(r"Option '(?P<value>[^']*)' requires an argument\.?$"), "option", "needs a value"),
    (
        re.compile(r"Option '(?P<value>[^']*)' requires (?P<n>\d+) arguments\.?$"),
        "option",
        "takes {n} values{metavar}",
    ),
    (
        re.compile(r"Option '(?P<value>[^']*)' does not take a value\.?$"),
        "option",
        "is a switch: it takes no value",
    ),
)
"""Click's usage errors that name no parameter: ``(its message, what the value is, why)``."""


def _metavar(ctx: Any, flag: str) -> str:
    """`` (LO HI)``: how the help shows the values of option ``flag`` of ``ctx``'s command, if declared."""
    params = ctx.command.params if ctx is not None else []
    declared = [p.metavar for p in params if flag in getattr(p, "opts", ()) and p.metavar]
    return f" ({declared[0]})" if declared else ""


def _command_words(ctx: Any) -> str:
    """``nlagg deploy plan``: the command of ``ctx`` as typed (whatever the program's name: python -m)."""
    words = []
    while ctx is not None and ctx.parent is not None:
        words.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["nlagg", *reversed(words)])


def _usage_line(message: str, ctx: Any) -> str:
    """A usage error of click in the one-line style (``command='nosuch': no such command of nlagg``)."""
    path = _command_words(ctx)
    for pattern, what, why in _CLICK_USAGE:
        if (m := pattern.match(message)) is not None:
            given = m.groupdict()
            near = f" (did you mean {given['near']}?)" if given.get("near") else ""
            shown = _metavar(ctx, m["value"])
            return f"{what}={m['value']!r}: " + why.format(
                path=path, n=given.get("n"), metavar=shown, near=near
            )
    return message[:1].lower() + message[1:].rstrip(".")


def click_error_line(exc: typer.TyperException) -> str:
    """``FIELD=VALUE: why`` for a bad value of an option or argument, else click's message.

    The value is the one typed (pydantic's validation error, which typer raises from, holds it).
    """
    from typer._click.exceptions import MissingParameter

    param = getattr(exc, "param", None)
    if param is None or param.name is None:
        ctx = getattr(exc, "ctx", None)
        where = f" of {_command_words(ctx)}"
        option = getattr(exc, "option_name", None)
        if option is not None and "no such option" in exc.format_message().lower():
            return f"option={option!r}: no such option{where}" + _possible(exc)
        return _usage_line(exc.format_message(), ctx)
    argument = param.param_type_name == "argument"  # given by position: named as the usage line shows it
    flag = (param.metavar or param.name.upper()) if argument else param.opts[0]
    if isinstance(exc, MissingParameter):
        return f"{param.name}: missing; give {flag}"
    from pydantic import ValidationError  # loaded by typer already, to parse the value

    from ..config import pydantic_reason

    cause = exc.__cause__
    errors = cause.errors() if isinstance(cause, ValidationError) else []
    if not errors:
        return f"{param.name}: {exc.message}"
    first = errors[0]
    value = first.get("input")
    why = pydantic_reason(first) or exc.message
    if isinstance(value, str) and value.startswith("-") and param.nargs > 1:
        metavar = param.metavar or param.name.upper()
        why = f"takes {param.nargs} values ({metavar}), and {value} is the next option: give them before it"
    return f"{param.name}={value!r}: {why}"


def _possible(exc: typer.TyperException) -> str:
    near = sorted(getattr(exc, "possibilities", None) or ())
    return f" (did you mean {', '.join(near)}?)" if near else ""


def _fail(line: str, code: int) -> None:
    remove_empty_outputs()
    print(f"nlagg: error: {line}", file=sys.stderr)
    sys.exit(code)


_created: list[Path] = []
"""The output folders this command created (parents first): a failed command removes those it left empty."""


def remove_empty_outputs() -> None:
    """Remove the folders :func:`claim_out` created and nothing was written into (deepest first)."""
    while _created:
        try:
            _created.pop().rmdir()
        except FileNotFoundError:  # the command failed before it made this one
            continue
        except OSError:  # something was written there (partial results): it stays, and so do its parents
            _created.clear()


def may_create(folder: Path) -> None:
    """A folder the command makes later if it gets that far (a node's ``--state-dir``): a failed
    command removes it, and its parents it made, if nothing was written there."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    _created.extend(reversed(missing))


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
    missing = [p for p in (out, *out.parents) if not p.exists()]
    make_output_dir(out, field)
    _created.extend(reversed(missing))


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
