"""Site brokers bridged along a graph partition (nlagg deploy plan --sites), on real Mosquitto processes.

Three site brokers, each started from the plan's own broker/site<s>/mosquitto.conf (its bridges,
password file and ACL), the nodes dialling their site, one eavesdropper on all three: on loopback,
and (the 24-node runs) each site, broker and nodes, in its own network namespace, the bridges and the
eavesdropper's sessions crossing the namespaces' network (tests/harness/netns.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import queue
import re
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion

from adversary.capture.eavesdropper import Eavesdropper
from adversary.capture.merged import MergedSubscriber
from adversary.transcript import Transcript
from adversary.transcript.store import EpochStore
from nlagg_node.cli import main
from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.deploy.continuous import EpochTimetable
from nlagg_node.deploy.sites import (
    cut_edges,
    delivery_model,
    partition_graph,
    plan_bridges,
    read_sites_file,
)
from nlagg_node.errors import ConfigError
from nlagg_node.protocol import Verifier
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.outputs import published_record, results_filter, results_topic
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.transport import topic_matches
from nlagg_node.runtime.wire import encode_x, topics
from nlagg_node.schedule import phase_targets, plan_phases, sealed_groups_of
from nlagg_node.sim import simulate
from tests.harness.load import contention, stretched
from tests.harness.netns import EAVES_IP, SUBNET, Net, network
from tests.harness.planbed import PlanBed

RUN = "planbed"


def _plan(n: int = 24, sites: int = 3, seed: int = 5) -> PlanSpec:
    return PlanSpec(
        run=load_config(None, op="max", n=n, graph="rgg", seed=seed), run_id=RUN, seed=seed, sites=sites
    )


@pytest.mark.parametrize(("n", "k"), [(24, 3), (100, 4), (400, 4)], ids=["n24-k3", "n100-k4", "n400-k4"])
def test_partition_is_balanced_and_cuts_few_edges(n: int, k: int) -> None:
    plan = build_plan(_plan(n, k))
    sizes = sorted(Counter(plan.site_of).values())
    assert len(sizes) == k
    assert sizes[-1] - sizes[0] <= 1
    # A random balanced split cuts (k - 1) / k of the edges on average; the partition fewer (at
    # n = 24 the RGG's degree is about 11, more than a site of 8 can hold: 62 of 131 are cut).
    assert len(cut_edges(plan.edges, plan.site_of)) < 0.75 * (k - 1) / k * len(plan.edges)
    assert plan.site_of == partition_graph(n, plan.edges, k, plan.seed)  # the same seed, the same sites


def test_bridges_carry_exactly_the_cut_edges_topics_one_way_each() -> None:
    plan = build_plan(_plan())
    t = topics("nlagg", RUN)
    want: set[tuple[int, str]] = set()  # (destination site, topic) every cut edge needs
    for i, j in [(a, b) for a, b in cut_edges(plan.edges, plan.site_of)] + [
        (b, a) for a, b in cut_edges(plan.edges, plan.site_of)
    ]:
        to = plan.site_of[j]
        want |= {(to, t.x(i)), (to, t.status(i)), (to, t.key(i)), (to, t.z0(i, j))}
    got: list[tuple[int, str]] = []
    for b in plan.bridges:
        assert b.local < b.remote
        got += [(b.remote, topic) for topic in b.out_topics] + [(b.local, topic) for topic in b.in_topics]
    assert len(got) == len(set(got))
    assert set(got) == want
    # the public keys (sealed runs) of exactly the boundary nodes cross, each to every other site
    # holding a neighbour of it; no other node's key leaves its site
    boundary = {i for edge in cut_edges(plan.edges, plan.site_of) for i in edge}
    assert 0 < len(boundary) < 24
    assert {(to, topic) for to, topic in got if topic.endswith("/key")} == {
        (s, t.key(i))
        for i in boundary
        for s in {plan.site_of[j] for j in plan.neighbours[i]} - {plan.site_of[i]}
    }
    assert plan.bridges == plan_bridges("nlagg", RUN, plan.neighbours, plan.site_of)


def _sender(topic: str) -> int:
    """The node publishing ``topic`` (``.../node/{i}/x``, ``.../edge/{i}/{j}/z0``, ``.../results/{i}``)."""
    levels = topic.split("/")
    for kind in ("node", "edge", "results"):
        if kind in levels:
            return int(levels[levels.index(kind) + 1])
    raise AssertionError(topic)


def test_a_continuous_plans_bridges_carry_every_epoch_and_every_result_once() -> None:
    plan = build_plan(dataclasses.replace(_plan(), schedule=EpochTimetable(10.0, 0.0, 2)))
    site_of, deployment = plan.site_of, f"nlagg/{RUN}"
    shared = topics(deployment, "e0", shared=True)  # every epoch's status and key topics

    def epoch(topic: str) -> str:
        return topic.replace(f"{deployment}/", f"{deployment}/+/", 1)

    want: set[tuple[int, str]] = set()  # (destination site, topic or pattern)
    t = topics("nlagg", RUN)
    for u, v in cut_edges(plan.edges, site_of):
        for i, j in ((u, v), (v, u)):
            want |= {(site_of[j], epoch(t.x(i))), (site_of[j], epoch(t.z0(i, j)))}
            want |= {(site_of[j], shared.key(i)), (site_of[j], shared.status(i))}
    want |= {(s, results_topic("nlagg", RUN, i)) for i in range(24) for s in range(3) if s != site_of[i]}
    got: list[tuple[int, str]] = []
    for b in plan.bridges:
        got += [(b.remote, topic) for topic in b.out_topics] + [(b.local, topic) for topic in b.in_topics]
        # loop-free: a bridge carries only its own two sites' nodes' topics, each one way
        from_sites = [(b.local, topic) for topic in b.out_topics] + [
            (b.remote, topic) for topic in b.in_topics
        ]
        assert all(site_of[_sender(topic)] == s for s, topic in from_sites)
    assert len(got) == len(set(got))  # no topic reaches a site twice
    assert set(got) == want
    x, z0 = epoch(t.x(3)), epoch(t.z0(3, 4))
    for run in ("e0", "e7", "e7r"):  # every epoch and cold rerun
        assert topic_matches(x, topics(deployment, run).x(3))
        assert topic_matches(z0, topics(deployment, run).z0(3, 4))


def test_a_continuous_plan_bridges_sites_without_a_cut_edge_for_the_results() -> None:
    path = [[1], [0, 2], [1]]  # sites 0 and 2 share no edge
    bridges = plan_bridges("nlagg", RUN, path, [0, 1, 2], epochs=True)
    assert [(b.local, b.remote) for b in bridges] == [(0, 1), (0, 2), (1, 2)]
    assert (bridges[1].out_topics, bridges[1].in_topics) == (
        (results_topic("nlagg", RUN, 0),),
        (results_topic("nlagg", RUN, 2),),
    )
    assert [(b.local, b.remote) for b in plan_bridges("nlagg", RUN, path, [0, 1, 2])] == [(0, 1), (1, 2)]


def test_delivery_model_of_one_site_is_two_per_edge_plus_the_eavesdropper() -> None:
    plan = build_plan(_plan(100, 4))
    assert delivery_model(plan.neighbours, [0] * 100) == [2 * len(plan.edges) + 100]
    split = delivery_model(plan.neighbours, plan.site_of)
    cut = len(cut_edges(plan.edges, plan.site_of))
    assert sum(split) >= 2 * len(plan.edges) + 100
    assert max(split) < 0.35 * (2 * len(plan.edges) + 100)
    assert cut > 0


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ([[0, 1, 2], [3, 4]], "nodes in no site"),
        ([[0, 1, 2], [2, 3, 4, 5]], "node in two sites"),
        ([[0, 1, 2, 3, 4, 9], [5]], "node ids must lie in 0..5"),
        ([[0, 1, 2, 3, 4, 5]], "at least 2 lists"),
    ],
    ids=["missing", "twice", "out-of-range", "one-site"],
)
def test_a_bad_sites_file_names_the_problem(tmp_path: Path, groups: list[list[int]], match: str) -> None:
    path = tmp_path / "sites.json"
    path.write_text(json.dumps(groups))
    with pytest.raises(ConfigError, match=match):
        read_sites_file(path, 6)


def test_a_sites_file_assigns_nodes_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "sites.json"
    path.write_text(json.dumps([[0, 2, 4], [1, 3, 5]]))
    site_of = read_sites_file(path, 6)
    spec = PlanSpec(
        run=load_config(None, op="max", n=6, graph="ring", seed=1), run_id=RUN, seed=1, site_of=tuple(site_of)
    )
    plan = build_plan(spec)
    assert plan.site_of == [0, 1, 0, 1, 0, 1]
    assert [node.broker for node in plan.nodes] == ["mqtt://127.0.0.1:1883", "mqtt://127.0.0.1:1884"] * 3


def test_tls_sites_listen_and_bridge_with_the_plans_ca(tmp_path: Path) -> None:
    spec = PlanSpec(
        run=load_config(None, op="max", n=6, graph="ring"),
        run_id=RUN,
        seed=1,
        sites=2,
        broker_url="mqtts://pi.lan:8883",
        make_tls=True,
        require_certificate=True,
    )
    plan = build_plan(spec)
    write_plan(plan, tmp_path)
    assert plan.site_urls == ["mqtts://pi.lan:8883", "mqtts://pi.lan:8884"]
    assert {node.ca_file for node in plan.nodes} == {"tls/ca.pem"}
    ca = x509.load_pem_x509_certificate((tmp_path / "tls" / "ca.pem").read_bytes())
    for s in range(2):
        tls = tmp_path / "broker" / f"site{s}" / "tls"
        server = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
        server.verify_directly_issued_by(ca)
        names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "pi.lan" in names.get_values_for_type(x509.DNSName)
        assert oct((tls / "server.key").stat().st_mode & 0o777) == "0o600"
        conf = (tmp_path / "broker" / f"site{s}" / "mosquitto.conf").read_text().splitlines()
        assert {f"certfile broker/site{s}/tls/server.pem", "require_certificate true"} <= set(conf)
    (bridge,) = plan.bridges
    bridge_cert = x509.load_pem_x509_certificate((tmp_path / "broker/site0/tls/bridge0-1.crt").read_bytes())
    bridge_cert.verify_directly_issued_by(ca)
    assert bridge_cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == bridge.user
    conf0 = (tmp_path / "broker" / "site0" / "mosquitto.conf").read_text().splitlines()
    assert conf0[conf0.index("address pi.lan:8884") :][-len(bridge.out_topics) - len(bridge.in_topics) - 5 :][
        :5
    ] == [
        "bridge_cafile broker/site0/tls/ca.pem",
        "bridge_tls_version tlsv1.2",
        "bridge_insecure false",
        "bridge_certfile broker/site0/tls/bridge0-1.crt",
        "bridge_keyfile broker/site0/tls/bridge0-1.key",
    ]


# On real Mosquitto ---------------------------------------------------------------------------------


class _Client:
    """A paho client on one site broker, collecting what it receives."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.port = int(url.rsplit(":", 1)[1])
        self.got: queue.Queue[tuple[str, bool]] = queue.Queue()
        self.refused: int | None = None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
        self.client.username_pw_set(user, password)
        self.client.on_message = lambda _c, _u, m: self.got.put((m.topic, bool(m.retain)))
        connected = queue.Queue[int]()
        self.client.on_connect = lambda _c, _u, _f, rc, _p: connected.put(rc.value)
        self.client.connect("127.0.0.1", self.port)
        self.client.loop_start()
        rc = connected.get(timeout=10)
        if rc != 0:
            self.refused = rc
            self.close()

    def subscribe(self, *filters: str) -> None:
        """Subscribe and wait for the broker's SUBACK."""
        acked = queue.Queue[int]()
        self.client.on_subscribe = lambda _c, _u, mid, _rc, _p: acked.put(mid)
        for f in filters:
            _, mid = self.client.subscribe(f, qos=1)
            assert acked.get(timeout=10) == mid

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=5)

    def received(self, within: float = 1.5) -> set[str]:
        return set(self.retain_flags(within))

    def retain_flags(self, within: float = 1.5) -> dict[str, bool]:
        """Each topic received (until ``within`` s pass without one) and the retain flag it came with."""
        out: dict[str, bool] = {}
        try:
            while True:
                topic, retained = self.got.get(timeout=within)
                out[topic] = retained
        except queue.Empty:
            return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.mosquitto
