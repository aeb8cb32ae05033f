"""TLS with a plan's generated CA on a real Mosquitto: the capture's client (manual acks) over mqtts://,
refusals, probes."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from adversary.capture.eavesdropper import ANONYMOUS_WARNING, run_eavesdropper
from adversary.capture.session import CaptureSession
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig, load_config
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.errors import ConfigError, NlaggError
from nlagg_node.runtime.brokers import free_port, start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport, accepts_anonymous
from nlagg_node.runtime.tls import TlsSettings
from tests.harness.planbed import PlanBed
from tests.harness.sniff import sniffing
from tests.harness.tlsbroker import tls_lab_broker

pytestmark = pytest.mark.mosquitto

RUN = "tls"


@dataclass
class TlsBroker:
    root: Path
    url: str
    port: int

    def password(self, user: str) -> str:
        return (self.root / "secrets" / f"{user}.pw").read_text().strip()

    @property
    def ca(self) -> Path:
        return self.root / "tls" / "ca.pem"


@pytest.fixture
async def tls_broker(tmp_path: Path) -> AsyncIterator[TlsBroker]:
    async with plan_tls_broker(tmp_path) as broker:
        yield broker


@asynccontextmanager
async def plan_tls_broker(tmp_path: Path) -> AsyncIterator[TlsBroker]:
    """Mosquitto as ``nlagg deploy plan --tls`` configures it: TLS listener, per-user ACL, no anonymous."""
    port = free_port()
    spec = PlanSpec(
        run=load_config(None, op="max", n=3, graph="ring"),
        run_id=RUN,
        seed=1,
        listen_host="127.0.0.1",
        listen_port=port,
        broker_url=f"mqtts://localhost:{port}",
        make_tls=True,
    )
    root = tmp_path / "plan"
    write_plan(build_plan(spec), root)
    async with start_mosquitto(
        extra_config=root / "broker" / "mosquitto.conf",
        workdir=root,
        extra_lines=["user root"],
        allow_anonymous=False,
    ):
        yield TlsBroker(root, f"mqtts://localhost:{port}", port)


def _publish_tls(broker: TlsBroker, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
    client.username_pw_set("node0", broker.password("node0"))
    client.tls_set(ca_certs=str(broker.ca))
    client.connect("localhost", broker.port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1).wait_for_publish(timeout=5.0)
    finally:
        client.disconnect()
        client.loop_stop()


async def test_capture_client_receives_over_tls(tls_broker: TlsBroker) -> None:
    topic = f"nlagg/{RUN}/node/0/x"
    async with MqttTransport(
        tls_broker.url,
        client_id="eaves",
        manual_ack=True,
        username="eavesdropper",
        password=tls_broker.password("eavesdropper"),
        tls=TlsSettings(ca_file=tls_broker.ca),
    ) as sub:
        await sub.subscribe(f"nlagg/{RUN}/#")
        await asyncio.to_thread(_publish_tls, tls_broker, topic, b"over-tls")
        async with asyncio.timeout(10.0):
            async for msg in sub.messages():
                assert (msg.topic, msg.payload) == (topic, b"over-tls")
                sub.ack([msg])
                break


async def test_a_broker_the_ca_does_not_vouch_for_is_refused_at_once(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    from nlagg_node.deploy.tls import new_ca

    other = tmp_path / "other-ca.pem"
    other.write_bytes(new_ca("someone-else").pair.cert_pem)
    sub = MqttTransport(
        tls_broker.url,
        client_id="eaves",
        manual_ack=True,
        username="eavesdropper",
        password=tls_broker.password("eavesdropper"),
        tls=TlsSettings(ca_file=other),
        connect_timeout=10.0,
    )
    with pytest.raises(NlaggError, match="certificate does not verify"):
        await sub.connect()


async def test_plaintext_mqtt_gets_no_connack_from_the_tls_listener(tls_broker: TlsBroker) -> None:
    assert await accepts_anonymous(f"mqtt://127.0.0.1:{tls_broker.port}", within=3.0) is None
    assert await accepts_anonymous(tls_broker.url, tls=TlsSettings(ca_file=tls_broker.ca)) is False


async def test_the_anonymous_probe_sees_an_open_broker(mosquitto_url: str) -> None:
    assert await accepts_anonymous(mosquitto_url) is True


@pytest.mark.parametrize("anonymous", [True, False], ids=["anonymous-warns", "acl-tls-silent"])
async def test_eavesdropper_warns_at_start_when_the_broker_admits_anonymous_clients(
    anonymous: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 13: ``nlagg eavesdrop --events`` on a broker that lets anyone in logs a warning naming
    the broker and emits it as the first JSON event; a broker with per-user ACLs (the plan's TLS
    broker, logged in as the eavesdropper) gets none."""
    user = password = None
    tls = None
    async with AsyncExitStack() as stack:
        if anonymous:
            url = (await stack.enter_async_context(start_mosquitto())).url
        else:
            broker = await stack.enter_async_context(plan_tls_broker(tmp_path))
            url, user, password = broker.url, "eavesdropper", broker.password("eavesdropper")
            tls = TlsSettings(ca_file=broker.ca)
        with caplog.at_level(logging.WARNING, logger="nlagg.eavesdropper"):
            session = CaptureSession(
                username=user, password=password, tls=tls, live=False, events=True, stop_after=0.5
            )
            await run_eavesdropper(url, RUN, tmp_path / "t.sqlite", session)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    logged = [r.getMessage() for r in caplog.records if r.name == "nlagg.eavesdropper"]
    if anonymous:
        assert [e["event"] for e in events] == ["warning", "subscribed", "finished"]
        assert events[0]["message"] == ANONYMOUS_WARNING % url
        assert events[0]["message"].startswith(f"broker {url} admits anonymous clients")
        assert logged == [ANONYMOUS_WARNING % url]
    else:
        assert [e["event"] for e in events] == ["subscribed", "finished"]
        assert logged == []


