"""How many idle sockets a plan's Mosquitto holds under its ``max_connections`` (issue 43, break 7).

    python benchmarks/bench_max_connections.py [--limit 20] [--closed 0,10,100] [--logins-closed 0,10]

Writes a plan (n = 6 ring) and, for every count K of ``--closed`` (then of ``--logins-closed``),
starts a fresh Mosquitto from the plan's own ``broker/mosquitto.conf`` with ``max_connections``
set to ``--limit`` (the plan's listener block, where Mosquitto 2 reads it). First K connections
open and close before any CONNECT (a port scan; ``--logins-closed``: K logins of node 0 that
log in and close), then ``limit + 2K + 30`` idle sockets open, and the sockets the broker kept
are counted from its descriptors (/proc). Prints one JSON line per run: the limit, K and the idle
sockets held. With the limit enforced, ``held`` is the limit whatever K; Mosquitto 2.0.11 counts
a connection closed before its CONNECT off its listener twice (and a login that closes, about
three times: eclipse-mosquitto/mosquitto#1460), so ``held`` grows with K.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

from nlagg_node.config import load_config
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.deploy.mosquitto_auth import DEFAULT_MAX_CONNECTIONS
from nlagg_node.runtime.brokers import free_port, mosquitto_binary
from tests.harness.mqtt_frames import connect_frame
from tests.harness.planbed import listening

EXTRA = 30  # idle sockets opened beyond the limit (and twice the connections closed before)


def sockets(pid: int) -> int:
    """The sockets process ``pid`` holds open (its listener's among them)."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(os.readlink(fds / fd).startswith("socket:") for fd in os.listdir(fds))


async def held_after(root: Path, limit: int, closed: int, logins: bool) -> int:
    """Idle sockets a fresh broker of the plan in ``root`` holds after ``closed`` connections closed."""
    port = free_port()
    spec = PlanSpec(
        run=load_config(None, op="max", n=6, graph="ring"),
        run_id="cap",
        seed=1,
        listen_host="127.0.0.1",
        listen_port=port,
    )
    shutil.rmtree(root, ignore_errors=True)
    write_plan(build_plan(spec), root)
    conf = root / "broker" / "mosquitto.conf"
    text = conf.read_text().replace(f"max_connections {DEFAULT_MAX_CONNECTIONS}", f"max_connections {limit}")
    conf.write_text(text + ("user root\n" if os.geteuid() == 0 else ""))
    password = (root / "secrets" / "node0.pw").read_text().strip()
    proc = await asyncio.create_subprocess_exec(
        mosquitto_binary() or "mosquitto",
        "-c",
        "broker/mosquitto.conf",
        cwd=root,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        while not listening(proc.pid, port):  # polled: nothing announces the listener
            assert proc.returncode is None, "mosquitto exited"
            await asyncio.sleep(0.05)
        before = sockets(proc.pid)
        for _ in range(closed):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if logins:
                writer.write(connect_frame("node0", username="node0", password=password))
                await reader.readexactly(4)
            writer.close()
        await asyncio.sleep(0.5)  # the broker reads the closes
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(limit + 2 * closed + EXTRA)]
        await asyncio.sleep(1.0)  # those beyond the limit are closed at once
        held = sockets(proc.pid) - before
        for _, writer in idle:
            writer.close()
        return held
    finally:
        proc.terminate()
        await proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--closed", default="0,10,100")
    parser.add_argument("--logins-closed", default="0,10")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "plan"
        runs = [(int(k), False) for k in args.closed.split(",")]
        runs += [(int(k), True) for k in args.logins_closed.split(",") if int(k)]
        for k, logins in runs:
            held = await held_after(root, args.limit, k, logins)
            kind = "logins_closed" if logins else "closed_before_connect"
            print(json.dumps({"max_connections": args.limit, kind: k, "idle_held": held}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