async def test_site_credentials_reach_only_their_site_and_the_cut(tmp_path: Path) -> None:
    cfg = load_config(None, op="max", n=24, graph="rgg", seed=5, t_max=20)
    async with PlanBed(cfg, tmp_path, sites=3, capture=False) as bed:
        plan, t = bed.plan, topics("nlagg", RUN)
        site_of = plan.site_of

        def inner_nodes(here: int, there: int) -> list[int]:
            """Nodes of site ``there`` with no neighbour at site ``here`` (their topics stay there)."""
            return [
                j
                for j in range(24)
                if site_of[j] == there and here not in {site_of[i] for i in plan.neighbours[j]}
            ]

        here, there = next((h, o) for h in range(3) for o in range(3) if h != o and inner_nodes(h, o))
        inner = inner_nodes(here, there)
        a = next(i for i in range(24) if site_of[i] == here)  # a node of site `here`
        shown = next(j for j in range(24) if site_of[j] == there and j not in inner)  # a boundary node
        # and one of site `here` with a neighbour `far` at site `there`: their keys cross the bridge
        # the other way (one of the two ways is the bridge's `out`, the other its `in`)
        back, far = next(
            (i, j) for i in range(24) for j in plan.neighbours[i] if (site_of[i], site_of[j]) == (here, there)
        )
        near = next(i for i in plan.neighbours[shown] if site_of[i] == here)

        def as_node(i: int) -> _Client:
            return _Client(bed.site_urls[site_of[i]], f"node{i}", bed.password(f"node{i}"))

        def run_checks() -> dict[str, Any]:
            out: dict[str, Any] = {}
            # node a at another site's broker: not a user there
            out["foreign"] = _Client(bed.site_urls[there], f"node{a}", bed.password(f"node{a}")).refused
            spy = as_node(a)
            spy.subscribe(t.x("+"), t.status("+"), t.z0("+", "+"), t.key("+"))
            eaves0 = _Client(bed.site_urls[here], "eavesdropper", bed.password("eavesdropper"))
            eaves0.subscribe(t.x("+"), t.key("+"))
            for j in [inner[0], shown, back]:
                pub = as_node(j)
                pub.publish(t.x(j), b"{}")
                pub.publish(t.key(j), b"{}", retain=True)  # as a sealed run's node does, before `online`
                pub.close()
            out["spy"] = spy.received()
            out["eaves0"] = eaves0.received(0.5)
            # a neighbour that subscribes later still gets the bridged key, retained, both ways
            late = {}
            for reader, j in [(near, shown), (far, back)]:
                sub = as_node(reader)
                sub.subscribe(t.key(j))
                late[reader] = sub.retain_flags(1.0)
                sub.close()
            out["late"] = late
            # a bridge account may relay only its own topics: anything else it sends is dropped
            bridge = next(b for b in plan.bridges if {b.local, b.remote} == {here, there})
            relay = _Client(bed.site_urls[bridge.remote], bridge.user, bed.password(bridge.user))
            eaves1 = _Client(bed.site_urls[bridge.remote], "eavesdropper", bed.password("eavesdropper"))
            eaves1.subscribe(t.x("+"), t.key("+"))
            eaves1.received(0.5)  # the keys retained there so far
            # forging the x or key of a node at the bridge's remote site: not topics the bridge relays
            victim = next(j for j in range(24) if site_of[j] == bridge.remote)
            assert t.x(victim) not in bridge.out_topics
            assert t.key(victim) not in bridge.out_topics
            relay.publish(t.x(victim), b"{}")
            relay.publish(t.key(victim), b"{}", retain=True)
            out["forged"] = eaves1.received(1.0)
            for c in (spy, eaves0, relay, eaves1):
                c.close()
            return out

        out = await asyncio.to_thread(run_checks)
    assert out["foreign"] == 135  # refused: not authorized (CONNACK code 5 in MQTT 3.1.1)
    assert t.x(inner[0]) not in out["eaves0"]  # never bridged to site 0
    assert t.x(shown) in out["eaves0"]  # a boundary node's x is
    assert t.key(inner[0]) not in out["eaves0"]  # and so is its key, an inner node's not
    assert t.key(shown) in out["eaves0"]
    assert out["late"] == {near: {t.key(shown): True}, far: {t.key(back): True}}
    assert t.x(inner[0]) not in out["spy"]
    assert out["spy"] <= {t.x(j) for j in plan.neighbours[a]} | {t.key(j) for j in plan.neighbours[a]}
    assert out["forged"] == set()