def test_tls_files_need_an_mqtts_url(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    with pytest.raises(ConfigError, match="need an mqtts://"):
        MqttTransport("mqtt://localhost:1883", client_id="x", manual_ack=True, tls=TlsSettings(ca_file=ca))
    with pytest.raises(ConfigError, match="ca_file"):
        TlsSettings(ca_file=tmp_path / "missing.pem")


def test_plan_with_tls_hands_every_client_the_ca(tmp_path: Path) -> None:
    spec = PlanSpec(
        run=load_config(None, op="max", n=3, graph="ring"),
        run_id=RUN,
        seed=1,
        broker_url="mqtts://broker.lan:8883",
        make_tls=True,
        require_certificate=True,
    )
    root = tmp_path / "plan"
    write_plan(build_plan(spec), root)
    lines = [ln for ln in (root / "commands.txt").read_text().splitlines() if ln.startswith("nlagg ")]
    for line in lines:
        assert "--ca-file tls/ca.pem" in line
        assert "--cert-file secrets/" in line
    from cryptography import x509

    server = x509.load_pem_x509_certificate((root / "broker" / "tls" / "server.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "broker.lan" in names.get_values_for_type(x509.DNSName)
    assert socket.gethostbyname("localhost") in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}


@pytest.mark.slow
async def test_tls_deployment_is_exact_and_shows_no_password(tmp_path: Path) -> None:
    """plan --tls: Mosquitto's TLS listener, the eavesdropper, the launcher and every node over mqtts://.

    Every client dials a relay that keeps a copy of all traffic (a passive loopback capture): it
    holds no password, while the same relay in front of the broker's plaintext listener shows one.
    """
    cfg = RunConfig(op="max", n=5, graph="ring", trials=1, t_max=300, c=10.0, mu_z=30.0, seed=11)
    listen = free_port()
    async with (
        sniffing("127.0.0.1", listen) as sniffer,
        PlanBed(cfg, tmp_path, run_id="tlsrun", tls=True, port=listen, client_port=sniffer.port) as bed,
    ):
        await bed.start_nodes()
        verdict = await bed.finish()
        plaintext = await accepts_anonymous(f"mqtt://127.0.0.1:{listen}", within=3.0)
        assert plaintext is None  # the TLS listener answers no plaintext CONNECT
        assert bed.broker is not None
        password = bed.password("node0")
        async with sniffing("127.0.0.1", bed.broker.port) as control:
            await asyncio.to_thread(_plain_connect, control.port, "node0", password)
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail  # outputs exact, every captured x and z0 bit-equal
    assert (verdict.lost, verdict.extra) == (0, 0)
    assert password.encode() in control.captured  # the sniffer sees a plaintext CONNECT's password
    assert sniffer.connections >= cfg.n + 2
    assert len(sniffer.captured) > 100_000
    for pw_file in (bed.root / "secrets").glob("*.pw"):
        assert pw_file.read_text().strip().encode() not in sniffer.captured, pw_file.name


def _plain_connect(port: int, user: str, password: str) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}")
    client.username_pw_set(user, password)
    done: queue.Queue[int] = queue.Queue()
    client.on_connect = lambda _c, _u, _f, rc, _p: done.put(int(rc.value))
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert done.get(timeout=5.0) == 0
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("in_process", [False, True], ids=["processes", "in-process"])
async def test_testbed_over_tls_equals_the_simulator(in_process: bool, tmp_path: Path) -> None:
    """``nlagg testbed --broker mqtts://... --ca-file``: launcher, eavesdropper and nodes over TLS."""
    from nlagg_node.lab.testbed import run_testbed
    from nlagg_node.runtime.public import run_edges
    from nlagg_node.sim import simulate

    cfg = RunConfig(op="max", n=4, graph="ring", trials=1, t_max=60, seed=3)
    async with tls_lab_broker() as broker:
        summary = await run_testbed(
            cfg, broker_url=broker.tls_url, ca_file=broker.ca_file, in_process=in_process, out_dir=tmp_path
        )
    sim = simulate(cfg.model_copy(update={"record": "all"}))
    with Transcript(tmp_path / "transcript.sqlite") as tr:
        assert np.array_equal(tr.x(cfg.n), sim.recorded_x[:, 0, :].T)
        assert tr.z0(cfg.n, run_edges(cfg)).keys() == sim.z0.keys()
    assert summary["iterations"] == 60
    assert [summary["final_x"][str(i)] for i in range(cfg.n)] == [float(v) for v in sim.output[0].ravel()]


def test_testbed_ca_file_needs_an_mqtts_broker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nlagg_node.cli import main

    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    for argv, why in (
        (["--ca-file", str(ca)], "needs an mqtts:// --broker"),
        (["--ca-file", str(ca), "--broker", "mqtt://127.0.0.1:1"], "mqtts://"),
    ):
        monkeypatch.setattr("sys.argv", ["nlagg", "testbed", "--n", "3", *argv])
        with pytest.raises(SystemExit) as exc:
            main()
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert why in err
        assert len(err.strip().splitlines()) == 1, err
