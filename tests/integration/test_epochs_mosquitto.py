"""Continuous deployments on a real Mosquitto: the epoch testbed, and a plan made with ``--every``
whose ACL (every epoch through a ``+`` level, the results topics) the broker enforces."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from nlagg_node.config import RunConfig, load_config
from nlagg_node.deploy import PlanSpec, build_plan, security_lines, write_plan
from nlagg_node.deploy.continuous import EpochTimetable
from nlagg_node.deploy.identities import run_identities
from nlagg_node.epochplan import HeardOutput, epoch_start
from nlagg_node.lab.children import Child, log_tail
from nlagg_node.lab.epochtestbed import epoch_values, run_epoch_testbed
from nlagg_node.protocol import Verifier
from nlagg_node.runtime.brokers import start_mosquitto
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.outputs import (
    EpochOutput,
    published_record,
    read_outputs,
    results_filter,
    results_topic,
)
from nlagg_node.sim.multiepoch import simulate_epochs
from tests.harness.load import contention, stretched

ENTRY = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]
pytestmark = pytest.mark.mosquitto


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "processes"])
async def test_three_epochs_exact_with_changing_values(mosquitto_url: str, in_process: bool) -> None:
    cfg = RunConfig(op="median", n=5, graph="complete", value_range=(0.0, 100.0), seed=3)
    summary = await run_epoch_testbed(
        cfg, 3, stretched(8.0), run_id="tb-ep", broker_url=mosquitto_url, in_process=in_process
    )
    assert summary["in_process"] == in_process
    rows = summary["epochs"]
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert [r["present"] for r in rows] == [list(range(5))] * 3
    assert all(r["exact"] for r in rows), rows
    assert len({r["true_value"] for r in rows if isinstance(r["true_value"], float)}) == 3  # values changed
    for r in rows:  # the ideal world exposes the median's holder, and only it
        assert [float(epoch_values(cfg, r["epoch"], None)[i]) for i in r["ideal"]] == [r["true_value"]]


async def test_three_drifting_epochs_run_warm_and_exact(mosquitto_url: str) -> None:
    cfg = RunConfig(op="max", n=5, graph="complete", value_range=(0.0, 100.0), seed=6)  # 696 iterations cold
    summary = await run_epoch_testbed(
        cfg, 3, stretched(8.0), run_id="tb-warm", broker_url=mosquitto_url, in_process=True, drift=0.005
    )
    rows = summary["epochs"]
    assert all(r["exact"] for r in rows), rows
    assert [r["start"] for r in rows] == ["cold", "warm", "warm"]
    assert max(r["iterations"] for r in rows[1:]) < rows[0]["iterations"]


@pytest.mark.slow  # a minute per operator: each epoch's period leaves a loaded machine room to finish
@pytest.mark.parametrize("op", ["max", "median"], ids=["max-certified", "median-shells"])
async def test_a_testbed_of_epochs_is_the_simulators_epochs_of_one_trial_bit_for_bit(
    mosquitto_url: str, op: str
) -> None:
    """One epoch planner (nlagg_node.epochplan): the same walk, warm starts, shells and streams."""
    cfg = RunConfig(op=op, n=8, seed=5, value_range=(0.0, 1.0), may_depart=True, trials=1)
    drift, epochs = 0.05, 2
    summary = await run_epoch_testbed(
        cfg,
        epochs,
        stretched(30.0),
        run_id=f"tb-plan-{op}",
        broker_url=mosquitto_url,
        in_process=True,
        drift=drift,
    )
    sim = simulate_epochs(cfg, epochs, drift)
    rows = summary["epochs"]
    assert [r["start"] for r in rows] == ["cold", "warm"]
    assert [r["iterations"] for r in rows] == sim.iterations[:, 0].tolist()
    assert [r["output"] for r in rows] == sim.output[:, 0].tolist()
    outside = [  # nodes that ran a shell value in a warm epoch
        i
        for k in range(1, epochs)
        for i, v in enumerate(sim.values[k, 0])
        if (ws := epoch_start(cfg, k, HeardOutput(k - 1, float(sim.output[k - 1, 0])), drift).warm)
        and not ws.in_band(float(v))
    ]
    assert op == "max" or outside, "the median's warm epochs ran no shell value"


async def test_a_plan_with_every_runs_two_epochs_under_its_acl(tmp_path: Path) -> None:
    run = load_config(None, op="median", n=5, graph="complete", value_range=(0.0, 100.0))
    load = contention()  # a busy machine gets longer epochs, not skipped ones
    origin = time.time() + stretched(12.0, load)  # the node processes start meanwhile
    spec = PlanSpec(
        run=run, run_id="green", seed=5, schedule=EpochTimetable(stretched(10.0, load), origin, 2)
    )
    root = tmp_path / "plan"
    write_plan(build_plan(spec), root)
    lines = security_lines(str(root / "broker" / "passwd"), str(root / "broker" / "acl"))
    async with start_mosquitto(extra_lines=[*lines, "user root"], allow_anonymous=False) as broker:
        # A node cannot write another node's results topic (denied: the broker drops it).
        intruder = (root / "secrets" / "node1.pw").read_text().strip()
        async with MqttTransport(broker.url, client_id="x", username="node1", password=intruder) as t:
            await t.publish(results_topic("nlagg", "green", 0), b'{"v": 1}', retain=True)
        procs = []
        for i in range(run.n):
            argv = [*ENTRY, "deploy", "node", str(root / "nodes" / f"{i}.toml"), "--broker", broker.url]
            procs.append(await Child.start(argv, log=tmp_path / f"node-{i}.log"))
        codes = await asyncio.gather(*(p.wait() for p in procs))
        assert codes == [0] * run.n, [log_tail(tmp_path / f"node-{i}.log") for i in range(run.n)]
        heard: dict[int, EpochOutput] = {}
        keys = run_identities(root / "run.toml")
        assert keys is not None
        verifier = Verifier(keys)
        operator = (root / "secrets" / "launcher.pw").read_text().strip()
        async with MqttTransport(broker.url, client_id="op", username="launcher", password=operator) as t:
            await t.subscribe(results_filter("nlagg", "green"))
            async with asyncio.timeout(10):
                async for msg in t.messages():
                    r = published_record(msg.topic, msg.payload, verifier)  # signed by its node
                    heard[r.node] = r
                    if len(heard) == run.n:
                        break
        csv_path = tmp_path / "series.csv"
        argv = [*ENTRY, "results", "--broker", broker.url, "--run-id", "green", "--username", "launcher"]
        argv += [
            "--password-file",
            str(root / "secrets" / "launcher.pw"),
            "--wait",
            "1",
            "--csv",
            str(csv_path),
        ]
        shown = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        printed, _ = await shown.communicate()
    values = [float((root / "values" / f"{i}.txt").read_text()) for i in range(run.n)]
    assert sorted(heard) == list(range(run.n))
    assert {r.epoch for r in heard.values()} == {1}  # the retained latest epoch of every node
    assert printed.decode().startswith("epoch 1: output "), printed
    assert len(csv_path.read_text().splitlines()) == 1 + run.n  # the header, a row per node
    for i in range(run.n):
        series = read_outputs(root / "state" / f"results-{i}.jsonl")
        assert [r.epoch for r in series] == [0, 1]
        assert all(r.output == pytest.approx(sorted(values)[2], abs=run.tolerance * 100) for r in series)
        assert os.stat(root / "state" / f"results-{i}.jsonl").st_mode & 0o777 == 0o600