@pytest.fixture
def sites_net() -> Iterator[Net]:
    """Namespaces site0, site1, site2 (a site broker and its nodes each) and eaves (the eavesdropper
    and the launcher), joined by a bridge, links unimpaired; removed, with their processes, after."""
    with network({**{f"site{s}": f"{SUBNET}.{10 + s}" for s in range(3)}, "eaves": EAVES_IP}) as net:
        yield net


def _assert_placed(bed: PlanBed, net: Net) -> None:
    """Each site broker's log shows exactly its own nodes connecting from its namespace, and the
    eavesdropper, the launcher and the bridges dialled to it from theirs."""
    for s, broker in enumerate(bed.brokers):
        assert broker.log_path is not None
        text = broker.log_path.read_text(errors="replace")
        seen = set(re.findall(r"New (?:client|bridge) connected from ([\d.]+):\d+ as (\S+) ", text))
        here = net.address(f"site{s}")
        want = {(here, f"node{i}") for i, site in enumerate(bed.plan.site_of) if site == s}
        want |= {(EAVES_IP, "eavesdropper"), (EAVES_IP, "launcher")}
        want |= {(net.address(f"site{b.local}"), b.user) for b in bed.plan.bridges if b.remote == s}
        assert seen == want, (s, sorted(seen ^ want))


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.mosquitto
@pytest.mark.parametrize(
    "params",
    [
        # early stopping (the default) ends max at t = 1357 on this RGG, exact (a cap of 2000)
        pytest.param({"op": "max", "seed": 6, "t_max": 2000, "c": 1.0, "mu_z": 3.0}, id="max"),
        # c = 1: the lower middle value of 24 within 1e-9 from t = 1810, the stop at 1995 (a cap of 3000)
        pytest.param({"op": "median", "seed": 5, "t_max": 3000, "c": 1.0, "mu_z": 30.0}, id="median"),
    ],
)
@pytest.mark.timeout(900)
async def test_three_bridged_sites_are_exact_and_captured_once(
    tmp_path: Path, sites_net: Net, params: dict[str, Any]
) -> None:
    cfg = load_config(None, n=24, graph="rgg", **params)
    async with PlanBed(cfg, tmp_path, sites=3, net=sites_net) as bed:
        assert len(bed.plan.bridges) == 3
        await bed.start_nodes()
        verdict = await bed.finish(within=600)
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, (verdict.detail, bed.report())  # every node's output is the simulator's
    assert (verdict.lost, verdict.extra, verdict.rejected_by_eavesdropper) == (0, 0, 0)
    _assert_placed(bed, sites_net)
    sim = simulate(bed.cfg)
    (lo, hi), *_ = reversed(phase_targets(bed.cfg, plan_phases(bed.cfg), sim.values))
    assert np.all((lo[0] - 1e-9 <= sim.output[0]) & (sim.output[0] <= hi[0] + 1e-9))  # exact


