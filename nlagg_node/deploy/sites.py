"""Site brokers bridged along a graph partition (``nlagg deploy plan --sites K``).

One Mosquitto is single-threaded: every x of a round is delivered once per neighbour (and once to
the eavesdropper), all by one process. A plan with sites splits the graph into K balanced parts
with few cut edges, gives each part (a site: a building, a rack) its own broker, and joins the
brokers with Mosquitto's own bridges. A bridge carries exactly the topics of cut edges, each with
one explicit direction::

       site 0 broker  ==== bridge0-1 (dialled by site 0) ====  site 1 broker
       nodes of site 0      out: x, key, status of site-0 nodes   nodes of site 1
                                 with a neighbour at site 1,
                                 z0 from them to it
                            in:  the same of site-1 nodes

Site ``a`` dials every site ``b > a`` it shares a cut edge with, as the user ``bridge<a>-<b>`` of
``b`` (whose ACL allows exactly those topics: read the ``in`` ones, write the ``out`` ones). A
boundary node's public key (``node/i/key``, retained; a sealed z^(0) exchange needs every
neighbour's) crosses like its status: bridges keep the retain flag (``try_private``, and Mosquitto
forwards ``out`` messages as published), so a node that subscribes later still gets it. No
topic is bridged in both directions and no bridge forwards what another bridge brought in (a
bridge only carries topics of its own two sites' nodes), so nothing loops. The run's retained
configuration is published at every site by the launcher; an ``adv`` state stays at its site.
The eavesdropper subscribes at every site and stores each message once (the transcript's dedup
key is topic + payload, and a bridged copy is the same bytes on the same topic).

A continuous deployment (``--every``) bridges every epoch's topics at once through a ``+`` level
(``P/R/+/node/i/x``), its status and key on the topics all epochs share, and every node's results
to every site (a bridge between every pair of sites: :func:`plan_bridges`); its eavesdropper
(``nlagg eavesdrop --continuous``) likewise captures from every site.

With TLS (``--tls``) every site broker listens with TLS only, on a certificate of the plan's CA
naming its host, and each bridge verifies the site it dials with that CA (and, with
``--require-certificate``, shows a client certificate of its own user).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..runtime.outputs import results_topic
from ..runtime.wire import topics

__all__ = [
    "Bridge",
    "BridgeTls",
    "bridge_acl_lines",
    "bridge_address",
    "bridge_conf_lines",
    "bridge_user",
    "cut_edges",
    "delivery_model",
    "partition_graph",
    "plan_bridges",
    "read_sites_file",
    "site_dir",
    "site_layout",
    "sites_from_groups",
]


def bridge_user(local: int, remote: int) -> str:
    """The user that site ``local``'s bridge logs in as at site ``remote``."""
    return f"bridge{local}-{remote}"


@dataclass(frozen=True)
class Bridge:
    """One bridge connection, configured on site ``local`` and dialling site ``remote``.

    Attributes
    ----------
    out_topics : published at ``local``, forwarded to ``remote``.
    in_topics : subscribed at ``remote``, forwarded to ``local``.
    """

    local: int
    remote: int
    out_topics: tuple[str, ...]
    in_topics: tuple[str, ...]

    @property
    def user(self) -> str:
        return bridge_user(self.local, self.remote)

    @property
    def name(self) -> str:
        return f"site{self.local}-site{self.remote}"


@dataclass(frozen=True)
class BridgeTls:
    """What a bridge dials its remote site's TLS listener with: the CA that verifies it, and the
    bridge user's client certificate and key when the broker requires one (paths as Mosquitto sees them)."""

    cafile: str
    certfile: str | None = None
    keyfile: str | None = None


def site_dir(site: int) -> str:
    """The folder of site ``site``'s broker files in a plan."""
    return f"broker/site{site}"


def cut_edges(edges: Sequence[Sequence[int]], site_of: Sequence[int]) -> list[tuple[int, int]]:
    """The edges whose ends lie at two different sites."""
    return [(int(a), int(b)) for a, b in edges if site_of[a] != site_of[b]]


def _split_order(graph: object, nodes: list[int]) -> list[int]:
    """BFS order of ``nodes`` from a pseudo-peripheral node, component by component (a geometric sweep)."""
    import networkx as nx

    assert isinstance(graph, nx.Graph)
    sub = graph.subgraph(nodes)
    order: list[int] = []
    for comp in sorted((sorted(c) for c in nx.connected_components(sub)), key=lambda c: c[0]):
        start = comp[0]
        for _ in range(2):  # two sweeps: the last node reached is far from everything
            start = list(nx.bfs_tree(sub, start))[-1]
        order += list(nx.bfs_tree(sub, start))
    return order


