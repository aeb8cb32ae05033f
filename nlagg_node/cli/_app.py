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


def parse_corrupt(spec: str | None, n: int) -> set[int]:
    """The corrupted set of ``--corrupt``: ``2`` picks 2 nodes (the lowest ids), ``3,7`` names them."""
    if spec is None or spec.strip() == "":
        return set()
    spec = spec.strip()
    try:
        count = int(spec) if "," not in spec else None
        ids = {int(p) for p in spec.split(",") if p.strip()} if count is None else set()
    except ValueError:
        raise ConfigError("corrupt", spec, "use a count (2) or a list of node ids (3,7)") from None
    if count is not None:
        if not 0 <= count < n:
            raise ConfigError("corrupt", spec, f"a count must lie in 0..{n - 1}")
        return set(range(count))
    bad = sorted(i for i in ids if not 0 <= i < n)
    if bad:
        raise ConfigError("corrupt", spec, f"node ids must lie in 0..{n - 1}")
    return ids