@pytest.mark.slow
@pytest.mark.mosquitto
async def test_a_sealed_run_across_three_bridged_sites_is_exact(tmp_path: Path) -> None:
    # op average with init_channel auto: every z^(0) is sealed, so each node first needs every
    # neighbour's public key (retained on node/i/key), those of its other-site neighbours bridged
    # in. c = 0.3: the average is exact (to 1e-9) by t = 60.
    cfg = load_config(None, op="average", n=10, graph="rgg", seed=5, t_max=60, c=0.3)
    async with PlanBed(cfg, tmp_path, sites=3) as bed:
        assert sealed_groups_of(bed.cfg, bed.phases) == {"average"}
        assert len(bed.plan.bridges) == 3
        await bed.start_nodes()
        verdict = await bed.finish(within=90)
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, (verdict.detail, bed.report())
    # every x is captured once; no z^(0) is (each is sealed, at every site)
    assert (verdict.extra, verdict.rejected_by_eavesdropper) == (0, 0)
    assert verdict.lost == 2 * len(bed.plan.edges)
    sim = simulate(bed.cfg)
    ((mean, _),) = phase_targets(bed.cfg, bed.phases, sim.values)
    assert np.all(np.abs(sim.output[0] - mean[0]) <= 1e-9 * np.ptp(sim.values[0]))  # = every node's output


