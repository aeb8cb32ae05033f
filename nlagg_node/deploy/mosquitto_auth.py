"""Mosquitto security files: PBKDF2-SHA512 password file, graph-derived ACL, broker configuration.

The password file uses the format Mosquitto 2 writes with ``mosquitto_passwd``:
``user:$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512 digest>``.
The ACL follows the wire protocol topics (``P/R/config``, ``P/R/edge/i/j/z0``,
``P/R/node/i/x``, ``P/R/node/i/status``, ``P/R/node/i/key`` of the sealed initialization,
``P/R/adv/i/state``): a node writes only its own
topics and reads only what its neighbours address to it plus the run configuration.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError, WireError
from ..runtime.wire import MAX_PAYLOAD_BYTES, topics

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "EAVESDROPPER_USER",
    "LAUNCHER_USER",
    "MAX_BROKER_CONNECTIONS",
    "MAX_PACKET_BYTES",
    "PBKDF2_ITERATIONS",
    "BrokerPaths",
    "TlsFiles",
    "acl_text",
    "hash_password",
    "mosquitto_conf",
    "new_password",
    "node_user",
    "password_file_text",
    "plan_packet_bytes",
    "security_lines",
    "service_limits_text",
    "verify_password",
]

PBKDF2_ITERATIONS = 101  # what mosquitto_passwd 2.0 writes
# A publish at the payload cap, with its topic (at most a few hundred bytes) and MQTT headers.
MAX_PACKET_BYTES = MAX_PAYLOAD_BYTES + (64 << 10)
# The smallest packet cap of a plan (:func:`plan_packet_bytes`): every message of a small run fits.
MIN_PACKET_BYTES = 64 << 10
# The descriptor limit the plan's service files give the broker: above DEFAULT_MAX_CONNECTIONS, so
# the listener's max_connections is what refuses sockets, never the file limit (at 1024 it was).
BROKER_NOFILE = 8192
# Sockets one listener accepts: a plan's own clients are n + 2 (nodes, eavesdropper, launcher); the
# rest is headroom for reconnects whose old session the broker has not yet timed out.
DEFAULT_MAX_CONNECTIONS = 4000
MAX_BROKER_CONNECTIONS = 60000  # below the LimitNOFILE=65536 of deploy/README.md's systemd drop-in
_SALT_BYTES = 12
_DIGEST_BYTES = 64
EAVESDROPPER_USER = "eavesdropper"
LAUNCHER_USER = "launcher"
_USER_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def node_user(node_id: int) -> str:
    """The broker user name of node ``node_id`` (``node<i>``)."""
    return f"node{node_id}"


def new_password(nbytes: int = 24) -> str:
    """A fresh random password (URL-safe base64 of ``nbytes`` bytes from the OS generator)."""
    return secrets.token_urlsafe(nbytes)


def hash_password(password: str, *, salt: bytes | None = None, iterations: int = PBKDF2_ITERATIONS) -> str:
    """Hash ``password`` as Mosquitto 2 does: ``$7$iterations$salt$digest`` (PBKDF2-HMAC-SHA512).

    Parameters
    ----------
    password : the clear-text password (UTF-8 encoded before hashing).
    salt : 12 random bytes when None (what ``mosquitto_passwd`` uses).
    iterations : PBKDF2 iteration count; Mosquitto 2.0 writes 101.
    """
    if iterations < 1:
        raise ConfigError("iterations", iterations, "must be at least 1")
    if not password:
        raise ConfigError("password", "", "must not be empty")
    if "\n" in password or "\r" in password:
        raise ConfigError("password", "<hidden>", "must not contain a line break")
    raw_salt = secrets.token_bytes(_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), raw_salt, iterations, _DIGEST_BYTES)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(raw_salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches a ``$7$`` (PBKDF2-SHA512) or ``$6$`` (salted SHA-512) Mosquitto hash."""
    parts = hashed.split("$")
    try:
        if len(parts) == 5 and parts[1] == "7":
            iterations, salt, digest = int(parts[2]), base64.b64decode(parts[3]), base64.b64decode(parts[4])
            got = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations, len(digest))
            return hmac.compare_digest(got, digest)
        if len(parts) == 4 and parts[1] == "6":
            salt, digest = base64.b64decode(parts[2]), base64.b64decode(parts[3])
            got = hashlib.sha512(password.encode("utf-8") + salt).digest()
            return hmac.compare_digest(got, digest)
    except ValueError:
        return False
    return False


