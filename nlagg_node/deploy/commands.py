"""A plan's command lines: ``commands.txt`` and the eavesdropper's and launcher's argument vectors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from ..argv import eavesdrop_argv as build_eavesdrop_argv
from ..argv import tls_args
from .identities import identity_file
from .mosquitto_auth import EAVESDROPPER_USER, LAUNCHER_USER
from .nodefile import node_file_argv, shell_line
from .spec import DEFAULT_PREFIX

if TYPE_CHECKING:
    from .nodefile import NodeFile
    from .spec import PlanSpec

__all__ = [
    "EPOCH_STORE_NAME",
    "TRANSCRIPT_NAME",
    "commands_text",
    "eavesdrop_argv",
    "launcher_argv",
    "site_conf_path",
]

TRANSCRIPT_NAME = "transcript.sqlite"
EPOCH_STORE_NAME = "epochs"
"""A continuous plan's eavesdropper captures into this epoch store (``nlagg eavesdrop --continuous``)."""


class _TlsFiles(TypedDict, total=False):
    ca_file: str
    cert_file: str
    key_file: str


def _user_tls(spec: PlanSpec | None, user: str) -> _TlsFiles:
    """The CA (and the user's client certificate and key) a client of a TLS plan needs, else nothing."""
    if spec is None or not spec.uses_tls:
        return {}
    if spec.require_certificate:
        return {
            "ca_file": "tls/ca.pem",
            "cert_file": f"secrets/{user}.crt",
            "key_file": f"secrets/{user}.key",
        }
    return {"ca_file": "tls/ca.pem"}


def eavesdrop_argv(
    plan_run_id: str,
    broker: str | Sequence[str],
    db: str,
    prefix: str = DEFAULT_PREFIX,
    spec: PlanSpec | None = None,
    continuous: bool = False,
    *,
    drift: float | None = None,
    cold_start: bool = False,
) -> list[str]:
    """The plan's ``nlagg eavesdrop`` argument vector (credentials from secrets/eavesdropper.pw).

    ``broker``: one URL, or every site broker's (one ``--broker`` each). ``continuous``: every
    epoch of a continuous deployment into the epoch store ``db`` (a folder), each epoch's
    configuration derived from the plan's ``run.toml`` and its declared ``drift`` / ``cold_start``
    as the nodes derive it (no deployment publishes a per-epoch config).
    """
    derived: dict[str, Any] = {}
    if continuous:
        derived = {"config": "run.toml", "drift": drift, "cold_start": cold_start or None}
    return build_eavesdrop_argv(
        broker,
        plan_run_id,
        db,
        prefix=None if prefix == DEFAULT_PREFIX else prefix,
        continuous=continuous or None,
        username=EAVESDROPPER_USER,
        password_file=f"secrets/{EAVESDROPPER_USER}.pw",
        **_user_tls(spec, EAVESDROPPER_USER),
        **derived,
    )


def launcher_argv(broker: str | Sequence[str], spec: PlanSpec | None = None) -> list[str]:
    """The ``nlagg deploy publish-config`` argument vector (credentials from secrets/launcher.pw);
    several brokers (a plan's sites) get one config, one run instance."""
    brokers = [broker] if isinstance(broker, str) else list(broker)
    return [
        "nlagg",
        "deploy",
        "publish-config",
        "--config",
        "run.toml",
        *(arg for url in brokers for arg in ("--broker", url)),
        "--username",
        LAUNCHER_USER,
        "--password-file",
        f"secrets/{LAUNCHER_USER}.pw",
        *tls_args(**_user_tls(spec, LAUNCHER_USER)),
        *(["--signing-key", identity_file(LAUNCHER_USER)] if spec is not None and spec.auth else []),
    ]


def commands_text(
    spec: PlanSpec, nodes: Sequence[NodeFile], urls: Sequence[str], site_of: Sequence[int]
) -> str:
    """``commands.txt``: one command per part, each to be run from the plan directory.

    With sites: one broker per site (start them all first: a bridge subscribes to its topics
    when it connects), one eavesdropper on every site, the launcher once per site.
    """
    lines = [
        f"# Run {spec.run_id}: start each part by hand, every command from this plan directory.",
        "# Passwords come from files under secrets/ (never from the command line).",
        "# As root, Mosquitto drops to the 'mosquitto' user: broker/ must be readable and writable by it",
        "# (nlagg deploy plan already chowns it when run as root).",
    ]
    if len(urls) == 1:
        lines += ["# broker", shell_line(["mosquitto", "-c", "broker/mosquitto.conf"])]
    else:
        lines.append("# site brokers: start every one (and let the bridges connect) before the nodes")
        for s, url in enumerate(urls):
            lines += [f"# site {s} broker ({url})", shell_line(["mosquitto", "-c", site_conf_path(s)])]
    lines.append("# eavesdropper" + (" (every site, one transcript)" if len(urls) > 1 else ""))
    if spec.schedule is None:
        lines.append(shell_line(eavesdrop_argv(spec.run_id, urls, TRANSCRIPT_NAME, spec.prefix, spec)))
    else:  # every epoch into one epoch store
        sched = spec.schedule
        argv = eavesdrop_argv(
            spec.run_id,
            urls,
            EPOCH_STORE_NAME,
            spec.prefix,
            spec,
            True,
            drift=sched.drift,
            cold_start=sched.cold_start,
        )
        lines.append(shell_line(argv))
    lines.append(
        "# launcher: publish the public run configuration (retained; a fresh signed run instance each"
        " time: run it again before the nodes to run the plan again)"
    )
    lines.append(shell_line(launcher_argv(urls, spec)))
    for node in nodes:
        where = f", site {site_of[node.id]}" if len(urls) > 1 else ""
        lines.append(f"# node {node.id}" + (" (corrupted)" if node.corrupt else "") + where)
        lines.append(shell_line(node_file_argv(node)))
    return "\n".join(lines) + "\n"


def site_conf_path(site: int) -> str:
    """Where site ``site``'s Mosquitto configuration lies in a plan with sites."""
    return f"broker/site{site}/mosquitto.conf"
