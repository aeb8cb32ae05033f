"""The command lines of nlagg's long-running parts, ``nlagg node`` and ``nlagg eavesdrop``, built once.

Everything that starts them uses these builders: the lab testbed (:mod:`nlagg_node.lab`), the fault
harness (``tests/harness/faults.py``), ``nlagg deploy plan`` (``commands.txt``, the compose file) and
``nlagg deploy node``. An option left at ``None`` (or ``False``) is not written, so the command's own
default applies. Passwords never appear here: only the path of the file that holds one.

>>> " ".join(node_argv(3, "run.toml", "mqtt://pi:1883", value=1.5, corrupt=True))
'nlagg node --id 3 --config run.toml --value 1.5 --broker mqtt://pi:1883 --corrupt'
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["NLAGG", "eavesdrop_argv", "node_argv", "this_python", "tls_args"]

NLAGG: tuple[str, ...] = ("nlagg",)


def this_python() -> tuple[str, ...]:
    """The CLI of this interpreter's ``nlagg_node`` (whatever ``nlagg`` is on PATH): for child processes."""
    return (sys.executable, "-c", "from nlagg_node.cli import main; main()")


def _opt(flag: str, value: object | None) -> list[str]:
    return [] if value is None else [flag, value if isinstance(value, str) else repr(value)]


def tls_args(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> list[str]:
    """``--ca-file`` / ``--cert-file`` / ``--key-file`` (for ``mqtts://``), for the files that are given."""
    return _opt("--ca-file", ca_file) + _opt("--cert-file", cert_file) + _opt("--key-file", key_file)


def node_argv(
    node_id: int, config: str, broker: str, *, program: Sequence[str] = NLAGG, **options: Any
) -> list[str]:
    """The ``nlagg node`` argument vector: ``options`` are fields of :class:`NodeOptions` (one private
    value source: value, value_file or value_cmd); an option left at its default is not written."""
    from .options import NodeOptions, to_argv

    given = {name: v for name, v in options.items() if v is not None}
    return [*program, "node", *to_argv(NodeOptions(id=node_id, config=config, broker=broker, **given))]


def eavesdrop_argv(
    broker: str | Sequence[str],
    run_id: str,
    transcript: str,
    *,
    program: Sequence[str] = NLAGG,
    **options: Any,
) -> list[str]:
    """The ``nlagg eavesdrop`` argument vector: ``options`` are fields of :class:`EavesdropOptions`
    (``events``: JSON lines on stdout; ``live=False``: no view; ``live=True`` leaves it to the command).

    ``broker``: one URL, or several (site brokers bridged together: one transcript of them all).
    """
    from .options import EavesdropOptions, to_argv

    brokers = [broker] if isinstance(broker, str) else list(broker)
    given = {name: v for name, v in options.items() if v is not None and (name, v) != ("live", True)}
    opts = EavesdropOptions(broker=brokers, run_id=run_id, transcript=Path(transcript), **given)
    return [*program, "eavesdrop", *to_argv(opts)]