def _check_user(user: str) -> str:
    if not _USER_RE.match(user):
        raise ConfigError("username", user, "use 1-64 characters of [A-Za-z0-9_.-]")
    return user


def password_file_text(hashes: Mapping[str, str]) -> str:
    """Lines ``user:hash`` in the order given (``hashes`` maps user -> :func:`hash_password` output)."""
    return "".join(f"{_check_user(user)}:{hashed}\n" for user, hashed in hashes.items())


def acl_text(
    prefix: str,
    run_id: str,
    neighbours: Sequence[Sequence[int]],
    corrupted: Iterable[int] = (),
    *,
    eavesdropper: str = EAVESDROPPER_USER,
    launcher: str = LAUNCHER_USER,
    only: Iterable[int] | None = None,
) -> str:
    """The Mosquitto ``acl_file`` of one run.

    Parameters
    ----------
    prefix, run_id : topic root ``prefix/run_id``.
    neighbours : ascending neighbour list of every node (``neighbours[i]``).
    corrupted : ids of corrupted nodes; only they may publish ``adv/i/state``.
    eavesdropper : user that reads every topic of the run and writes none.
    launcher : user that publishes the retained run configuration (and reads it back).
    only : the nodes whose users this broker knows (a site broker's own nodes); None = every node.

    Notes
    -----
    Anything not granted is denied: anonymous clients get no lines at all, a node cannot
    write a neighbour's topics, cannot read ``edge/j/k/z0`` meant for another node ``k``
    and cannot read any ``adv/`` topic.
    """
    try:
        t = topics(prefix, run_id)
    except WireError as exc:
        raise ConfigError(exc.field, exc.value, exc.reason) from None
    root = t.base
    n = len(neighbours)
    bad = [c for c in corrupted if not 0 <= c < n]
    if bad:
        raise ConfigError("corrupt", bad, f"node ids must lie in 0..{n - 1}")
    corrupt_set = set(corrupted)
    out = [
        f"# Mosquitto ACL of run {run_id} (topic root {root}); generated by nlagg deploy plan.",
        "# Anything not granted below is denied. Anonymous clients get nothing.",
        "",
        f"user {_check_user(launcher)}",
        f"topic readwrite {t.config}",
        "",
        f"user {_check_user(eavesdropper)}",
        f"topic read {t.all}",
    ]
    hosted = set(range(n)) if only is None else set(only)
    for i, nbrs in enumerate(neighbours):
        if i not in hosted:
            continue
        out += ["", f"user {node_user(i)}", f"topic read {t.config}", f"topic write {t.x(i)}"]
        out += [f"topic write {t.status(i)}", f"topic write {t.key(i)}"]
        out += [f"topic write {t.z0(i, j)}" for j in nbrs]
        if i in corrupt_set:
            out.append(f"topic write {t.adv(i)}")
        for j in nbrs:
            out += [f"topic read {t.x(j)}", f"topic read {t.status(j)}", f"topic read {t.key(j)}"]
            out.append(f"topic read {t.z0(j, i)}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class TlsFiles:
    """Server-side TLS files (PEM): CA certificate, server certificate, server key."""

    cafile: str
    certfile: str
    keyfile: str


@dataclass(frozen=True)
class BrokerPaths:
    """Where the broker finds its files (as Mosquitto will see them)."""

    password_file: str
    acl_file: str
    persistence_location: str
    log_dest: str = "stderr"


def plan_packet_bytes(config_bytes: int) -> int:
    """The broker's ``max_packet_size`` for a plan whose signed retained config is ``config_bytes``.

    Mosquitto reads a packet into a buffer of the size its header announces, before login: 300
    unauthenticated sockets each sending 1 MB of an unfinished CONNECT took it from 9 MB to 303 MB
    under the protocol-wide cap (:data:`MAX_PACKET_BYTES`). A plan knows its largest message: the
    config, or a message whose size grows with a node's degree (a corrupted node's state, a status
    listing departures), each below eight times the config, whose edge list holds every degree. So
    the cap is that, at least :data:`MIN_PACKET_BYTES`, at most :data:`MAX_PACKET_BYTES`.
    """
    return min(MAX_PACKET_BYTES, max(MIN_PACKET_BYTES, 8 * config_bytes + (16 << 10)))


def service_limits_text(nofile: int = BROKER_NOFILE) -> str:
    """A systemd drop-in for Debian's ``mosquitto.service`` that raises its descriptor limit above
    the plan's ``max_connections`` (the unit's default soft limit is 1024)."""
    return (
        "# Install: sudo mkdir -p /etc/systemd/system/mosquitto.service.d &&\n"
        "#   sudo cp broker/mosquitto-limits.conf /etc/systemd/system/mosquitto.service.d/ &&\n"
        "#   sudo systemctl daemon-reload && sudo systemctl restart mosquitto\n"
        f"[Service]\nLimitNOFILE={nofile}\n"
    )


def security_lines(password_file: str, acl_file: str, max_packet: int = MAX_PACKET_BYTES) -> list[str]:
    """The lines that lock a Mosquitto listener down to the generated users and ACL.

    ``use_username_as_clientid true`` binds every session to its user: a credential holder that
    connects with another node's client id gets its own session (named after its own user), so it
    can neither take over nor disconnect that node's. ``message_size_limit`` drops any payload the
    wire protocol could not carry (larger than ``MAX_PAYLOAD_BYTES``) at the broker.
    ``max_packet_size`` (``max_packet``: a plan's own, :func:`plan_packet_bytes`) closes, before
    login, a connection whose packet announces more than the largest legitimate message: a CONNECT
    header announcing 256 MB then costs the broker nothing, where without it Mosquitto allocated it.
    """
    return [
        "allow_anonymous false",
        f"password_file {password_file}",
        f"acl_file {acl_file}",
        "use_username_as_clientid true",
        f"message_size_limit {MAX_PAYLOAD_BYTES}",
        f"max_packet_size {max_packet}",
    ]


def mosquitto_conf(
    paths: BrokerPaths,
    *,
    listen_host: str | None,
    listen_port: int,
    tls: TlsFiles | None = None,
    require_certificate: bool = False,
    header: str = "",
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_packet: int = MAX_PACKET_BYTES,
) -> str:
    """A complete ``mosquitto.conf``: one explicit listener, no anonymous access, password file, ACL.

    ``listen_host`` None binds every address of the host (what a broker serving a LAN of
    Raspberry Pi nodes needs); give an address to bind only that one. With ``tls`` the listener
    speaks only TLS (1.2+); ``require_certificate`` makes it refuse clients without a certificate
    signed by the CA (the password is still checked). ``max_connections`` bounds the listener's
    sockets below the broker's file limit (give it ``LimitNOFILE`` above that: see
    deploy/README.md), so idle sockets of an outsider exhaust neither descriptors nor memory;
    per-source limits belong in the host's firewall.
    """
    if not 0 < listen_port < 65536:
        raise ConfigError("listen_port", listen_port, "must lie in 1..65535")
    listener = f"listener {listen_port}" + (f" {listen_host}" if listen_host else "")
    if not 0 < max_connections <= MAX_BROKER_CONNECTIONS:
        raise ConfigError("max_connections", max_connections, f"must lie in 1..{MAX_BROKER_CONNECTIONS}")
    lines = [f"# {line}" if line else "#" for line in header.strip().splitlines()]
    lines += [
        "# One listener, so the security settings below are global.",
        "per_listener_settings false",
        "set_tcp_nodelay true",
        "max_inflight_messages 0",
        "max_queued_messages 100000",
        "persistence true",
        f"persistence_location {paths.persistence_location.rstrip('/')}/",
        "autosave_interval 60",
        f"log_dest {paths.log_dest}",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "connection_messages true",
        "",
        listener,
        "protocol mqtt",
        f"max_connections {max_connections}",
    ]
    if tls is not None:
        lines += [
            f"cafile {tls.cafile}",
            f"certfile {tls.certfile}",
            f"keyfile {tls.keyfile}",
            "tls_version tlsv1.2",
        ]
        if require_certificate:
            lines.append("require_certificate true")
    else:
        lines.append(
            "# TLS off: passwords cross the network in clear text (nlagg deploy plan --tls turns it on)."
        )
    lines += ["", *security_lines(paths.password_file, paths.acl_file, max_packet)]
    return "\n".join(lines) + "\n"
