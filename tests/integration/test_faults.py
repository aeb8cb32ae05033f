"""Reliability against a real Mosquitto: crash and resume, broker restart, a lossless capture, hostile
input, and clear failures. Each faulty run is compared with the simulator's run of the same seed (the
in-process checks: tests/unit/test_faults.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.public import build_config_msg, run_edges
from nlagg_node.runtime.wire import StatusMsg, encode, topics
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
