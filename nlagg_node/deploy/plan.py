"""``nlagg deploy plan``: every file a real deployment needs, generated from one run description.

Layout of a plan directory ``DIR``::

    run.toml            public: [run] (RunConfig, graph as a file, no seed) and [network] (prefix, run_id)
    graph.json          public: the communication graph {"n": N, "edges": [[i, j], ...]}
    plan.toml           the operator's record (seed, corrupted ids, users, broker); not for the nodes
    nodes/<i>.toml      private, one per node: id, value source, broker, user, password file
    values/<i>.txt      private drawn values (mode 0600), when no value source was given
    secrets/<user>.pw   one clear-text password per broker user, mode 0600 (directory 0700)
    secrets/node<i>.identity.pem    node i's Ed25519 signing key (0600; its public key is in run.toml)
    secrets/launcher.identity.pem   the launcher's key: it signs each start's run instance (0600)
    tls/ca.pem          with TLS: the CA certificate every client verifies the broker with (public)
    secrets/<user>.crt, .key   with --require-certificate: each user's client certificate and key
    secrets/ca.key      with --tls: the plan CA's private key (the operator's; never on a node)
    broker/tls/         with TLS: ca.pem, server.pem, server.key (0600) of the broker's listener
    broker/site<s>/     with --sites: each site broker's conf, passwd, ACL (and tls/ with TLS: its
                        listener's files, and with --require-certificate its bridges' client ones)
    broker/mosquitto.conf         run from DIR: mosquitto -c broker/mosquitto.conf (persistence in broker/)
    broker/mosquitto-docker.conf  the same for the eclipse-mosquitto container (/mosquitto/...)
    broker/passwd, broker/acl     password file (PBKDF2-SHA512, mosquitto_passwd format) and ACL
    commands.txt        the exact command that starts each part by hand, run from DIR
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from ..config import RunConfig, parse_corrupt, validate_config
from ..errors import ConfigError
from ..graphs import neighbours, sample_graphs
from ..inputs import make_output_dir, not_a_file, parse_document, read_input_text
from ..private import PRIVATE_FILE_MODE, write_private
from ..protocol.identity import Identity, new_identity
from ..runtime.tls import broker_endpoint
from ..runtime.wire import RUN_ID_RE
from ..valuesource import ValueSource
from .commands import TRANSCRIPT_NAME, commands_text, site_conf_path
from .continuous import continuous_acl, scheduled
from .identities import identity_file
from .mosquitto_auth import (
    EAVESDROPPER_USER,
    LAUNCHER_USER,
    BrokerPaths,
    TlsFiles,
    acl_text,
    hash_password,
    mosquitto_conf,
    new_password,
    node_user,
    password_file_text,
    plan_packet_bytes,
    service_limits_text,
)
from .nodefile import NodeFile, node_file_text
from .sites import (
    Bridge,
    BridgeTls,
    bridge_acl_lines,
    bridge_address,
    bridge_conf_lines,
    partition_graph,
    plan_bridges,
    site_dir,
    site_layout,
)
from .spec import DEFAULT_PREFIX, PlanSpec

__all__ = [
    "DEFAULT_PREFIX",
    "DeployPlan",
    "PlanSpec",
    "build_plan",
    "load_plan",
    "parse_corrupt",
    "write_plan",
]


@dataclass(frozen=True)
class DeployPlan:
    """A generated plan, in memory (``write_plan`` puts it on disk)."""

    spec: PlanSpec
    seed: int
    public: RunConfig
    edges: list[list[int]]
    neighbours: list[list[int]]
    corrupted: list[int]
    nodes: list[NodeFile]
    passwords: dict[str, str] = field(repr=False)
    values: dict[int, float] = field(repr=False, default_factory=dict)  # drawn private values
    pem: dict[str, tuple[bytes, int]] = field(
        repr=False, default_factory=dict
    )  # TLS files: path -> (PEM, mode)
    site_of: list[int] = field(default_factory=list)  # each node's site (all 0 with one broker)
    site_urls: list[str] = field(default_factory=list)  # what the nodes of each site dial
    site_ports: list[int] = field(default_factory=list)  # each site broker's listener port
    bridges: list[Bridge] = field(default_factory=list)
    identities: list[Identity] = field(repr=False, default_factory=list)  # empty: --no-auth
    launcher: Identity | None = field(repr=False, default=None)  # signs each start's run instance

    @property
    def n(self) -> int:
        return self.public.n

    @property
    def users(self) -> list[str]:
        return [*plan_users(self.n), *(bridge.user for bridge in self.bridges)]


def plan_users(n: int) -> list[str]:
    """Every broker user of an n-node plan."""
    return [LAUNCHER_USER, EAVESDROPPER_USER, *(node_user(i) for i in range(n))]


def _tls_files(
    spec: PlanSpec, servers: dict[str, list[str]], clients: dict[str, str]
) -> dict[str, tuple[bytes, int]]:
    """Every TLS file of a plan (relative path -> (PEM, mode)): generated, or copied from ``spec.tls``.

    ``servers``: each broker folder (``broker``, or ``broker/site<s>`` per site) -> the host names
    its certificate holds, written to ``<folder>/tls/``; ``clients``: each user -> the folder of its
    client certificate and key (with ``require_certificate``; a bridge's lies with its broker).
    """
    from .tls import new_ca

    if spec.require_certificate and not spec.make_tls:
        raise ConfigError(
            "require_certificate", True, "client certificates come from the plan's CA: add --tls"
        )
    out: dict[str, tuple[bytes, int]] = {}
    if spec.tls is not None:
        for name, src, mode in (
            ("ca.pem", spec.tls.cafile, 0o644),
            ("server.pem", spec.tls.certfile, 0o644),
            ("server.key", spec.tls.keyfile, 0o600),
        ):
            path = Path(src)
            if (why := not_a_file(path)) is not None:
                raise ConfigError(f"tls_{name.replace('.', '')}", src, why)
            out |= {f"{root}/tls/{name}": (path.read_bytes(), mode) for root in servers}
        out["tls/ca.pem"] = (Path(spec.tls.cafile).read_bytes(), 0o644)
        return out
    if not spec.make_tls:
        return {}
    ca = new_ca(spec.run_id)
    out = {"tls/ca.pem": (ca.pair.cert_pem, 0o644), "secrets/ca.key": (ca.pair.key_pem, 0o600)}
    for root, hosts in servers.items():
        server = ca.server(hosts)
        out[f"{root}/tls/ca.pem"] = (ca.pair.cert_pem, 0o644)
        out[f"{root}/tls/server.pem"] = (server.cert_pem, 0o644)
        out[f"{root}/tls/server.key"] = (server.key_pem, 0o600)
    if spec.require_certificate:
        for user, folder in clients.items():
            pair = ca.client(user)
            out[f"{folder}/{user}.crt"] = (pair.cert_pem, 0o600)
            out[f"{folder}/{user}.key"] = (pair.key_pem, 0o600)
    return out


def _tls_servers(spec: PlanSpec, urls: list[str]) -> dict[str, list[str]]:
    """Each broker folder and the host names its certificate holds (what its clients dial)."""
    local = [spec.listen_host or "", "localhost", "127.0.0.1"]
    if len(urls) == 1:
        return {"broker": [broker_endpoint(spec.broker_url).host, *local, "broker"]}
    return {site_dir(s): [broker_endpoint(url).host, *local] for s, url in enumerate(urls)}


def build_plan(spec: PlanSpec) -> DeployPlan:
    """Draw the graph, the corrupted set, the values and the passwords of a deployment."""
    for name, value in (("run_id", spec.run_id), ("prefix", spec.prefix)):
        if not RUN_ID_RE.match(value):  # the prefix too is one topic level: the ACLs are per level
            raise ConfigError(name, value, "use 1-64 characters of [A-Za-z0-9_-]")
    if broker_endpoint(spec.broker_url).tls != spec.uses_tls:
        why = "a TLS plan needs mqtts://host:port" if spec.uses_tls else "mqtts:// needs --tls"
        raise ConfigError("broker", spec.broker_url, why)
    if spec.replay and spec.seed is None:
        raise ConfigError("replay", True, "replay mode needs an explicit --seed")
    import secrets

    seed = spec.seed if spec.seed is not None else secrets.randbits(63)
    run = spec.run.model_copy(update={"seed": seed, "trials": 1})
    edges_arr = sample_graphs(run.graph_spec(), seed, 1)[0]  # the simulator's trial-0 graph of this seed
    edges = [[int(a), int(b)] for a, b in edges_arr.tolist()]
    n = run.n
    public = validate_config(
        {
            # values_file names a private file of the operator: never in the public config
            **run.resolved().model_dump(
                exclude={"seed", "graph_file", "radius", "edge_probability", "values_file"}
            ),
            "graph": "file",
            "graph_file": "graph.json",
        }
    )
    corrupted = parse_corrupt(spec.corrupt, n, count=spec.corrupt_count)
    if spec.value_source is None:
        from ..sim.values import run_values

        drawn = {i: float(v) for i, v in enumerate(run_values(run, 1)[0])}
        # In private files, not in the node files: `nlagg node --value V` would show it to `ps`.
        sources = [ValueSource(source="file", path=f"values/{i}.txt") for i in range(n)]
    else:
        drawn = {}
        sources = [spec.value_source] * n
    passwords = {user: new_password() for user in [LAUNCHER_USER, EAVESDROPPER_USER]}
    nbrs = neighbours(n, edges_arr)
    site_of, urls, ports, bridges = _sites(spec, nbrs, edges, seed)
    clients = {user: "secrets" for user in plan_users(n)} | {
        b.user: f"{site_dir(b.local)}/tls" for b in bridges
    }
    pem = _tls_files(spec, _tls_servers(spec, urls), clients)
    for bridge in bridges:
        passwords[bridge.user] = new_password()
    nodes = []
    identities = [new_identity() for _ in range(n)] if spec.auth else []
    ca_file = "tls/ca.pem" if spec.uses_tls else None
    for i in range(n):
        user = node_user(i)
        passwords[user] = new_password()
        cert = key = None
        if spec.require_certificate:
            cert, key = f"secrets/{user}.crt", f"secrets/{user}.key"
        nodes.append(
            NodeFile(
                id=i,
                run_id=spec.run_id,
                broker=urls[site_of[i]],
                username=user,
                password_file=f"secrets/{user}.pw",
                corrupt=i in corrupted,
                seed=seed if spec.replay else None,
                value=sources[i],
                ca_file=ca_file,
                cert_file=cert,
                key_file=key,
                signing_key=identity_file(user) if identities else None,
            )
        )
    return DeployPlan(
        spec=spec,
        seed=seed,
        public=public,
        edges=edges,
        neighbours=nbrs,
        corrupted=corrupted,
        nodes=scheduled(nodes, spec.schedule),
        passwords=passwords,
        values=drawn,
        pem=pem,
        site_of=site_of,
        site_urls=urls,
        site_ports=ports,
        bridges=bridges,
        identities=identities,
        launcher=new_identity() if identities else None,
    )


def _sites(
    spec: PlanSpec, nbrs: list[list[int]], edges: list[list[int]], seed: int
) -> tuple[list[int], list[str], list[int], list[Bridge]]:
    """Each node's site, each site's URL and listener port, and the bridges between the sites."""
    n = spec.run.n
    if spec.site_of is None and spec.sites == 1:
        return [0] * n, [spec.broker_url], [spec.listen_port], []
    if spec.site_of is not None:
        site_of = list(spec.site_of)
        if len(site_of) != n or sorted(set(site_of)) != list(range(max(site_of) + 1)):
            raise ConfigError("sites_file", len(site_of), f"must give each of the {n} nodes a site 0..K-1")
    else:
        site_of = partition_graph(n, edges, spec.sites, seed)
    k = max(site_of) + 1
    urls, ports = site_layout(spec.broker_url, spec.listen_port, k, spec.site_brokers)
    bridges = plan_bridges(spec.prefix, spec.run_id, nbrs, site_of, epochs=spec.schedule is not None)
    return site_of, urls, ports, bridges


def _public_toml(plan: DeployPlan) -> str:
    run = plan.public.model_dump(mode="json", exclude_none=True, exclude={"seed"})
    doc: dict[str, Any] = {"run": run, "network": {"prefix": plan.spec.prefix, "run_id": plan.spec.run_id}}
    if plan.identities:  # the nodes sign every message; everyone checks with these keys
        doc["identities"] = {"ed25519": [identity.public for identity in plan.identities]}
        if plan.launcher is not None:  # the launcher signs each start's run instance
            doc["identities"]["launcher"] = plan.launcher.public
    head = (
        f"# Public configuration of run {plan.spec.run_id}: safe to publish (no private value, no seed).\n"
        "# graph_file is relative to this file's directory; start nodes from here.\n"
    )
    return head + tomli_w.dumps(doc)


def _plan_toml(plan: DeployPlan) -> str:
    doc: dict[str, Any] = {
        "plan": {
            "run_id": plan.spec.run_id,
            "prefix": plan.spec.prefix,
            "n": plan.n,
            "graph": plan.spec.run.graph,
            "seed": plan.seed,
            "replay": plan.spec.replay,
            "corrupted": plan.corrupted,
            "broker": plan.spec.broker_url,
            "listen_port": plan.spec.listen_port,
            "tls": plan.spec.uses_tls,
            "auth": bool(plan.identities),
            "require_certificate": plan.spec.require_certificate,
            "users": plan.users,
            "transcript": TRANSCRIPT_NAME,
        }
    }
    if plan.spec.schedule is not None:
        doc["plan"]["schedule"] = {k: v for k, v in vars(plan.spec.schedule).items() if v is not None}
    if plan.spec.listen_host:
        doc["plan"]["listen_host"] = plan.spec.listen_host
    if len(plan.site_urls) > 1:
        doc["plan"]["sites"] = {
            "site_of": plan.site_of,
            "brokers": plan.site_urls,
            "listen_ports": plan.site_ports,
            "bridges": [bridge.name for bridge in plan.bridges],
        }
    head = "# Operator's record of this plan (seed, corrupted nodes): keep it off the nodes.\n"
    return head + tomli_w.dumps(doc)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if mode == PRIVATE_FILE_MODE:
        write_private(path, text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)


def write_plan(plan: DeployPlan, out: Path, *, force: bool = False) -> list[Path]:
    """Write every file of ``plan`` under ``out`` and return their paths.

    Refuses to overwrite an existing plan (``run.toml`` present) unless ``force``, so
    credentials already handed out are not lost by accident.
    """
    if (out / "run.toml").exists() and not force:
        raise ConfigError("out", str(out), "already holds a plan (run.toml); pass --force to replace it")
    make_output_dir(out, "out")
    import json

    spec = plan.spec
    written: list[Path] = []

    def put(rel: str, text: str, mode: int = 0o644) -> None:
        _write(out / rel, text, mode)
        written.append(out / rel)

    put("run.toml", _public_toml(plan))
    put("graph.json", json.dumps({"n": plan.n, "edges": plan.edges}) + "\n")
    put("plan.toml", _plan_toml(plan), 0o600)
    for node in plan.nodes:
        put(f"nodes/{node.id}.toml", node_file_text(node), 0o600)
    if plan.values:
        (out / "values").mkdir(exist_ok=True)
        os.chmod(out / "values", 0o700)
    for i, value in plan.values.items():
        put(f"values/{i}.txt", repr(value) + "\n", 0o600)
    (out / "secrets").mkdir(exist_ok=True)
    os.chmod(out / "secrets", 0o700)
    for user, password in plan.passwords.items():
        put(f"secrets/{user}.pw", password + "\n", 0o600)
    for i, identity in enumerate(plan.identities):
        put(identity_file(node_user(i)), identity.pem().decode("ascii"), 0o600)
    if plan.launcher is not None:
        put(identity_file(LAUNCHER_USER), plan.launcher.pem().decode("ascii"), 0o600)
    hashes = {user: hash_password(pw) for user, pw in plan.passwords.items()}
    put("commands.txt", commands_text(spec, plan.nodes, plan.site_urls, plan.site_of))
    for rel, (pem, mode) in sorted(plan.pem.items()):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        put(rel, pem.decode("ascii"), mode)
    if len(plan.site_urls) > 1:
        _write_sites(plan, hashes, put)
        _hand_broker_to_mosquitto(out / "broker")
        return written
    put("broker/passwd", password_file_text(hashes), 0o600)
    acl = acl_text(spec.prefix, spec.run_id, plan.neighbours, plan.corrupted)
    if spec.schedule is not None:  # every epoch's topics
        acl = continuous_acl(acl, spec.prefix, spec.run_id, plan.n, LAUNCHER_USER)
    put("broker/acl", acl, 0o600)
    host_tls = docker_tls = None
    if plan.pem:
        names = ("ca.pem", "server.pem", "server.key")
        host_tls = TlsFiles(*(f"broker/tls/{name}" for name in names))
        docker_tls = TlsFiles(*(f"/mosquitto/config/tls/{name}" for name in names))
    require = spec.require_certificate
    header = f"Mosquitto for run {spec.run_id}; generated by nlagg deploy plan."
    host = BrokerPaths("broker/passwd", "broker/acl", "broker", "stderr")
    host_header = header + "\nStart from the plan directory: mosquitto -c broker/mosquitto.conf"
    packet = plan_packet_bytes(len(signed_config_bytes(plan)))
    conf = mosquitto_conf(
        host,
        listen_host=spec.listen_host,
        listen_port=spec.listen_port,
        tls=host_tls,
        require_certificate=require,
        header=host_header,
        max_packet=packet,
    )
    put("broker/mosquitto.conf", conf)
    docker = BrokerPaths("/mosquitto/config/passwd", "/mosquitto/config/acl", "/mosquitto/data", "stdout")
    docker_header = header + "\nInside the eclipse-mosquitto container (see docker-compose.yml)."
    port = 8883 if docker_tls is not None else 1883
    conf = mosquitto_conf(
        docker,
        listen_host=None,
        listen_port=port,
        tls=docker_tls,
        require_certificate=require,
        header=docker_header,
        max_packet=packet,
    )
    put("broker/mosquitto-docker.conf", conf)
    put("broker/mosquitto-limits.conf", service_limits_text())
    put("broker/.gitignore", "# Mosquitto's persistence file, written at run time\nmosquitto.db*\n")
    _hand_broker_to_mosquitto(out / "broker")
    return written


def signed_config_bytes(plan: DeployPlan) -> bytes:
    """The retained config the launcher publishes for ``plan`` (its size: a run instance and the
    launcher's signature included), which the broker's packet cap is sized on."""
    import numpy as np

    from ..protocol.instance import new_instance
    from ..runtime.public import build_config_msg
    from ..runtime.wire import encode, topics

    ids = [identity.public for identity in plan.identities] or None
    launcher = plan.launcher
    msg = build_config_msg(
        plan.public,
        plan.spec.run_id,
        np.asarray(plan.edges),
        ids,
        instance=None if launcher is None else new_instance(),
        launcher=None if launcher is None else launcher.public,
    )
    payload = encode(msg)
    topic = topics(plan.spec.prefix, plan.spec.run_id).config
    return payload if launcher is None else launcher.sign(topic, payload)


def _write_sites(plan: DeployPlan, hashes: dict[str, str], put: Callable[[str, str, int], None]) -> None:
    """broker/site<s>/: each site broker's conf (its bridges, 0600: they hold passwords), passwd, ACL."""
    spec = plan.spec
    for s, port in enumerate(plan.site_ports):
        own = [i for i, site in enumerate(plan.site_of) if site == s]
        dialled_here = [b for b in plan.bridges if b.remote == s]
        users = [LAUNCHER_USER, EAVESDROPPER_USER, *(node_user(i) for i in own)]
        users += [b.user for b in dialled_here]
        root = site_dir(s)
        put(f"{root}/passwd", password_file_text({u: hashes[u] for u in users}), 0o600)
        acl = acl_text(spec.prefix, spec.run_id, plan.neighbours, plan.corrupted, only=own)
        if spec.schedule is not None:  # every epoch's topics, as with one broker
            acl = continuous_acl(acl, spec.prefix, spec.run_id, plan.n, LAUNCHER_USER)
        put(
            f"{root}/acl",
            "\n".join([acl.rstrip("\n"), *(ln for b in dialled_here for ln in bridge_acl_lines(b))]) + "\n",
            0o600,
        )
        header = (
            f"Mosquitto of site {s} ({len(own)} nodes), run {spec.run_id}; generated by nlagg deploy plan.\n"
            f"Start from the plan directory: mosquitto -c {site_conf_path(s)}"
        )
        paths = BrokerPaths(f"{root}/passwd", f"{root}/acl", root, "stderr")
        tls = TlsFiles(*(f"{root}/tls/{name}" for name in ("ca.pem", "server.pem", "server.key")))
        conf = mosquitto_conf(
            paths,
            listen_host=spec.listen_host,
            listen_port=port,
            tls=tls if plan.pem else None,
            require_certificate=spec.require_certificate,
            header=header,
            max_packet=plan_packet_bytes(len(signed_config_bytes(plan))),
        )
        for b in plan.bridges:
            if b.local == s:
                address = bridge_address(plan.site_urls[b.remote])
                lines = bridge_conf_lines(b, address, plan.passwords[b.user], _bridge_tls(plan, b))
                conf += "\n" + "\n".join(lines) + "\n"
        put(site_conf_path(s), conf, 0o600)
        put(
            f"{root}/.gitignore",
            "# Mosquitto's persistence file, written at run time\nmosquitto.db*\n",
            0o644,
        )


def _bridge_tls(plan: DeployPlan, bridge: Bridge) -> BridgeTls | None:
    """The files ``bridge`` verifies its remote site with (and proves itself with), in a TLS plan."""
    if not plan.pem:
        return None
    folder = f"{site_dir(bridge.local)}/tls"
    if not plan.spec.require_certificate:
        return BridgeTls(f"{folder}/ca.pem")
    return BridgeTls(f"{folder}/ca.pem", f"{folder}/{bridge.user}.crt", f"{folder}/{bridge.user}.key")


def _hand_broker_to_mosquitto(broker_dir: Path) -> None:
    """As root, give broker/ to the 'mosquitto' user, which Mosquitto drops to before reading its files."""
    if os.geteuid() != 0:
        return
    try:
        entry = pwd.getpwnam("mosquitto")
    except KeyError:
        return
    for path in [broker_dir, *broker_dir.rglob("*")]:
        shutil.chown(path, entry.pw_uid, entry.pw_gid)


@dataclass(frozen=True)
class LoadedPlan:
    """A plan read back from disk (what ``nlagg deploy compose`` and the tests use)."""

    root: Path
    run_id: str
    prefix: str
    n: int
    corrupted: list[int]
    broker: str
    nodes: list[NodeFile]


def load_plan(root: Path) -> LoadedPlan:
    """Read ``plan.toml`` and every ``nodes/<i>.toml`` of a plan directory."""
    from .nodefile import load_node_file

    plan_file = root / "plan.toml"
    if not plan_file.is_file():
        raise ConfigError("plan", str(root), "no plan.toml here; create one with nlagg deploy plan")
    table = parse_document(read_input_text(plan_file, "plan"), "TOML", "plan", plan_file)
    try:
        doc = table["plan"]
        n = int(doc["n"])
        info = (
            str(doc["run_id"]),
            str(doc["prefix"]),
            [int(i) for i in doc["corrupted"]],
            str(doc["broker"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("plan", str(plan_file), f"malformed plan file ({exc!r})") from None
    nodes = [load_node_file(root / "nodes" / f"{i}.toml") for i in range(n)]
    return LoadedPlan(root, info[0], info[1], n, info[2], info[3], nodes)
