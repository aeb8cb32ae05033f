"""Multi-host test: the broker, the eavesdropper and 8 nodes each in its own network namespace.

The topology (tests/harness/netns.py, removed after the module): a bridge, one namespace per host, node
links with 5 ms +- 2 ms of delay and 1 % loss in each direction. Every part is started with the
exact line of the plan's commands.txt, so the generated Mosquitto config, password file and ACL
are what runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.netns import BROKER_IP, Net, namespaces

pytestmark = [pytest.mark.netns, pytest.mark.mosquitto]

N_NODES = 8
LISTEN_WINDOW = 60  # seconds the ACL probe listens at most


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    with namespaces(N_NODES) as built:
        yield built


@pytest.fixture(scope="module")
def plan_dir() -> Iterator[Path]:
    """A directory Mosquitto's dropped-privilege user can enter (pytest's temp dirs are 0700)."""
    base = Path(tempfile.mkdtemp(prefix="nlagg-multihost-"))
    os.chmod(base, 0o755)
    try:
        yield base / "plan"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _plan(plan_dir: Path) -> dict[str, str]:
    """Generate the plan (8 nodes, rgg, max, 2 corrupted) and return its commands by part."""
    argv = [
        "nlagg",
        "deploy",
        "plan",
        "--out",
        str(plan_dir),
        "--run-id",
        "multihost",
        "--n",
        str(N_NODES),
        "--graph",
        "rgg",
        "--radius",
        str(RADIUS),
        "--op",
        "max",
        "--corrupt-count",
        "2",
        "--seed",
        str(SEED),
        "--replay",
        "--t-max",
        str(T_MAX),
        "--c",
        str(C),
        "--mu-z",
        str(MU_Z),
        "--broker",
        f"mqtt://{BROKER_IP}:1883",
        "--listen",
        f"{BROKER_IP}:1883",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    commands: dict[str, str] = {}
    role = ""
    for line in (plan_dir / "commands.txt").read_text().splitlines():
        if line.startswith("# broker"):
            role = "broker"
        elif line.startswith("# eavesdropper"):
            role = "eaves"
        elif line.startswith("# launcher"):
            role = "launcher"
        elif line.startswith("# node "):
            role = "n" + line.split()[2]
        elif line and not line.startswith("#"):
            commands[role] = line
    assert set(commands) == {"broker", "eaves", "launcher", *(f"n{i}" for i in range(N_NODES))}
    return commands


# rgg radius 0.45, seed 3: 11 edges, node 0 has 3 neighbours; the simulator is exact from t = 478.
SEED, RADIUS, T_MAX, C, MU_Z = 3, 0.45, 600, 3.0, 9.0


@pytest.fixture(scope="module")
def broker(net: Net, plan_dir: Path) -> dict[str, str]:
    """The plan's broker, started with its commands.txt line in the broker namespace."""
    commands = _plan(plan_dir)
    proc = net.popen("broker", "exec " + commands["broker"], cwd=plan_dir, log=plan_dir.parent / "broker.log")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        probe = net.run("n0", [sys.executable, "-c", _CONNECT_PROBE, BROKER_IP, "1"])
        if probe.returncode == 0:
            return commands
        assert proc.poll() is None, (plan_dir.parent / "broker.log").read_text()
        time.sleep(0.1)
    pytest.fail("broker did not open its port in the broker namespace")


_CONNECT_PROBE = """
import socket, statistics, sys, time
host, count, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1883
rtts = []
for _ in range(count):
    t = time.perf_counter()
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        if port == 1883:
            raise
    rtts.append((time.perf_counter() - t) * 1000)
print(statistics.median(rtts))
"""


def _client_env(plan_dir: Path, user: str) -> dict[str, str]:
    """XDG config dir whose mosquitto_pub/sub defaults carry the user's credentials (not on argv)."""
    xdg = plan_dir / "xdg" / user
    if xdg.is_dir():  # written once: a client may be reading it right now
        return {"XDG_CONFIG_HOME": str(xdg)}
    xdg.mkdir(parents=True)
    password = (plan_dir / "secrets" / f"{user}.pw").read_text().strip()
    for tool in ("mosquitto_pub", "mosquitto_sub"):
        conf = xdg / tool
        conf.write_text(f"-h {BROKER_IP}\n-u {user}\n-P {password}\n")
        conf.chmod(0o600)
    return {"XDG_CONFIG_HOME": str(xdg)}