@pytest.mark.mosquitto
async def test_two_sites_bridged_over_tls_with_client_certificates_are_exact(tmp_path: Path) -> None:
    # Every listener TLS only, every client (bridge included) with a certificate of the plan's CA.
    cfg = load_config(None, op="max", n=8, graph="rgg", seed=5, t_max=600, c=1.0, mu_z=3.0)
    async with PlanBed(cfg, tmp_path, sites=2, tls=True, require_certificate=True) as bed:
        assert [url.split(":")[0] for url in bed.site_urls] == ["mqtts", "mqtts"]
        assert len(bed.plan.bridges) == 1
        await bed.start_nodes()
        verdict = await bed.finish(within=120)
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, (verdict.detail, bed.report())  # every node's output is the simulator's
    assert (verdict.lost, verdict.extra, verdict.rejected_by_eavesdropper) == (0, 0, 0)
    sim = simulate(bed.cfg)
    assert np.all(np.abs(sim.output[0] - np.max(sim.values[0])) <= 1e-9)  # exact


@pytest.mark.mosquitto
async def test_a_continuous_plan_runs_two_epochs_across_two_bridged_sites(tmp_path: Path) -> None:
    # --sites 2 --every 10 --epochs 2: the plan's own site brokers, bridges and ACLs; the nodes'
    # epoch topics cross through the bridge's + level, every node's results reach both sites, and
    # the continuous eavesdropper (one session per site) closes both epochs.
    cfg = load_config(None, op="median", n=5, graph="complete", value_range=(0.0, 100.0), seed=5)
    load = contention()  # a busy machine gets longer epochs, not skipped ones
    # the brokers, bridges and captures start before the origin
    schedule = EpochTimetable(stretched(10.0, load), time.time() + stretched(20.0, load), 2)
    async with PlanBed(cfg, tmp_path, sites=2, schedule=schedule, eavesdrop_args=["--epochs", "2"]) as bed:
        ((bridge_in, bridge_out),) = [(b.in_topics, b.out_topics) for b in bed.plan.bridges]
        assert any("/+/node/" in topic for topic in bridge_in + bridge_out)
        await bed.start_nodes()
        detail: list[str] = []
        async with asyncio.timeout(stretched(120.0, load)):
            reports = [(await proc.communicate())[0].decode() for proc in bed.nodes.values()]
            codes = [proc.returncode for proc in bed.nodes.values()]
            await bed.wait_eavesdropper(detail)
        heard: dict[int, set[int]] = {}  # site -> the nodes whose retained output it holds
        verifier = Verifier([identity.public for identity in bed.plan.identities])
        for s, url in enumerate(bed.site_urls):
            async with MqttTransport(
                url, client_id=f"op{s}", username="launcher", password=bed.password("launcher")
            ) as t:
                await t.subscribe(results_filter("nlagg", RUN))
                got: set[int] = heard.setdefault(s, set())
                async with asyncio.timeout(10):
                    async for msg in t.messages():
                        got.add(published_record(msg.topic, msg.payload, verifier).node)  # signed
                        if len(got) == 5:
                            break
    assert codes == [0] * 5, (reports, bed.report())
    assert not detail, (detail, bed.report())
    assert heard == {0: set(range(5)), 1: set(range(5))}
    median = sorted(float((bed.root / "values" / f"{i}.txt").read_text()) for i in range(5))[2]
    for text in reports:
        rows = [json.loads(line) for line in text.splitlines()]
        assert [r["epoch"] for r in rows] == [0, 1]
        assert all(r["output"] == pytest.approx(median, abs=bed.cfg.tolerance * 100) for r in rows), rows
    assert bed.eavesdropper_finished["epochs"] == [0, 1], bed.report()
    with EpochStore(bed.root / "epochs", read_only=True) as store:
        summaries = [row.summary or {} for row in store.epochs()]
        results = store.results()
    assert [(s["epoch"], s["complete"], s["rejected"]) for s in summaries] == [(0, True, 0), (1, True, 0)]
    assert sorted((r.epoch, r.node) for r in results) == [(k, i) for k in (0, 1) for i in range(5)]


