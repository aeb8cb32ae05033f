"""Outsiders before login: idle sockets and oversized CONNECTs against the generated broker settings.

A plan's Mosquitto sets ``max_packet_size`` (a CONNECT announcing 256 MB is refused before any
allocation) and ``max_connections``, and its deploy units give it a descriptor limit above that
(``LimitNOFILE``/compose ``ulimits``): an outsider's 1100 idle sockets then neither exhaust the
broker's descriptors nor lock the plan's own clients out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, security_lines, write_plan
from nlagg_node.deploy.mosquitto_auth import DEFAULT_MAX_CONNECTIONS, node_user
from nlagg_node.runtime.brokers import BrokerHandle, free_port, mosquitto_binary, start_mosquitto
from tests.harness.epochsoak import rss_kib
from tests.harness.mqtt_frames import CONNACK, connack_code, connect_frame, remaining_length
from tests.harness.planbed import PlanBed, listening

pytestmark = pytest.mark.mosquitto

IDLE_SOCKETS = 1100
OVERSIZED = 4
FILE_LIMIT = 4096  # what the test raises its own (and so the broker's) soft descriptor limit to


def _rss_kib(pid: int) -> int:
    rss = rss_kib(pid)
    assert rss is not None, f"no VmRSS for pid {pid}"
    return rss


@pytest.fixture
def file_limit() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILE_LIMIT:
        pytest.skip(f"the hard descriptor limit {hard} is below {FILE_LIMIT}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
async def broker(tmp_path: Path, file_limit: None) -> AsyncIterator[tuple[BrokerHandle, str]]:
    run = load_config(None, op="max", n=4, graph="ring")
    out = tmp_path / "plan"
    write_plan(build_plan(PlanSpec(run=run, run_id="avail", seed=1)), out)
    lines = security_lines(str(out / "broker" / "passwd"), str(out / "broker" / "acl"))
    password = (out / "secrets" / "node0.pw").read_text().strip()
    extra = [f"max_connections {DEFAULT_MAX_CONNECTIONS}", *lines, "user root"]
    async with start_mosquitto(extra_lines=extra, allow_anonymous=False) as handle:
        yield handle, password


def _node_connects(handle: BrokerHandle, password: str, run_id: str = "avail") -> int:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="node0")
    client.username_pw_set("node0", password)
    try:
        client.connect(handle.host, handle.port)
        client.loop_start()
        client.subscribe(f"nlagg/{run_id}/config", qos=1)
        info = client.publish(f"nlagg/{run_id}/node/0/x", b"x", qos=1)
        info.wait_for_publish(timeout=10)
        return 0 if info.is_published() else 1
    finally:
        client.disconnect()
        client.loop_stop()


# The outsider is its own process, as on a LAN: its 1100 descriptors are not the test client's
# (paho selects on its socket, which must stay below FD_SETSIZE).
OUTSIDER = """
import resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
host, (port, idle, oversized) = sys.argv[1], map(int, sys.argv[2:5])
header = bytes.fromhex(sys.argv[5])
held = [socket.create_connection((host, port)) for _ in range(idle)]
cut = 0
for _ in range(oversized):
    s = socket.create_connection((host, port))
    s.settimeout(5)
    try:  # streams 32 MiB of the announced packet, unless the broker cuts it off first
        s.sendall(header)  # announces 256 MiB, far above MAX_PACKET_BYTES
        for _ in range(512):
            s.sendall(bytes(1 << 16))
    except (ConnectionResetError, BrokenPipeError):
        cut += 1
    except TimeoutError:
        pass  # still open: the broker stopped reading but keeps the connection
    held.append(s)