def partition_graph(n: int, edges: Sequence[Sequence[int]], k: int, seed: int) -> list[int]:
    """Split nodes ``0..n-1`` into ``k`` balanced sites with few cut edges; return each node's site.

    Recursive bisection: each part is cut in BFS order from a pseudo-peripheral node into two
    pieces sized in proportion to the sites they will hold, then refined by networkx's
    Kernighan-Lin bisection (which swaps pairs, so the sizes stay). Site sizes differ by at most
    one. ``seed`` fixes Kernighan-Lin's tie breaking: the same graph and seed give the same sites.
    """
    import networkx as nx
    from networkx.algorithms.community import kernighan_lin_bisection

    if not 1 <= k <= n:
        raise ConfigError("sites", k, f"must lie in 1..{n} (the number of nodes)")
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((int(a), int(b)) for a, b in edges)
    site = [0] * n

    def split(nodes: list[int], parts: int, first: int) -> None:
        if parts == 1:
            for v in nodes:
                site[v] = first
            return
        left_parts = parts // 2
        n_left = len(nodes) * left_parts // parts
        order = _split_order(graph, nodes)
        left, right = set(order[:n_left]), set(order[n_left:])
        if left and right:
            one, other = kernighan_lin_bisection(
                graph.subgraph(nodes), partition=(left, right), seed=seed % 2**32
            )
            # Sizes are kept, but the two sides may come back in either order.
            left, right = (one, other) if len(one) == n_left else (other, one)
        split(sorted(left), left_parts, first)
        split(sorted(right), parts - left_parts, first + left_parts)

    split(list(range(n)), k, 0)
    return site


def sites_from_groups(groups: Sequence[Sequence[int]], n: int, source: str = "sites_file") -> list[int]:
    """Each node's site from a list of sites (each a list of node ids; every node exactly once)."""
    site: list[int | None] = [None] * n
    for s, members in enumerate(groups):
        if not members:
            raise ConfigError(source, f"site {s}", "is empty")
        for v in members:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
                raise ConfigError(source, v, f"node ids must lie in 0..{n - 1}")
            if site[v] is not None:
                raise ConfigError(source, v, f"node in two sites ({site[v]} and {s})")
            site[v] = s
    missing = [i for i, s in enumerate(site) if s is None]
    if missing:
        raise ConfigError(source, missing[:5], "nodes in no site (every node needs one)")
    return [int(s) for s in site if s is not None]


def read_sites_file(path: Path, n: int) -> list[int]:
    """A ``--sites-file``: JSON ``[[0, 1, 2], [3, 4, 5], ...]``, the node ids of each site."""
    from ..inputs import parse_document, read_input_text

    groups = parse_document(read_input_text(path, "sites_file"), "JSON", "sites_file", path)
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups) or len(groups) < 2:
        raise ConfigError("sites_file", str(path), "expected a list of at least 2 lists of node ids")
    return sites_from_groups(groups, n)


def plan_bridges(
    prefix: str,
    run_id: str,
    neighbours: Sequence[Sequence[int]],
    site_of: Sequence[int],
    *,
    epochs: bool = False,
) -> list[Bridge]:
    """One bridge per pair of sites sharing a cut edge, configured on the lower-numbered site.

    Each carries the x, key and status topics of the boundary nodes of its two sites and the
    z^(0) topics of their cut edges, x's, z^(0)'s and keys before statuses (a node starts once its
    neighbours' statuses are in, by then the bridge subscribes to their x's already; a sealed
    z^(0) needs the receiver's key, retained on ``node/j/key``, which a node publishes before its
    ``online`` status).

    ``epochs``: the plan is a continuous deployment (``--every``, docs/continuous.md), whose epoch
    k is the run ``e{k}`` under ``P/R``. Its x and z^(0) topics are then carried for every epoch
    at once through a ``+`` level (``P/R/+/node/{i}/x``, ``P/R/+/edge/{i}/{j}/z0``: ``e{k}`` and
    the cold rerun ``e{k}r`` alike), its status and key on the topics every epoch shares
    (``P/R/node/{i}/status``, ``P/R/node/{i}/key``), and every node's results topic
    ``P/R/results/{i}`` reaches every site: each node warm-starts from all published outputs
    (:mod:`~nlagg_node.runtime.warmstart`). So there is a bridge between *every* pair of sites
    (one without a cut edge carries results only), and each carries the results of all nodes of
    its two sites, each towards the other. A results topic thus crosses exactly one bridge to
    each other site, straight from its node's site; as no bridge carries another site's node's
    topic, nothing is forwarded twice and nothing loops.
    """
    t = topics(prefix, run_id)  # a continuous plan's shared status and key topics are these too
    every_epoch = f"{t.base}/+"  # any epoch's run level (a continuous plan)
    # (a, b) -> the cut edges i -> j with i at a, j at b (both directions of every cut edge)
    cut: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, nbrs in enumerate(neighbours):
        for j in nbrs:
            if site_of[i] != site_of[j]:
                cut.setdefault((site_of[i], site_of[j]), []).append((i, j))

    def epoch_level(topic: str) -> str:
        return topic.replace(t.base, every_epoch, 1) if epochs else topic

    def carried(a: int, b: int) -> list[str]:
        directed = sorted(cut.get((a, b), []))
        senders = sorted({i for i, _ in directed})
        return [
            *(epoch_level(t.x(i)) for i in senders),
            *(epoch_level(t.z0(i, j)) for i, j in directed),
            *(t.key(i) for i in senders),
            *(t.status(i) for i in senders),
            *(results_topic(prefix, run_id, i) for i, s in enumerate(site_of) if epochs and s == a),
        ]

    pairs = sorted({(min(a, b), max(a, b)) for a, b in cut})
    if epochs:
        k = max(site_of, default=0) + 1
        pairs = [(a, b) for a in range(k) for b in range(a + 1, k)]
    return [Bridge(a, b, tuple(carried(a, b)), tuple(carried(b, a))) for a, b in pairs]


