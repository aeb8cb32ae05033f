"""The command lines of nlagg's long-running parts, ``nlagg node`` and ``nlagg eavesdrop``, built once.

Everything that starts them uses these builders: the lab testbed (:mod:`nlagg_node.lab`), the fault
harness (``tests/faults.py``), ``nlagg deploy plan`` (``commands.txt``, the compose file) and
``nlagg deploy node``. An option left at ``None`` (or ``False``) is not written, so the command's own
default applies. Passwords never appear here: only the path of the file that holds one.

>>> " ".join(node_argv(3, "run.toml", "mqtt://pi:1883", value=1.5, corrupt=True))
'nlagg node --id 3 --config run.toml --value 1.5 --broker mqtt://pi:1883 --corrupt'
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

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
    node_id: int,
    config: str,
    broker: str,
    *,
    value: float | None = None,
    value_file: str | None = None,
    value_cmd: str | None = None,
    run_id: str | None = None,
    prefix: str | None = None,
    username: str | None = None,
    password_file: str | None = None,
    neighbour_timeout: float | None = None,
    seed: int | None = None,
    seed_file: str | None = None,
    state_dir: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    as_json: bool = False,
    corrupt: bool = False,
    leave_after: int | None = None,
    leave_by: str | None = None,
    program: Sequence[str] = NLAGG,
) -> list[str]:
    """The ``nlagg node`` argument vector (one private value source: value, value_file or value_cmd)."""
    argv = [*program, "node", "--id", str(node_id), "--config", config]
    argv += _opt("--value", None if value is None else float(value))
    argv += _opt("--value-file", value_file) + _opt("--value-cmd", value_cmd)
    argv += ["--broker", broker, *_opt("--run-id", run_id), *_opt("--prefix", prefix)]
    argv += _opt("--username", username) + _opt("--password-file", password_file)
    argv += _opt("--neighbour-timeout", neighbour_timeout) + _opt("--seed", seed)
    argv += (
        _opt("--seed-file", seed_file)
        + _opt("--state-dir", state_dir)
        + tls_args(ca_file, cert_file, key_file)
    )
    argv += _opt("--leave-after", leave_after) + _opt("--leave-by", leave_by)
    return argv + ["--json"] * as_json + ["--corrupt"] * corrupt


def eavesdrop_argv(
    broker: str | Sequence[str],
    run_id: str,
    transcript: str,
    *,
    prefix: str | None = None,
    username: str | None = None,
    password_file: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    events: bool = False,
    live: bool = True,
    verbose: bool = False,
    program: Sequence[str] = NLAGG,
) -> list[str]:
    """The ``nlagg eavesdrop`` argument vector (``events``: JSON lines on stdout; ``live=False``: no view).

    ``broker``: one URL, or several (site brokers bridged together: one transcript of them all).
    """
    brokers = [broker] if isinstance(broker, str) else list(broker)
    argv = [*program, "eavesdrop", *(a for url in brokers for a in ("--broker", url))]
    argv += ["--run-id", run_id, "--transcript", transcript]
    argv += _opt("--prefix", prefix) + _opt("--username", username) + _opt("--password-file", password_file)
    argv += tls_args(ca_file, cert_file, key_file)
    return argv + ["--events"] * events + ["--no-live"] * (not live) + ["--verbose"] * verbose