print(len(held) - oversized, cut, flush=True)
sys.stdin.read()
"""


def test_outsiders_before_login_lock_nobody_out(broker: tuple[BrokerHandle, str]) -> None:
    handle, password = broker
    assert handle.pid is not None
    rss_before = _rss_kib(handle.pid)
    header = b"\x10" + remaining_length(256 << 20) + b"\x00\x04MQTT\x04\xc2\x00\x3c"
    argv = [str(a) for a in (handle.host, handle.port, IDLE_SOCKETS, OVERSIZED, header.hex())]
    with subprocess.Popen(
        [sys.executable, "-c", OUTSIDER, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as outsider:
        assert outsider.stdout is not None
        assert outsider.stdin is not None
        held, cut = map(int, outsider.stdout.readline().split())
        try:
            assert (held, cut) == (IDLE_SOCKETS, OVERSIZED)  # every oversized CONNECT was cut off
            assert _node_connects(handle, password) == 0  # the plan's node still gets in and publishes
            grown_kib = _rss_kib(handle.pid) - rss_before
            assert grown_kib < 64 << 10, f"broker grew {grown_kib} KiB (4 CONNECTs announced 1 GiB)"
        finally:
            outsider.stdin.close()


UNFINISHED = 300  # sockets, each sending 1 MB of a CONNECT it never finishes (issue 43, break 7)
UNFINISHED_OUTSIDER = """
import socket, sys
host, port, count, announce = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
header = bytes.fromhex(sys.argv[5])
held = []
for _ in range(count):
    s = socket.create_connection((host, port))
    s.settimeout(5)
    try:
        s.sendall(header + bytes(announce - (len(header) - 4) - 1))
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        pass
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"""


async def test_unfinished_connects_cost_a_plans_broker_almost_nothing(tmp_path: Path) -> None:
    run = load_config(None, op="max", n=6, graph="ring")
    async with PlanBed(run, tmp_path, run_id="preauth", capture=False) as bed:
        broker = bed.broker
        assert broker is not None
        assert broker.pid is not None
        rss_before = _rss_kib(broker.pid)
        announce = 1 << 20  # within the protocol's packet cap, far above the plan's
        header = b"\x10" + remaining_length(announce) + b"\x00\x04MQTT\x04\xc2\x00\x3c"
        argv = [broker.host, broker.port, UNFINISHED, announce, header.hex()]
        outsider = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            UNFINISHED_OUTSIDER,
            *map(str, argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert outsider.stdout is not None
        assert outsider.stdin is not None
        try:
            assert int(await outsider.stdout.readline()) == UNFINISHED
            # Mosquitto has read what it will of every socket once a later client is served.
            assert await asyncio.to_thread(_node_connects, broker, bed.password("node0"), "preauth") == 0
            grown_kib = _rss_kib(broker.pid) - rss_before
        finally:
            outsider.stdin.close()
            await outsider.wait()
    # 300 MB announced and sent; the plan's max_packet_size cuts each off at its header (was +303 MB).
    assert grown_kib < 32 << 10, f"broker grew {grown_kib} KiB under {UNFINISHED} unfinished CONNECTs"


PINGREQ_FRAME, PINGRESP_FRAME = b"\xc0\x00", b"\xd0\x00"
CAP = 20  # the plan's max_connections, rewritten from DEFAULT_MAX_CONNECTIONS for the test
OVER = 5  # outsider sockets beyond it


@contextlib.asynccontextmanager
async def plans_own_mosquitto(root: Path, port: int) -> AsyncIterator[Path]:
    """``mosquitto -c broker/mosquitto.conf`` in the plan directory ``root``, as commands.txt
    starts it (plus ``user root`` when run as root); its log file, once it listens on ``port``.
    Readiness is read from the kernel's socket table, not probed: Mosquitto 2.0.11 counts a
    connection closed before its CONNECT off its listener twice, and each probe would raise the limit
    by one."""
    conf = root / "broker" / "mosquitto.conf"
    if os.geteuid() == 0:  # otherwise it drops to its own user, which cannot enter pytest's 0700 dirs
        conf.write_text(conf.read_text() + "user root\n")
    log = root / "mosquitto.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            mosquitto_binary() or "mosquitto", "-c", "broker/mosquitto.conf", cwd=root, stdout=out, stderr=out
        )
    try:
        async with asyncio.timeout(20):
            while not listening(proc.pid, port):
                assert proc.returncode is None, log.read_text()
                await asyncio.sleep(0.05)  # polled: nothing announces a listener (its log says it at info)
        yield log
    finally:
        proc.terminate()
        await proc.wait()


async def mqtt_login(
    port: int, user: str, password: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection of ``user`` whose CONNECT the broker accepted (CONNACK 0)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(connect_frame(user, username=user, password=password))
    head = await reader.readexactly(4)
    assert (head[0] >> 4, connack_code(head[2:])) == (CONNACK, 0), head
    return reader, writer


async def closed_by_broker(reader: asyncio.StreamReader) -> bool:
    """Wait until the broker closes this connection (True) or sends something (False)."""
    try:
        return await reader.read(4) == b""
    except ConnectionError:
        return True


async def test_the_plans_max_connections_refuses_sockets_beyond_it_and_keeps_its_nodes(
    tmp_path: Path,
) -> None:
    # Issue 43, break 7: "max_connections 4000 was not enforced". The plan writes it in its listener's
    # block (after ``listener``, where Mosquitto 2 reads it as that listener's). Rewritten to 20, the
    # plan's own broker with its 6 nodes logged in refuses outsider sockets beyond the limit and a
    # new login while they are held, keeps serving its nodes, and lets a client in once they leave.
    port = free_port()
    root = tmp_path / "plan"
    run = load_config(None, op="max", n=6, graph="ring")
    spec = PlanSpec(run=run, run_id="cap", seed=1, listen_host="127.0.0.1", listen_port=port)
    write_plan(build_plan(spec), root)
    conf = root / "broker" / "mosquitto.conf"
    lines = conf.read_text().splitlines()
    limit = f"max_connections {DEFAULT_MAX_CONNECTIONS}"
    assert lines.index(limit) > lines.index(f"listener {port} 127.0.0.1")  # a listener option
    conf.write_text("\n".join(f"max_connections {CAP}" if ln == limit else ln for ln in lines) + "\n")
    password = {
        u: (root / "secrets" / f"{u}.pw").read_text().strip() for u in (*map(node_user, range(6)), "launcher")
    }
    async with plans_own_mosquitto(root, port) as log, contextlib.AsyncExitStack() as held:
        nodes = [await mqtt_login(port, node_user(i), password[node_user(i)]) for i in range(run.n)]
        outsiders = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CAP + OVER)]
        for _, writer in nodes + outsiders:
            held.callback(writer.close)
        # Those beyond the limit are closed at once; the others wait, idle, for a CONNECT.
        waits = [asyncio.ensure_future(closed_by_broker(reader)) for reader, _ in outsiders]
        async with asyncio.timeout(30):
            while sum(w.done() for w in waits) < OVER:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        assert all(w.result() for w in waits if w.done())
        refused = await asyncio.open_connection("127.0.0.1", port)  # a login while they are held
        refused[1].write(connect_frame("launcher", username="launcher", password=password["launcher"]))
        async with asyncio.timeout(30):
            assert await closed_by_broker(refused[0])  # no CONNACK: closed
        refused[1].close()
        for reader, writer in nodes:  # every node's connection still served
            writer.write(PINGREQ_FRAME)
            assert await reader.readexactly(2) == PINGRESP_FRAME
        for _, writer in outsiders:
            writer.close()
        async with asyncio.timeout(30):
            while True:  # the broker frees their slots as it reads their close
                with contextlib.suppress(AssertionError, ConnectionError, asyncio.IncompleteReadError):
                    _, launcher = await mqtt_login(port, "launcher", password["launcher"])
                    held.callback(launcher.close)
                    break
                await asyncio.sleep(0.05)
        for w in waits:
            w.cancel()
        denied = log.read_text(errors="replace").count("denied: max_connections exceeded")
    assert denied >= OVER + 1, denied
