"""nlagg over a 2-node RabbitMQ cluster (Debian's rabbitmq-server, MQTT plugin), nodes on both members.

The testbed (:func:`run_testbed`, one process per node) runs against member A: the launcher and the
eavesdropper connect there, the even nodes too, the odd ones to member B. On a ring every edge then
joins the two members, so every x and z^(0) crosses the cluster. What RabbitMQ 3.10 does differently
from Mosquitto, pinned by the first test: a retained message is kept on the member that received
it only, and is never sent for a wildcard filter. The nodes start anyway (a node that missed a
neighbour's retained ``online`` on the other member hears its ``running`` live, which it publishes
only after seeing every neighbour), but the eavesdropper's ``P/R/#`` never gets the retained
``config``: it is given the run's config file (``nlagg eavesdrop --config``), as deploy/README.md says.
Nor does a cluster keep causal order across members: once in CI (2 cores, loaded) the eavesdropper on
member A got 25 x's before the x's of the other member they were computed from, and rejected them;
it runs with ``--broker-cluster``, which holds such an x back until they arrive.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import paho.mqtt.client as mqtt
import pytest
import pytest_asyncio
from paho.mqtt.enums import CallbackAPIVersion

import nlagg_node.lab.children as children
import nlagg_node.lab.testbed as testbed
from adversary.transcript import Transcript
from nlagg_node.argv import eavesdrop_argv, node_argv
from nlagg_node.config import RunConfig
from nlagg_node.sim import simulate
from tests.harness.rabbitmq import RabbitCluster, rabbitmq_scripts, start_rabbitmq_cluster
from tests.harness.transcripts import captured_by_kind
from tests.harness.verdict import assert_transcript_is_simulation

if TYPE_CHECKING:  # a name starting with Test in the module would be collected
    from nlagg_node.lab.summary import TestbedSummary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),  # one cluster (its start takes 20-40 s) for the module
    pytest.mark.skipif(
        rabbitmq_scripts() is None, reason="rabbitmq-server not installed (apt-get install rabbitmq-server)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the cluster runs RabbitMQ as this user: root only"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RabbitCluster]:
    started = time.perf_counter()
    async with start_rabbitmq_cluster(2, workdir=tmp_path_factory.mktemp("rabbitmq")) as c:
        print(f"RabbitMQ {c.version}: 2-member cluster up in {time.perf_counter() - started:.1f} s")
        yield c


class _Client:
    """A paho client on one member (anonymous: guest over loopback), collecting what it receives."""

    def __init__(self, url: str) -> None:
        self.got: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv311
        )
        self.client.on_message = lambda _c, _u, m: self.got.put((m.topic, bytes(m.payload), bool(m.retain)))
        connected = queue.Queue[int]()
        self.client.on_connect = lambda _c, _u, _f, rc, _p: connected.put(rc.value)
        host, port = url.removeprefix("mqtt://").rsplit(":", 1)
        self.client.connect(host, int(port))
        self.client.loop_start()
        assert connected.get(timeout=20) == 0

    def subscribe(self, topic: str) -> None:
        acked = queue.Queue[int]()
        self.client.on_subscribe = lambda _c, _u, mid, _rc, _p: acked.put(mid)
        _, mid = self.client.subscribe(topic, qos=1)
        assert acked.get(timeout=20) == mid

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(timeout=20)

    def received(self, within: float = 2.0) -> list[tuple[str, bytes, bool]]:
        out = []
        try:
            while True:
                out.append(self.got.get(timeout=within))
        except queue.Empty:
            return out

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _probe_retained(a: str, b: str) -> dict[str, Any]:
    """Where a retained message published on member ``a`` is delivered, and whether live ones cross."""
    topic = "probe/run/node/1/status"
    pub = _Client(a)
    pub.publish(topic, b"online", retain=True)
    out: dict[str, Any] = {}
    for name, url, filt in [
        ("b_exact", b, topic),
        ("a_wildcard", a, "probe/run/#"),
        ("a_exact", a, topic),
    ]:
        sub = _Client(url)
        sub.subscribe(filt)
        out[name] = sub.received()
        sub.close()
    watcher = _Client(a)
    watcher.subscribe("probe/run/#")
    live = _Client(b)
    live.publish("probe/run/node/2/x", b"x")
    out["live_b_to_a"] = watcher.received()
    for c in (pub, watcher, live):
        c.close()
    return out


async def test_retained_messages_stay_on_their_member_and_skip_wildcards(cluster: RabbitCluster) -> None:
    a, b = cluster.urls
    got = await asyncio.to_thread(_probe_retained, a, b)
    topic = "probe/run/node/1/status"
    assert got["b_exact"] == []  # node-local retained store: member B never saw it
    assert got["a_wildcard"] == []  # no retained message for a wildcard filter, even on its own member
    assert got["a_exact"] == [(topic, b"online", True)]
    assert got["live_b_to_a"] == [("probe/run/node/2/x", b"x", False)]  # routing crosses members


async def _spread_run(
    cluster: RabbitCluster, cfg: RunConfig, out: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[TestbedSummary, set[str]]:
    """The testbed on member 0, even nodes on member 0 and odd ones on member 1."""
    a, b = cluster.urls
    public = out.parent / f"{out.name}-config.json"  # what the retained config would have said
    public.write_text(
        json.dumps({"config": cfg.resolved().model_copy(update={"trials": 1}).model_dump(mode="json")})
    )
    dialled: set[str] = set()

    def spread(i: int, config: str, broker: str, **kw: Any) -> list[str]:
        assert broker == a
        dialled.add(a if i % 2 == 0 else b)
        return node_argv(i, config, a if i % 2 == 0 else b, **kw)

    def with_config(*args: Any, **kw: Any) -> list[str]:
        return [*eavesdrop_argv(*args, **kw), "--config", str(public), "--broker-cluster"]

    with monkeypatch.context() as m:
        m.setattr(testbed, "node_argv", spread)
        m.setattr(children, "eavesdrop_argv", with_config)
        summary = await testbed.run_testbed(
            cfg, broker_url=a, in_process=False, out_dir=out, neighbour_timeout=60.0
        )
    return summary, dialled


def _check(cfg: RunConfig, summary: TestbedSummary, out: Path) -> None:
    assert summary["exact"], summary
    sim = simulate(cfg.model_copy(update={"trials": 1}))
    finals = np.array([summary["final_x"][str(i)] for i in range(cfg.n)]).reshape(sim.output[0].shape)
    assert np.array_equal(finals, sim.output[0])
    db = out / "transcript.sqlite"
    assert_transcript_is_simulation(cfg, db)  # every x and z^(0), bit for bit
    assert (summary["messages_rejected_by_nodes"], summary["messages_rejected"]) == (0, 0)
    kinds, states, invalid = captured_by_kind(db)
    assert not invalid, invalid
    assert "config" not in kinds  # published retained before the eavesdropper subscribed to P/R/#
    assert sorted(states) == list(range(cfg.n))
    assert all(st[-1] == "done" for st in states.values()), states
    with Transcript(db) as tr:
        assert tr.count() == summary["messages_captured"]


@pytest.mark.parametrize(
    ("runs"),
    [
        (
            RunConfig(op="max", n=6, graph="ring", trials=1, seed=3, t_max=600, c=10.0, mu_z=30.0),
            RunConfig(op="median", n=8, graph="ring", trials=1, seed=3, t_max=2000, c=1.0, mu_z=30.0),
        )
    ],
    ids=["max-n6-median-n8"],
)
async def test_nodes_spread_over_two_members_are_exact_and_bit_equal(
    cluster: RabbitCluster, runs: Sequence[RunConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = []
    for k, cfg in enumerate(runs):
        out = tmp_path / f"run{k}-{cfg.op}"
        summary, dialled = await _spread_run(cluster, cfg, out, monkeypatch)
        assert dialled == set(cluster.urls)
        _check(cfg, summary, out)
        results.append(f"{cfg.op} n={cfg.n}: {summary['rounds_per_second']:.1f} rounds/s")
    print("; ".join(results))