@pytest.mark.mosquitto
async def test_one_capture_of_two_brokers_stores_each_message_once_in_causal_order(tmp_path: Path) -> None:
    cfg = load_config(None, op="max", n=3, graph="ring", t_max=5, seed=1, early_stop=False).resolved()
    phase = plan_phases(cfg)[0].name
    t = topics("nlagg", "two")

    def x(i: int, step: int) -> tuple[str, bytes]:
        return t.x(i), encode_x(node=i, t=step, phase=phase, x=1.0 + i)

    async with start_mosquitto() as a, start_mosquitto() as b:
        subs = [MqttTransport(h.url, client_id="eve", manual_ack=True, connect_within=10) for h in (a, b)]
        with Transcript(tmp_path / "t.sqlite", run_id="two") as transcript:
            async with (
                MergedSubscriber(subs) as merged,
                MqttTransport(a.url, client_id="pa") as pa,
                MqttTransport(b.url, client_id="pb") as pb,
            ):
                config = build_config_msg(cfg, "two", run_edges(cfg))
                eaves = Eavesdropper(merged, transcript, config=config, reorder_grace=1.0)
                task = asyncio.create_task(eaves.run())
                await eaves.subscribed.wait()
                await pb.publish(*x(1, 1))  # overtook x^(0) of its neighbours (on the other broker)
                await pb.publish(*x(2, 3))  # far ahead: never valid
                for i in range(3):
                    await pa.publish(*x(i, 0))
                await pb.publish(*x(0, 0))  # a bridged copy
                async with asyncio.timeout(20):
                    while True:  # polled: the capture runs in its own task
                        if eaves.rejected and sum(s.acked for s in subs) == 6:
                            break
                        await asyncio.sleep(0.05)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            stored = transcript.count()
            x_arr = transcript.x(3, 5)
    assert stored == 5  # 6 deliveries, the bridged copy stored once
    assert np.array_equal(~np.isnan(x_arr[:, :2]), [[True, False], [True, True], [True, False]])
    assert np.isnan(x_arr[2, 3])  # the one far ahead waited its grace, then was rejected
    assert (eaves.captured, eaves.rejected) == (6, 1)
    assert sum(s.acked for s in subs) == 6  # every delivery acknowledged to its own broker