def test_namespaces_are_impaired_and_carry_only_what_the_acl_allows(
    net: Net, plan_dir: Path, broker: dict[str, str]
) -> None:
    # SYN -> RST on a closed port of the broker host: one round trip, no connection left behind
    rtt = net.run("n0", [sys.executable, "-c", _CONNECT_PROBE, BROKER_IP, "20", "1884"])
    assert rtt.returncode == 0, rtt.stderr
    median_ms = float(rtt.stdout)
    # one round trip crosses the impaired link twice: 2 x (5 +- 2) ms, loss adds retransmissions
    assert 6.0 <= median_ms <= 40.0, f"median SYN/RST RTT {median_ms:.1f} ms ({net.impairment})"
    print(f"impairment: {net.impairment}; median SYN/RST RTT {median_ms:.1f} ms")

    import json

    edges = json.loads((plan_dir / "graph.json").read_text())["edges"]
    nbrs = sorted({b for a, b in edges if a == 0} | {a for a, b in edges if b == 0})
    far = [k for k in range(1, N_NODES) if k not in nbrs]
    assert far, "the test graph must give node 0 a non-neighbour"
    near = nbrs[0]
    root = "nlagg/multihost"
    # node 0 subscribes to its neighbour's x and to what non-neighbours publish (x, and z0 "to" it);
    # each round the non-neighbours publish first, so receiving 3 of the neighbour's messages and
    # nothing else shows the ACL filtered at least two full rounds of theirs.
    filters = [f"{root}/node/{near}/x", *(f"{root}/node/{k}/x" for k in far), f"{root}/edge/+/0/z0"]
    # Until 3 messages came: the window only bounds a failure (a loaded machine takes seconds a round).
    listen = net.popen(
        "n0",
        f"exec mosquitto_sub -v -C 3 -W {LISTEN_WINDOW} " + " ".join(f"-t {f}" for f in filters),
        plan_dir,
        _client_env(plan_dir, "node0"),
    )
    deadline = time.monotonic() + LISTEN_WINDOW
    while listen.poll() is None and time.monotonic() < deadline:
        for k in [*far, near]:
            for topic in (f"{root}/node/{k}/x", f"{root}/edge/{k}/0/z0"):
                env = [f"{a}={b}" for a, b in _client_env(plan_dir, f"node{k}").items()]
                pub = ["env", *env, "mosquitto_pub", "-q", "1", "-t", topic, "-m", f"from-{k}"]
                assert net.run(f"n{k}", pub).returncode == 0
        time.sleep(0.1)
    out, err = listen.communicate(timeout=30)
    assert listen.returncode == 0, (err, (plan_dir.parent / "broker.log").read_text()[-2000:])
    # node k may not write edge/k/0/z0 unless 0 is its neighbour: only near's messages arrive
    lines = out.decode().splitlines()
    assert set(lines) <= {f"{root}/node/{near}/x from-{near}", f"{root}/edge/{near}/0/z0 from-{near}"}
    assert len(lines) == 3


def _status_rows(db: Path) -> list[dict[str, object]]:
    """Every captured status payload of the run, in capture order (the documented transcript schema)."""
    import json
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT payload FROM messages WHERE valid = 1 AND kind = 'status' ORDER BY id")
        return [json.loads(bytes(p)) for (p,) in rows]
    finally:
        con.close()


def _done_outputs(db: Path) -> dict[int, list[float]]:
    return {int(m["node"]): list(m["output"]) for m in _status_rows(db) if m["state"] == "done"}  # type: ignore[call-overload]


def _last_states(db: Path) -> dict[int, str]:
    return {int(m["node"]): str(m["state"]) for m in _status_rows(db)}  # type: ignore[call-overload]


