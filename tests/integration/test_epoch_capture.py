"""One eavesdropper captures three epochs of a deployment through Mosquitto, killed and restarted
between two of them, and the attack combines the epochs (in memory: tests/unit/test_epoch_store.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from adversary.epochs import attack_epochs
from adversary.transcript import EpochStore
from nlagg_node.argv import eavesdrop_argv, this_python
from nlagg_node.config import RunConfig
from nlagg_node.lab.children import Child
from nlagg_node.lab.testbed import run_testbed
from nlagg_node.rng import rng_for
from nlagg_node.runtime.mqtt import MqttTransport

N, SPAN, DRIFT = 6, 100.0, 0.02


async def start_capture(url: str, store: Path, log: Path) -> Child:
    argv = eavesdrop_argv(
        url,
        "R",
        str(store),
        prefix="P",
        events=True,
        live=False,
        continuous=True,
        keep_epochs=2,
        epochs=3,
        program=this_python(),
    )
    child = await Child.start(argv, log=log)
    async with asyncio.timeout(120):
        await child.subscribed.wait()
    return child


async def until_closed(child: Child, epoch: int) -> None:
    async with asyncio.timeout(120):
        while not any(e.get("event") == "epoch_closed" and e.get("epoch") == epoch for e in child.events):
            assert child.returncode is None, child.lines[-5:]
            await asyncio.sleep(0.1)


@pytest.mark.mosquitto
async def test_three_epochs_into_one_store_across_a_restart(mosquitto_url: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    rng = rng_for(3, "walk")
    s = rng.uniform(20.0, 80.0, N)
    truth, exposed = [], []
    child = await start_capture(mosquitto_url, store, tmp_path / "eve.log")
    try:
        for k in range(3):
            if k:
                s = np.clip(s + rng.uniform(-DRIFT * SPAN, DRIFT * SPAN, N), 0.0, SPAN)
            truth.append(s.copy())
            (tmp_path / f"v{k}.txt").write_text(" ".join(repr(float(v)) for v in s))
            cfg = RunConfig(
                op="median",
                n=N,
                seed=30 + k,
                t_max=300,
                early_stop=False,
                value_range=(0.0, SPAN),
                values_file=tmp_path / f"v{k}.txt",
            )
            if k == 2:  # epoch 1 went by while it was down: its persistent session kept every message
                child = await start_capture(mosquitto_url, store, tmp_path / "eve.log")
            summary = await run_testbed(
                cfg,
                run_id=f"e{k}",
                prefix="P/R",
                broker_url=mosquitto_url,
                in_process=True,
                out_dir=tmp_path / f"tb{k}",
            )
            exposed.append(sorted(summary["exposed_nodes"]))
            async with MqttTransport(mosquitto_url, client_id=f"results-{k}") as tr:
                for i, out in summary["final_x"].items():
                    doc = {"v": 1, "node": int(i), "epoch": k, "output": out, "iterations": 300, "time": 1e9}
                    await tr.publish(f"P/R/results/{i}", json.dumps(doc).encode(), retain=True)
            if k == 0:
                await until_closed(child, 0)
                await child.kill()
        async with asyncio.timeout(180):
            assert await child.wait() == 0
    finally:
        await child.stop()
    assert child.last_event("pruned") == {"event": "pruned", "epoch": 0}
    with EpochStore(store, read_only=True) as st:
        assert [(r.epoch, r.state) for r in st.epochs()] == [(0, "pruned"), (1, "closed"), (2, "closed")]
        assert len(st.results()) == 3 * N
    report = attack_epochs(store, drift=DRIFT)
    assert [e.exposed for e in report.epochs] == exposed  # each epoch as its own testbed's capture saw it
    assert all(e.complete for e in report.epochs)
    assert all(node.consistent for node in report.nodes)
    assert report.interval_soundness(dict(enumerate(truth))) == 1.0