def bridge_conf_lines(bridge: Bridge, address: str, password: str, tls: BridgeTls | None = None) -> list[str]:
    """The ``connection`` section of ``bridge`` in site ``bridge.local``'s mosquitto.conf.

    ``address`` is the remote site's ``host:port``. The session is persistent on both sides
    (``cleansession false``), so what is published while the bridge is down is delivered when
    it comes back; notifications are off (they would need a ``$SYS`` write on the remote). With
    ``tls`` the bridge speaks TLS 1.2+ and verifies the remote's certificate and host name.
    """
    lines = [
        f"# Bridge to site {bridge.remote}: {len(bridge.out_topics)} topics out, {len(bridge.in_topics)} in.",
        f"connection {bridge.name}",
        f"address {address}",
        "bridge_protocol_version mqttv311",
        f"remote_clientid {bridge.user}",
        f"local_clientid {bridge.user}.local",
        f"remote_username {bridge.user}",
        f"remote_password {password}",
        "cleansession false",
        "notifications false",
        "try_private true",
        "start_type automatic",
        "restart_timeout 1 10",
        "keepalive_interval 30",
    ]
    if tls is not None:
        lines += [f"bridge_cafile {tls.cafile}", "bridge_tls_version tlsv1.2", "bridge_insecure false"]
        if tls.certfile is not None and tls.keyfile is not None:
            lines += [f"bridge_certfile {tls.certfile}", f"bridge_keyfile {tls.keyfile}"]
    lines += [f"topic {topic} out 1" for topic in bridge.out_topics]
    lines += [f"topic {topic} in 1" for topic in bridge.in_topics]
    return lines


def bridge_acl_lines(bridge: Bridge) -> list[str]:
    """The remote site's ACL entry of ``bridge``'s user: read its ``in`` topics, write its ``out`` ones."""
    out = ["", f"user {bridge.user}"]
    out += [f"topic read {topic}" for topic in bridge.in_topics]
    out += [f"topic write {topic}" for topic in bridge.out_topics]
    return out


def delivery_model(
    neighbours: Sequence[Sequence[int]], site_of: Sequence[int], *, eavesdropper: bool = True
) -> list[int]:
    """Deliveries of one round's x's per site broker, as the bridges of :func:`plan_bridges` route them.

    At site ``s``: each x of a local node goes to its local neighbours, once to every bridge
    towards a site holding one of its neighbours, and (``eavesdropper``) once to the
    eavesdropper; each x bridged in goes to its local neighbours (and the eavesdropper). With one
    site this is ``2 |E| + n``.
    """
    k = max(site_of, default=0) + 1
    load = [0] * k
    for i, nbrs in enumerate(neighbours):
        home = site_of[i]
        at: dict[int, int] = {}
        for j in nbrs:
            at[site_of[j]] = at.get(site_of[j], 0) + 1
        load[home] += at.get(home, 0) + int(eavesdropper)
        for s, count in at.items():
            if s != home:
                load[home] += 1  # to the bridge towards s
                load[s] += count + int(eavesdropper)
    return load


def site_layout(
    broker_url: str, listen_port: int, k: int, site_brokers: Sequence[str] = ()
) -> tuple[list[str], list[int]]:
    """Each site broker's URL (what its nodes and the other sites' bridges dial) and listener port.

    Given ``site_brokers`` (one URL per site), site s listens on its URL's port. Otherwise site s
    is ``broker_url``'s host with its port + s, listening on ``listen_port + s``.
    """
    from ..runtime.tls import broker_endpoint

    base = broker_endpoint(broker_url)
    if site_brokers:
        if len(site_brokers) != k:
            raise ConfigError("site_broker", list(site_brokers), f"give one URL per site ({k})")
        ends = [broker_endpoint(url) for url in site_brokers]
        if any(e.tls != base.tls for e in ends):
            why = "with --tls every site broker is mqtts://, without it mqtt://"
            raise ConfigError("site_broker", list(site_brokers), why)
        return list(site_brokers), [e.port for e in ends]
    scheme = "mqtts" if base.tls else "mqtt"
    if not 0 < base.port + k - 1 < 65536 or not 0 < listen_port + k - 1 < 65536:
        raise ConfigError("sites", k, f"ports {base.port}.. and {listen_port}.. run past 65535")
    return [f"{scheme}://{base.host}:{base.port + s}" for s in range(k)], [listen_port + s for s in range(k)]


def bridge_address(url: str) -> str:
    """``host:port`` of a site broker URL, as a bridge's ``address`` line wants it."""
    from ..runtime.tls import broker_endpoint

    end = broker_endpoint(url)
    return f"{end.host}:{end.port}"
