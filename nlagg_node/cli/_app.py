"""The Typer application and the boundary that turns nlagg errors into exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from ..errors import ConfigError, NlaggError

app = typer.Typer(
    name="nlagg",
    help="Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Print a one-line error naming the field and value, exit 2 (bad input) or 1 (runtime failure)."""
    try:
        yield
    except ConfigError as exc:
        print(f"nlagg: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except NlaggError as exc:
        print(f"nlagg: error: {exc}", file=sys.stderr)
        sys.exit(1)


@app.callback()
def _root() -> None:
    """Private distributed nonlinear aggregation: simulate, run over MQTT, eavesdrop, measure leakage."""
