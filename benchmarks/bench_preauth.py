"""Mosquitto's memory under unauthenticated sockets that each send most of a large CONNECT (issue 43, 7).

    python benchmarks/bench_preauth.py [--sockets 300] [--announce 1048576] [--cap plan|protocol]

Writes a plan (n = 6 ring, identities on) and starts Mosquitto from the plan's own
``broker/mosquitto.conf`` on a free loopback port; ``--cap protocol`` first puts back the cap every
plan had before 2026-11-29 (``max_packet_size`` = the protocol's payload cap plus headers,
1114112), ``plan`` keeps the plan's own (:func:`~nlagg_node.deploy.mosquitto_auth.plan_packet_bytes`).
Then one outsider process opens ``--sockets`` connections; each sends a CONNECT header announcing
``--announce`` bytes and all of them but the last (an unfinished CONNECT, never logged in) and stays.
Prints one JSON line: the cap, Mosquitto's VmRSS before and with the sockets held, how many sockets
the broker cut off, and whether the plan's node 0 still connects and publishes meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.deploy.mosquitto_auth import MAX_PACKET_BYTES
from nlagg_node.runtime.brokers import free_port, mosquitto_binary

OUTSIDER = """
import socket, sys
host, port, count, announce = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def length(n):
    out = bytearray()
    while True:
        n, d = divmod(n, 128)
        out.append(d | (0x80 if n else 0))
        if not n:
            return bytes(out)
header = b"\\x10" + length(announce) + b"\\x00\\x04MQTT\\x04\\xc2\\x00\\x3c"
held, cut = [], 0
for _ in range(count):
    s = socket.create_connection((host, port))
    s.settimeout(5)
    try:
        s.sendall(header + bytes(announce - (len(header) - 2) - 1))
    except (ConnectionResetError, BrokenPipeError):
        cut += 1
    except TimeoutError:
        pass
    held.append(s)
print(cut, flush=True)
sys.stdin.read()
"""


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    assert match is not None
    return int(match.group(1))


def node_connects(port: int, password: str, run_id: str) -> bool:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="node0")
    client.username_pw_set("node0", password)
    try:
        client.connect("127.0.0.1", port)
        client.loop_start()
        info = client.publish(f"nlagg/{run_id}/node/0/x", b"x", qos=1)
        info.wait_for_publish(timeout=10)
        return info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def measure(sockets: int, announce: int, cap: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "plan"
        port = free_port()
        run = load_config(None, op="max", n=6, graph="ring")
        spec = PlanSpec(run=run, run_id="preauth", seed=1, listen_host="127.0.0.1", listen_port=port)
        write_plan(build_plan(spec), root)
        conf = root / "broker" / "mosquitto.conf"
        text = conf.read_text()
        if cap == "protocol":
            text = re.sub(r"^max_packet_size \d+$", f"max_packet_size {MAX_PACKET_BYTES}", text, flags=re.M)
        if os.geteuid() == 0:
            text += "user root\n"
        conf.write_text(text)
        packet = int(re.findall(r"^max_packet_size (\d+)$", text, re.M)[0])
        password = (root / "secrets" / "node0.pw").read_text().strip()
        with subprocess.Popen(
            [mosquitto_binary() or "mosquitto", "-c", str(conf)], cwd=root, stderr=subprocess.DEVNULL
        ) as broker:
            try:
                deadline = time.monotonic() + 10
                while not node_connects_quietly(port, password):
                    assert time.monotonic() < deadline, "the broker did not start"
                    time.sleep(0.1)
                before = rss_kib(broker.pid)
                argv = [sys.executable, "-c", OUTSIDER, "127.0.0.1", str(port), str(sockets), str(announce)]
                with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as out:
                    assert out.stdout is not None
                    assert out.stdin is not None
                    cut = int(out.stdout.readline())
                    time.sleep(1.0)  # the broker reads what is in its sockets' buffers
                    held = rss_kib(broker.pid)
                    node_ok = node_connects(port, password, "preauth")
                    out.stdin.close()
            finally:
                broker.terminate()
                broker.wait()
    return {
        "cap": cap,
        "max_packet_size": packet,
        "sockets": sockets,
        "announced_bytes": announce,
        "rss_before_kib": before,
        "rss_held_kib": held,
        "cut_off": cut,
        "node_connects": node_ok,
    }


def node_connects_quietly(port: int, password: str) -> bool:
    try:
        return node_connects(port, password, "preauth")
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=300)
    parser.add_argument("--announce", type=int, default=1 << 20)
    parser.add_argument("--cap", choices=["plan", "protocol"], default="plan")
    args = parser.parse_args()
    print(json.dumps(measure(args.sockets, args.announce, args.cap)), flush=True)


if __name__ == "__main__":
    main()
