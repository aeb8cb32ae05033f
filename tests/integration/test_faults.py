"""Reliability against a real Mosquitto: crash and resume, broker restart, a lossless capture, hostile
input, and clear failures. Each faulty run is compared with the simulator's run of the same seed.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.errors import ConfigError, WireError
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.checkpoint import Checkpoint, CheckpointStore
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.node import Node
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.transport import Message
from nlagg_node.runtime.wire import StatusMsg, XMsg, decode, encode, encode_x, topics
from nlagg_node.sim import simulate
from tests.harness.faults import FaultBed, hostile_messages
from tests.harness.verdict import Verdict

ENTRY = (sys.executable, "-c", "from nlagg_node.cli import main; main()")
CFG = RunConfig(op="max", n=6, trials=1, t_max=150, seed=4, c=10.0, mu_z=30.0)  # x starts near 3


def assert_identical(v: Verdict) -> None:
    assert v.detail == []
    assert (v.completed, v.identical, v.lost, v.extra) == (True, True, 0, 0)


# 1-3: crash and resume, broker restart, eavesdropper crash -------------------------------------------
@pytest.mark.mosquitto
@pytest.mark.parametrize(
    ("fault", "at"),
    [("node", 0.3), ("node-twice", 0.5), ("broker", 0.4), ("broker-kill", 0.4), ("eavesdropper", 0.5)],
    ids=["node-killed", "node-killed-twice", "broker-restarted", "broker-sigkilled", "eavesdropper-killed"],
)
async def test_run_survives_the_fault_with_identical_numbers(fault: str, at: float, tmp_path: Path) -> None:
    async with FaultBed(CFG, tmp_path, corrupt={2}) as bed:
        await bed.start_nodes()
        await bed.wait_progress(at)
        assert await bed.progress() < 1.0  # the fault hits a running network
        if fault.startswith("node"):
            for _ in range(2 if fault == "node-twice" else 1):
                await bed.kill_node(2)  # corrupted: its adv states must be complete too
                await asyncio.sleep(0.3)
                await bed.restart_node(2)
                await asyncio.sleep(0.4)
        elif fault == "broker":
            await bed.restart_broker(pause=0.5)
        elif fault == "broker-kill":
            # Sessions and queues die with it: what was queued for the capture comes again from
            # the nodes (their last x's and states, republished after the capture is back).
            await bed.kill_broker(pause=0.5)
        else:
            await bed.kill_eavesdropper()
            await asyncio.sleep(0.5)  # the run goes on; the broker queues for the persistent session
            await bed.start_eavesdropper()
        verdict = await bed.finish()
    assert_identical(verdict)
    if fault.startswith("node"):
        assert (tmp_path / "state" / "nlagg-faults-node-2.json").is_file()


@pytest.mark.mosquitto
async def test_restarting_a_finished_node_announces_done_again(tmp_path: Path) -> None:
    cfg = CFG.model_copy(update={"t_max": 40})
    async with FaultBed(cfg, tmp_path) as bed:
        await bed.start_nodes()
        assert_identical(await bed.finish())
        # A neighbour whose close broke after its 'done' leaves its will retained: the restarted
        # node must not wait for it (it did, and failed after its start-up timeout under load).
        names = topics(bed.prefix, bed.run_id)
        async with MqttTransport(bed.url, client_id="nlagg-faults-will") as tr:
            for j in range(1, cfg.n):
                will = encode(StatusMsg(node=j, state="offline"))
                await tr.publish(names.status(j), will, qos=1, retain=True)
        await bed.restart_node(0)  # the same command after the end: answered from the checkpoint
        async with asyncio.timeout(30):
            rc = await bed.nodes[0].wait()
    log = (tmp_path / "node-0.log").read_text(errors="replace")
    assert rc == 0, log
    assert json.loads(bed.nodes[0].lines[-1])["iterations"] == 40


def test_checkpoint_is_atomic_and_refuses_another_run(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "r1", 3)
    ck = Checkpoint("fp", "x", 2, 0, "max", 0.25, {"a": 1}, u_out=[0.1, -2.5], xs=[1.0, 0.1 + 0.2])
    store.save(ck)
    with store.xlog.open("a") as f:
        f.write("7.5\n")  # an x appended after the last checkpoint, then a crash
    loaded = CheckpointStore(tmp_path, "r1", 3).load("fp")
    assert loaded is not None
    assert (loaded.stage, loaded.t, loaded.u_out, loaded.xs, loaded.n_x) == ("x", 2, [0.1, -2.5], ck.xs, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nlagg-r1-node-3.json", "nlagg-r1-node-3.xlog"]
    assert store.xlog.read_text().splitlines() == ["1.0", "0.30000000000000004"]  # the extra x dropped
    with pytest.raises(ConfigError, match="another configuration"):
        store.load("other")
    assert CheckpointStore(tmp_path, "r2", 3).load("fp") is None


# 4: hostile input -----------------------------------------------------------------------------------
@pytest.mark.mosquitto
async def test_hostile_messages_are_rejected_counted_and_change_nothing(tmp_path: Path) -> None:
    # tests/harness/hostile.py forges x's of a fixed-schedule run (no early-stop fields)
    async with FaultBed(CFG.model_copy(update={"early_stop": False}), tmp_path) as bed:
        a, b = (int(v) for v in bed.edges[0])
        junk = hostile_messages(bed.prefix, bed.run_id, a, b)
        await bed.start_nodes()
        await bed.wait_progress(0.3)
        await bed.inject(junk)
        await bed.wait_progress(0.6)
        await bed.inject(junk)
        verdict = await bed.finish()
    assert_identical(verdict)
    assert verdict.rejected_by_nodes > 0
    # Every junk message (the z0 of an unknown group too: the nodes drop it) is refused at each
    # capture, and stored once, marked invalid with the reason.
    assert verdict.rejected_by_eavesdropper == 2 * len(junk)
    with Transcript(bed.db) as tr:
        refused = tr.rejected()
    assert len(refused) == len(junk)
    assert any("conflicts with the x already stored" in why for _, why in refused)


def test_completeness_ignores_valid_looking_messages_outside_the_run(tmp_path: Path) -> None:
    t = topics("nlagg", "done")
    with Transcript(tmp_path / "t.sqlite", run_id="done") as tr:
        for i, j in ((0, 1), (1, 0)):
            tr.add(t.z0(i, j), b'{"v":1,"from":%d,"to":%d,"group":"max","z":0.5}' % (i, j))
        tr.add(t.z0(0, 1), b'{"v":1,"from":0,"to":1,"group":"nope","z":0.5}')  # unknown group
        tr.add(t.z0(0, 2), b'{"v":1,"from":0,"to":2,"group":"max","z":0.5}')  # not an edge
        for k in range(2):
            tr.add(t.x(k), encode_x(k, 0, "max", 1.0))
        tr.add(t.x(7), encode_x(7, 0, "max", 1.0))  # not a node of the run
        assert tr.complete(2, 1, [[0, 1]], {"max"}) == (0, 0)
        assert tr.complete(2, 2, [[0, 1]], {"max", "min"}) == (2, 2)


RUN = "fuzz"
T = topics("nlagg", RUN)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(), st.text(max_size=8)
)
x_like = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2, "1"]), "node": st.integers(-1, 7), "t": st.integers(-1, 200)},
    optional={"phase": st.sampled_from(["max", "min", ""]), "x": json_scalars, "extra": json_scalars},
)
payloads = st.one_of(
    st.binary(max_size=64),
    x_like.map(lambda d: json.dumps(d).encode()),
    st.dictionaries(st.sampled_from(["v", "from", "to", "group", "z", "state", "final"]), json_scalars).map(
        lambda d: json.dumps(d).encode()
    ),
)
run_topics = st.one_of(
    st.builds(T.x, st.integers(0, 7)),
    st.builds(T.z0, st.integers(0, 7), st.integers(0, 7)),
    st.builds(T.status, st.integers(0, 7)),
    st.builds(T.adv, st.integers(0, 7)),
    st.sampled_from([T.config, f"{T.base}/node/1/y", f"{T.base}/node/01/x", f"{T.base}/x"]),
)


@settings(max_examples=300, deadline=None)
@given(run_topics, payloads)
def test_decode_raises_only_wire_errors(topic: str, payload: bytes) -> None:
    error: WireError | None
    try:
        info, msg = decode(topic, payload, "nlagg", RUN)
    except WireError as exc:
        error = exc
    else:
        error = None
    if error is not None:
        assert error.field in str(error)  # names the field
        return
    for value in msg.model_dump().values():
        if isinstance(value, float):
            assert math.isfinite(value)
    assert encode(msg)  # whatever decodes encodes again
    assert info.kind in ("config", "z0", "x", "status", "adv")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(run_topics, payloads), max_size=30))
def test_node_message_handling_never_raises_and_counts_what_it_refuses(
    messages: list[tuple[str, bytes]],
) -> None:
    cfg = RunConfig(op="max", n=8, trials=1, t_max=150, seed=1)
    node = Node(cfg, 3, 0.5, MemoryTransport(MemoryBroker(), "n3"), run_id=RUN)
    for topic, payload in messages:
        before = node.rejected
        node.feed(Message(topic, payload))
        try:
            info, msg = decode(topic, payload, "nlagg", RUN)
        except WireError:
            assert node.rejected == before + 1  # undecodable: rejected and counted
            continue
        if isinstance(msg, XMsg) and (msg.node not in node.neighbours or msg.t > 1):
            assert node.rejected == before + 1  # not a neighbour, or outside the window t = 0..1
        if info.kind == "adv":
            assert node.rejected == before + 1  # not for nodes


async def test_duplicates_are_ignored_and_conflicts_rejected_in_a_running_network() -> None:
    """Every x re-sent (once identical, once altered) while a memory network runs: same numbers."""
    from nlagg_node.sim import simulate

    cfg = RunConfig(op="median", n=6, trials=1, t_max=80, seed=7, record="all")
    sim = simulate(cfg)
    broker = MemoryBroker()
    edges = run_edges(cfg)
    values = sim.values[0]
    orig_route = broker.route

    def echo(topic: str, payload: bytes, retain: bool) -> None:
        orig_route(topic, payload, retain)
        if topic.endswith("/x"):
            orig_route(topic, payload, retain)  # identical duplicate
            body = json.loads(payload)
            body["x"] = body["x"] + 1.0
            orig_route(topic, json.dumps(body).encode(), retain)  # conflicting duplicate

    broker.route = echo  # type: ignore[method-assign]
    nodes = [
        Node(cfg, i, values[i], MemoryTransport(broker, f"n{i}"), run_id=RUN, edges=edges)
        for i in range(cfg.n)
    ]
    async with asyncio.TaskGroup() as tg:
        for nd in nodes:
            await nd.__aenter__()
        runs = [tg.create_task(nd.run()) for nd in nodes]
    results = [r.result() for r in runs]
    assert np.array_equal(np.array([r.x for r in results]).T, sim.recorded_x[:, 0, :])
    assert all(r.duplicates > 0 and r.rejected > 0 for r in results)


# 5: clear failures ----------------------------------------------------------------------------------
def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=timeout, check=False)


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("nlagg: error:")]


@pytest.mark.mosquitto
@pytest.mark.slow
async def test_a_neighbour_killed_for_good_departs_and_the_survivors_finish_exact(tmp_path: Path) -> None:
    """SIGKILL, never restarted: the survivors drop it at the same iteration and end with their own
    maximum, bit for bit ``simulate(cfg, departures={node: T})`` with the T they report."""
    cfg = CFG.model_copy(update={"t_max": 2000, "early_stop": False})  # departures: the fixed schedule
    async with FaultBed(cfg, tmp_path, neighbour_timeout=6.0) as bed:
        top = int(np.argmax(bed.values))
        await bed.start_nodes()
        await bed.wait_progress(0.1)
        await bed.kill_node(top)
        results = {}
        async with asyncio.timeout(120):
            for i, proc in bed.nodes.items():
                if i != top:
                    assert await proc.wait() == 0, (tmp_path / f"node-{i}.log").read_text()
                    results[i] = proc.events[-1]
    nbrs = [int(b if a == top else a) for a, b in bed.edges if top in (a, b)]
    seen = {results[j]["departed"][str(top)] for j in nbrs}
    assert len(seen) == 1  # every neighbour dropped it from the same iteration
    (t_dep,) = seen
    assert all("departed" not in r for i, r in results.items() if i not in nbrs)
    sim = simulate(bed.cfg, departures={top: t_dep})
    survivors = sorted(results)
    out = np.array([results[i]["output"][0] for i in survivors])
    assert np.array_equal(out, sim.output[0, survivors])
    assert np.allclose(out, np.delete(bed.values, top).max(), rtol=0, atol=cfg.tolerance)


@pytest.mark.mosquitto
async def test_refused_credentials_fail_at_once_with_one_line(tmp_path: Path) -> None:
    cfg_file = tmp_path / "run.json"
    cfg_file.write_text(json.dumps({"config": CFG.model_dump(mode="json")}))
    async with start_mosquitto(allow_anonymous=False) as broker:
        node = await asyncio.to_thread(
            run_cli, "node", "--id", "0", "--config", str(cfg_file), "--value", "1.0",
            "--broker", broker.url, "--run-id", "locked", "--username", "mallory",
        )  # fmt: skip
        eaves = await asyncio.to_thread(
            run_cli, "eavesdrop", "--broker", broker.url, "--run-id", "locked",
            "--transcript", str(tmp_path / "t.sqlite"), "--no-live",
        )  # fmt: skip
    for proc in (node, eaves):
        assert proc.returncode == 1
        (line,) = error_lines(proc.stderr)
        assert "refused" in line
        assert broker.url in line
        assert "authori" in line.lower()


@pytest.mark.mosquitto
async def test_config_that_contradicts_the_retained_one_is_refused(
    mosquitto_url: str, tmp_path: Path
) -> None:
    t = topics("nlagg", "mismatch")
    async with MqttTransport(mosquitto_url, client_id="launcher") as tr:
        msg = build_config_msg(CFG, "mismatch", run_edges(CFG))
        await tr.publish(t.config, encode(msg), retain=True)
    mine = tmp_path / "run.json"
    mine.write_text(json.dumps({"config": CFG.model_copy(update={"c": 7.5}).model_dump(mode="json")}))
    proc = await asyncio.to_thread(
        run_cli, "node", "--id", "0", "--config", str(mine), "--value", "1.0",
        "--broker", mosquitto_url, "--run-id", "mismatch", "--startup-timeout", "30",
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = error_lines(proc.stderr)
    assert "config.c=7.5" in line
    assert "retained config" in line
    assert "10.0" in line