def _cli(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", ["nlagg", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def test_plan_with_sites_writes_one_broker_per_site(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plan"
    base = ["deploy", "plan", "--out", str(out), "--run-id", "r1", "--n", "24", "--seed", "5"]
    code, text = _cli([*base, "--sites", "3", "--broker", "mqtt://10.0.0.1:1883"], capsys, monkeypatch)
    assert code == 0, text
    assert "3 sites of [8, 8, 8] nodes" in text
    lines = (out / "commands.txt").read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("mosquitto ")] == [
        f"mosquitto -c broker/site{s}/mosquitto.conf" for s in range(3)
    ]
    (eaves,) = [ln for ln in lines if ln.startswith("nlagg eavesdrop")]
    assert [f"mqtt://10.0.0.1:{1883 + s}" in eaves for s in range(3)] == [True] * 3
    (launcher,) = [ln for ln in lines if ln.startswith("nlagg deploy publish-config")]
    # One launcher for every site: one signed config, one run instance the sites' nodes share.
    assert [f"--broker mqtt://10.0.0.1:{1883 + s}" in launcher for s in range(3)] == [True] * 3
    site_of = tomllib.loads((out / "plan.toml").read_text())["plan"]["sites"]["site_of"]
    for i in range(24):
        node = tomllib.loads((out / "nodes" / f"{i}.toml").read_text())
        assert node["broker"] == f"mqtt://10.0.0.1:{1883 + site_of[i]}"
        users = (out / "broker" / f"site{site_of[i]}" / "passwd").read_text()
        assert f"node{i}:" in users
        other = (out / "broker" / f"site{(site_of[i] + 1) % 3}" / "passwd").read_text()
        assert f"node{i}:" not in other
    assert oct((out / "broker" / "site0" / "mosquitto.conf").stat().st_mode & 0o777) == "0o600"
    assert not (out / "broker" / "mosquitto.conf").exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--sites", "2", "--tls", *("--site-broker", "mqtt://a:1883") * 2], "site_broker="),
        (["--sites", "30"], "sites=30"),
        (["--sites", "2", "--site-broker", "mqtt://a:1883"], "site_broker="),
    ],
    ids=["tls-with-plain-site-brokers", "more-sites-than-nodes", "one-url-for-two-sites"],
)
def test_bad_site_options_name_the_option(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    field: str,
) -> None:
    args = ["deploy", "plan", "--out", str(tmp_path / "p"), "--run-id", "r1", "--n", "24", "--seed", "5"]
    code, text = _cli([*args, *extra], capsys, monkeypatch)
    assert code == 2
    assert field in text
    assert "Traceback" not in text