def test_max_consensus_across_namespaces_is_exact_and_fully_captured(
    net: Net, plan_dir: Path, broker: dict[str, str]
) -> None:
    import json

    import numpy as np

    from adversary.transcript import Transcript
    from nlagg_node.config import load_config
    from nlagg_node.deploy import load_plan
    from nlagg_node.deploy.compose import transcript_ready_check
    from nlagg_node.deploy.nodefile import read_node_value
    from nlagg_node.sim import simulate
    from tests.harness.verdict import assert_transcript_holds

    logs = plan_dir.parent / "logs"
    logs.mkdir(exist_ok=True)
    # The exact line plus --events, whose "subscribed" line tells when nothing can be missed any more.
    eaves_log = logs / "eavesdropper.log"
    eaves = net.popen("eaves", "exec " + broker["eaves"] + " --events", plan_dir, log=eaves_log)
    deadline = time.monotonic() + 60
    while '"event": "subscribed"' not in eaves_log.read_text():
        assert eaves.poll() is None, eaves_log.read_text()[-2000:]
        assert time.monotonic() < deadline, "eavesdropper never subscribed: " + eaves_log.read_text()[-2000:]
        time.sleep(0.05)
    launcher = net.popen("eaves", "exec " + broker["launcher"], plan_dir, log=logs / "launcher.log")
    assert launcher.wait(timeout=60) == 0, (logs / "launcher.log").read_text()
    started = time.monotonic()
    # Even nodes: the exact commands.txt line. Odd nodes: `nlagg deploy node nodes/<i>.toml`, what
    # docker compose and the systemd unit run (it execs the same command from the node's file).
    nodes = {
        i: net.popen(
            f"n{i}",
            "exec " + (broker[f"n{i}"] if i % 2 == 0 else f"nlagg deploy node nodes/{i}.toml"),
            plan_dir,
            log=logs / f"node{i}.log",
        )
        for i in range(N_NODES)
    }
    for i, proc in nodes.items():
        rc = proc.wait(timeout=max(1.0, 150 - (time.monotonic() - started)))
        assert rc == 0, f"node {i} exited {rc}: {(logs / f'node{i}.log').read_text()[-2000:]}"
    seconds = time.monotonic() - started
    try:
        eaves_rc = eaves.wait(timeout=10)
        stopped_by_itself = True
    except subprocess.TimeoutExpired:
        # The capture counts a node done once its "done" is captured (a last will that the TCP reset
        # of its exit brought in after it no longer matters), then waits for anything still missing;
        # on a jittered network that wait can outlast ours. SIGTERM commits and stops it cleanly.
        os.killpg(eaves.pid, signal.SIGTERM)
        eaves_rc = eaves.wait(timeout=30)
        stopped_by_itself = False
    assert eaves_rc == 0, eaves_log.read_text()[-2000:]

    plan = load_plan(plan_dir)
    values = np.array([read_node_value(node, plan_dir) for node in plan.nodes], dtype=np.float64)
    truth = float(values.max())
    sim = simulate(
        load_config(
            None,
            op="max",
            n=N_NODES,
            graph="rgg",
            radius=RADIUS,
            trials=1,
            t_max=T_MAX,
            may_depart=True,  # a plan's: its certified stop waits n - 1 hops, as its nodes do
            c=C,
            mu_z=MU_Z,
            seed=SEED,
            record="all",
        )
    )
    edges = np.array(json.loads((plan_dir / "graph.json").read_text())["edges"])
    assert np.array_equal(sim.graphs[0], edges)
    assert np.array_equal(sim.values[0], values)

    with Transcript(plan_dir / "transcript.sqlite") as tr:
        config = tr.config()
        assert config is not None
        assert config.n == N_NODES
        assert [list(e) for e in config.edges] == edges.tolist()
        assert sorted(tr.statuses()) == list(range(N_NODES))
    done = _done_outputs(plan_dir / "transcript.sqlite")
    assert sorted(done) == list(range(N_NODES)), (
        f"no 'done' status captured from {set(range(N_NODES)) - set(done)}"
    )
    for i, output in done.items():
        assert abs(output[0] - truth) <= 1e-9, (i, output, truth)
    if not stopped_by_itself:
        warnings.warn(
            "eavesdropper did not stop by itself within 10 s of every node being done: "
            f"last states {_last_states(plan_dir / 'transcript.sqlite')}",
            stacklevel=1,
        )
    # The compose file's eavesdropper healthcheck accepts this transcript and refuses a missing one.
    ready = transcript_ready_check(str(plan_dir / "transcript.sqlite"))
    assert subprocess.run([sys.executable, "-c", ready], capture_output=True, check=False).returncode == 0
    missing = transcript_ready_check(str(plan_dir / "missing.sqlite"))
    assert subprocess.run([sys.executable, "-c", missing], capture_output=True, check=False).returncode != 0
    # Every x and z^(0) the simulator's, every corrupted node's states, nothing refused.
    assert_transcript_holds(sim, plan_dir / "transcript.sqlite", corrupt=plan.corrupted)
    ran = int(sim.phase_iterations[0].sum())
    print(
        f"multihost: {N_NODES} nodes, {len(edges)} edges, {ran} rounds in {seconds:.1f} s "
        f"({ran / seconds:.0f} rounds/s) over {net.impairment}; max {truth!r} exact at every node"
    )
