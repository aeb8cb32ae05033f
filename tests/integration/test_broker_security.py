"""The generated password file and ACL on a real Mosquitto: nobody gets in or through where they don't belong.

Each negative check is paired with a positive one on the same connection (a message that
must arrive), so "nothing was delivered" is observed after the broker provably routed later
traffic, not after an arbitrary sleep.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import stat
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, TlsFiles, build_plan, security_lines, verify_password, write_plan
from nlagg_node.deploy.mosquitto_auth import MAX_PACKET_BYTES
from nlagg_node.runtime.brokers import BrokerHandle, start_mosquitto
from nlagg_node.runtime.wire import MAX_PAYLOAD_BYTES

pytestmark = pytest.mark.mosquitto

RUN = "sec"
ROOT = f"nlagg/{RUN}"
WAIT = 5.0
# ring of 6: node 0's neighbours are 1 and 5; node 3 is not a neighbour of 0.


@dataclass
class Plan:
    root: Path

    def password(self, user: str) -> str:
        return (self.root / "secrets" / f"{user}.pw").read_text().strip()


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    run = load_config(None, op="max", n=6, graph="ring")
    out = tmp_path_factory.mktemp("secplan") / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id=RUN, seed=1, corrupt="2,")), out)
    return Plan(out)


@pytest.fixture
async def broker(plan: Plan) -> AsyncIterator[BrokerHandle]:
    lines = security_lines(str(plan.root / "broker" / "passwd"), str(plan.root / "broker" / "acl"))
    # As root Mosquitto would drop to 'mosquitto', which cannot enter pytest's 0700 temp dirs.
    async with start_mosquitto(extra_lines=[*lines, "user root"], allow_anonymous=False) as handle:
        yield handle


class Client:
    """A blocking paho client: connect, subscribe, publish QoS 1 and wait for delivery."""

    def __init__(
        self, broker: BrokerHandle, user: str | None, password: str | None, client_id: str | None = None
    ) -> None:
        self.inbox: queue.Queue[tuple[str, bytes | bytearray]] = queue.Queue()
        self.connack: queue.Queue[int] = queue.Queue()
        self.disconnects = 0
        cid = client_id or f"t-{uuid.uuid4().hex[:8]}"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid)
        if user is not None:
            self.client.username_pw_set(user, password)
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda _c, _u, msg: self.inbox.put((msg.topic, msg.payload))
        self.subacks: queue.Queue[int] = queue.Queue()
        self.client.on_subscribe = lambda _c, _u, mid, _rc, _p: self.subacks.put(mid)
        self.disconnected = threading.Event()  # set by paho's thread: wait on it, never read it at once
        self.client.on_disconnect = lambda *_a: self._on_disconnect()
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        self.rc = self.connack.get(timeout=WAIT)

    def _on_disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected.set()

    def _on_connect(self, client: mqtt.Client, _u: object, _f: object, rc: object, _p: object) -> None:
        code = int(rc.value)  # type: ignore[attr-defined]
        if code != 0:
            client.disconnect()  # refused: stop paho's reconnect loop at once
        self.connack.put(code)

    def subscribe(self, topic: str) -> None:
        rc, mid = self.client.subscribe(topic, qos=1)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        assert self.subacks.get(timeout=WAIT) == mid  # active before anything is published

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(timeout=WAIT)

    def received_until(self, marker: bytes) -> list[tuple[str, bytes | bytearray]]:
        """Every message up to and including the one whose payload is ``marker``."""
        got = []
        while True:
            item = self.inbox.get(timeout=WAIT)
            got.append(item)
            if item[1] == marker:
                return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Connect(Protocol):
    """The ``connect`` fixture: a :class:`Client` for ``user`` (online or refused), closed after the test."""

    def __call__(
        self, user: str | None, password: str | None = None, client_id: str | None = None
    ) -> Client: ...


@pytest.fixture
def connect(broker: BrokerHandle, plan: Plan) -> Iterator[Connect]:
    clients: list[Client] = []

    def _connect(user: str | None, password: str | None = None, client_id: str | None = None) -> Client:
        pw = plan.password(user) if user is not None and password is None else password
        client = Client(broker, user, pw, client_id)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        client.close()


def _online(connect: Connect, user: str) -> Client:
    client = connect(user)
    assert client.rc == 0, f"{user} refused: rc={client.rc}"
    return client


def test_forged_topics_are_delivered_to_no_one(connect: Connect) -> None:
    spy = _online(connect, "eavesdropper")
    spy.subscribe(f"{ROOT}/#")
    victim_nbr = _online(connect, "node0")  # neighbour of node 1: would read node/1/x if it were real
    victim_nbr.subscribe(f"{ROOT}/#")
    forger = _online(connect, "node1")  # honest: may not impersonate anyone
    forged = [
        f"{ROOT}/node/0/x",  # a neighbour's x
        f"{ROOT}/node/5/status",
        f"{ROOT}/edge/0/1/z0",  # a z0 in the other direction
        f"{ROOT}/edge/1/3/z0",  # to a non-neighbour
        f"{ROOT}/adv/1/state",  # honest node posing as corrupted
        f"{ROOT}/config",  # only the launcher
        "nlagg/other-run/node/1/x",
    ]
    for topic in forged:
        forger.publish(topic, b"forged")
    forger.publish(f"{ROOT}/node/1/x", b"legit-1")
    assert spy.received_until(b"legit-1") == [(f"{ROOT}/node/1/x", b"legit-1")]
    assert victim_nbr.received_until(b"legit-1") == [(f"{ROOT}/node/1/x", b"legit-1")]


def test_corrupted_node_may_publish_its_adversary_state(connect: Connect) -> None:
    spy = _online(connect, "eavesdropper")
    spy.subscribe(f"{ROOT}/#")
    corrupted = _online(connect, "node2")
    corrupted.publish(f"{ROOT}/adv/3/state", b"not-mine")
    corrupted.publish(f"{ROOT}/adv/2/state", b"adv-2")
    assert spy.received_until(b"adv-2") == [(f"{ROOT}/adv/2/state", b"adv-2")]


def test_non_neighbour_topics_are_never_received(connect: Connect) -> None:
    node0 = _online(connect, "node0")
    node0.subscribe(f"{ROOT}/#")
    far = _online(connect, "node3")  # not a neighbour of 0
    far.publish(f"{ROOT}/node/3/x", b"far-x")
    far.publish(f"{ROOT}/edge/3/2/z0", b"far-z0")
    near = _online(connect, "node1")
    near.publish(f"{ROOT}/edge/1/2/z0", b"addressed-to-2")  # neighbour's z0 meant for someone else
    near.publish(f"{ROOT}/edge/1/0/z0", b"z0-for-0")
    corrupted = _online(connect, "node2")
    corrupted.publish(f"{ROOT}/adv/2/state", b"adv-2")
    near.publish(f"{ROOT}/node/1/x", b"near-x")
    got = node0.received_until(b"near-x")
    assert got == [(f"{ROOT}/edge/1/0/z0", b"z0-for-0"), (f"{ROOT}/node/1/x", b"near-x")]


def test_another_nodes_client_id_takes_over_nothing(connect: Connect) -> None:
    victim = connect("node0", client_id=f"nlagg-{RUN}-node-0")
    assert victim.rc == 0
    victim.subscribe(f"{ROOT}/node/1/x")
    # node 1's credentials with node 0's client id: without use_username_as_clientid the broker
    # would close node 0's connection and hand its persistent session to the intruder.
    intruder = connect("node1", client_id=f"nlagg-{RUN}-node-0")
    assert intruder.rc == 0  # let in, under its own user name as client id
    intruder.subscribe(f"{ROOT}/#")
    intruder.publish(f"{ROOT}/node/1/x", b"after-takeover")
    assert victim.received_until(b"after-takeover") == [(f"{ROOT}/node/1/x", b"after-takeover")]
    assert victim.disconnects == 0


def test_payloads_over_the_protocols_limit_are_dropped_by_the_broker(connect: Connect) -> None:
    spy = _online(connect, "eavesdropper")
    spy.subscribe(f"{ROOT}/#")
    node1 = _online(connect, "node1")
    node1.client.publish(f"{ROOT}/node/1/x", b"A" * (MAX_PAYLOAD_BYTES + 1), qos=1)  # within the packet cap
    node1.publish(f"{ROOT}/node/1/x", b"small")
    assert spy.received_until(b"small") == [(f"{ROOT}/node/1/x", b"small")]
    assert node1.disconnects == 0


def test_packets_over_the_brokers_limit_cut_their_sender_off(connect: Connect) -> None:
    spy = _online(connect, "eavesdropper")
    spy.subscribe(f"{ROOT}/#")
    node1 = _online(connect, "node1")
    node1.client.publish(f"{ROOT}/node/1/x", b"A" * (MAX_PACKET_BYTES + 1), qos=1)
    node2 = _online(connect, "node2")
    node2.publish(f"{ROOT}/node/2/x", b"marker")
    assert spy.received_until(b"marker") == [(f"{ROOT}/node/2/x", b"marker")]
    # paho's thread sees the broker close node 1's connection in its own time (a loaded CI run's
    # check right after the marker found none yet)
    assert node1.disconnected.wait(WAIT)


def test_eavesdropper_cannot_publish(connect: Connect) -> None:
    spy = _online(connect, "eavesdropper")
    spy.subscribe(f"{ROOT}/#")
    node0 = _online(connect, "node0")
    node0.subscribe(f"{ROOT}/#")
    for topic in (f"{ROOT}/node/1/x", f"{ROOT}/edge/1/0/z0", f"{ROOT}/config", f"{ROOT}/adv/2/state"):
        spy.publish(topic, b"injected")
    launcher = _online(connect, "launcher")
    launcher.publish(f"{ROOT}/config", b"config")
    assert spy.received_until(b"config") == [(f"{ROOT}/config", b"config")]
    assert node0.received_until(b"config") == [(f"{ROOT}/config", b"config")]


@pytest.mark.parametrize(
    ("user", "password"),
    [("node0", "wrong"), ("node1", ""), ("eavesdropper", "node0"), ("nobody", "x"), (None, None)],
    ids=["wrong-password", "empty-password", "username-as-password", "unknown-user", "anonymous"],
)
def test_bad_credentials_are_refused(
    connect: Connect, plan: Plan, user: str | None, password: str | None
) -> None:
    client = connect(user, password)
    assert client.rc in (4, 5, 134, 135), f"{user!r} was let in (rc={client.rc})"
    good = connect("node0")
    assert good.rc == 0


def test_password_hashes_interoperate_with_mosquitto_passwd(tmp_path: Path, plan: Plan) -> None:
    exe = shutil.which("mosquitto_passwd")
    if exe is None:
        pytest.skip("mosquitto_passwd not installed")
    pw_file = tmp_path / "pw"
    subprocess.run([exe, "-c", "-b", str(pw_file), "alice", "s3cret pass"], check=True, capture_output=True)
    user, hashed = pw_file.read_text().strip().split(":", 1)
    assert user == "alice"
    assert hashed.startswith("$7$")
    assert verify_password("s3cret pass", hashed)
    assert not verify_password("s3cret pas", hashed)
    assert os.path.getsize(plan.root / "broker" / "passwd") > 0


def _make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl)."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=nlagg-test-ca",
        "-days",
        "2",
    )
    ssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    )
    return d / "ca.pem", d / "server.pem", d / "server.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
async def test_tls_listener_of_the_generated_config(tmp_path: Path) -> None:
    from nlagg_node.runtime.brokers import free_port

    ca, cert, key = _make_certs(tmp_path)
    port = free_port()
    run = load_config(None, op="max", n=3, graph="ring")
    spec = PlanSpec(
        run=run,
        run_id=RUN,
        seed=1,
        listen_host="127.0.0.1",
        listen_port=port,
        broker_url=f"mqtts://127.0.0.1:{port}",
        tls=TlsFiles(str(ca), str(cert), str(key)),
    )
    root = tmp_path / "plan"
    write_plan(build_plan(spec), root)
    conf = (root / "broker" / "mosquitto.conf").read_text()
    assert "cafile broker/tls/ca.pem" in conf
    assert stat.S_IMODE((root / "broker" / "tls" / "server.key").stat().st_mode) == 0o600
    # The whole generated file, as a second listener next to the fixture's plain loopback one.
    async with start_mosquitto(
        extra_config=root / "broker" / "mosquitto.conf",
        workdir=root,
        extra_lines=["user root"],
        allow_anonymous=False,
    ) as handle:
        tls_broker = BrokerHandle("mosquitto", "127.0.0.1", port)
        password = (root / "secrets" / "node0.pw").read_text().strip()

        def connect(tls: bool) -> int:
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
            client.username_pw_set("node0", password)
            if tls:
                client.tls_set(ca_certs=str(ca))
            try:
                client.connect(tls_broker.host, tls_broker.port)
            except (OSError, mqtt.WebsocketConnectionError):
                return -1
            done: queue.Queue[int] = queue.Queue()
            client.on_connect = lambda _c, _u, _f, rc, _p: done.put(int(rc.value))
            client.on_disconnect = lambda *_a: done.put(-2)
            client.loop_start()
            try:
                return done.get(timeout=WAIT)
            finally:
                client.disconnect()
                client.loop_stop()

        assert handle.port != port
        assert await asyncio.to_thread(connect, True) == 0
        assert await asyncio.to_thread(connect, False) != 0  # plain MQTT on the TLS port fails


@pytest.mark.parametrize("require_certificate", [False, True], ids=["password", "password+certificate"])
async def test_generated_ca_secures_the_listener(tmp_path: Path, require_certificate: bool) -> None:
    from nlagg_node.runtime.brokers import free_port

    port = free_port()
    run = load_config(None, op="max", n=3, graph="ring")
    spec = PlanSpec(
        run=run,
        run_id=RUN,
        seed=1,
        listen_host="127.0.0.1",
        listen_port=port,
        broker_url=f"mqtts://127.0.0.1:{port}",
        make_tls=True,
        require_certificate=require_certificate,
    )
    root = tmp_path / "plan"
    write_plan(build_plan(spec), root)
    conf = (root / "broker" / "mosquitto.conf").read_text().splitlines()
    assert ("require_certificate true" in conf) == require_certificate
    for secret in ("secrets/ca.key", "broker/tls/server.key"):
        assert stat.S_IMODE((root / secret).stat().st_mode) == 0o600
    ca = root / "tls" / "ca.pem"
    password = (root / "secrets" / "node0.pw").read_text().strip()
    async with start_mosquitto(
        extra_config=root / "broker" / "mosquitto.conf",
        workdir=root,
        extra_lines=["user root"],
        allow_anonymous=False,
    ):

        def connect(tls: bool, cert: bool) -> int:
            client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
            client.username_pw_set("node0", password)
            if tls:
                files: tuple[str, str] | tuple[None, None] = (
                    (str(root / "secrets" / "node0.crt"), str(root / "secrets" / "node0.key"))
                    if cert
                    else (None, None)
                )
                client.tls_set(ca_certs=str(ca), certfile=files[0], keyfile=files[1])
            done: queue.Queue[int] = queue.Queue()
            client.on_connect = lambda _c, _u, _f, rc, _p: done.put(int(rc.value))
            client.on_disconnect = lambda *_a: done.put(-2)
            try:
                client.connect("127.0.0.1", port)
            except (OSError, mqtt.WebsocketConnectionError):
                return -1
            client.loop_start()
            try:
                return done.get(timeout=WAIT)
            finally:
                client.disconnect()
                client.loop_stop()

        assert await asyncio.to_thread(connect, True, require_certificate) == 0
        assert await asyncio.to_thread(connect, False, False) != 0  # plain MQTT on the TLS port
        if require_certificate:
            assert await asyncio.to_thread(connect, True, False) != 0  # TLS without a client certificate
