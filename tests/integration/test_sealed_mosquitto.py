"""Sealed initialization on a real Mosquitto: exact, bit for bit the simulator, and private.

The trimmed mean of 15 nodes (2 + 2 trimmed; c = 10, mu_z = 40, so that 1500 iterations per
phase are exact and expose no node but the extremes) runs twice with the same seed: with every z^(0) in
plaintext (``--init-channel plain``, protocol v1) the transcript attack solves all 15 values; with
the default channel (``auto``: the average group sealed) it exposes the four trimmed extremes and
nothing else, and an independent ``mosquitto_sub`` holds no plaintext dual of the average group.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from adversary.attack import attack_transcript
from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.lab.testbed import run_testbed
from nlagg_node.runtime.mqtt import parse_broker_url
from nlagg_node.runtime.wire import SealedZ0Msg, Z0Msg, batch_range, decode
from nlagg_node.sim import simulate

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]
needs_sub = pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto_sub not installed")


@needs_sub
@pytest.mark.parametrize(("channel", "exposed_ranks"), [("plain", list(range(15))), ("auto", [0, 1, 13, 14])])
async def test_trimmed_mean_is_exact_and_sealed_duals_hide_the_middle(
    channel: str, exposed_ranks: list[int], mosquitto_url: str, tmp_path: Path
) -> None:
    cfg = RunConfig(
        op="trimmed-mean",
        n=15,
        k=2,
        trials=1,
        t_max=1500,
        avg_t_max=400,
        seed=6,
        c=10.0,
        mu_z=40.0,
        init_channel=channel,
    )
    run_id = f"sealed-{channel}"
    host, port = parse_broker_url(mosquitto_url)
    capture = tmp_path / "mosquitto_sub.txt"
    with capture.open("wb") as sink:  # a file, not a pipe: nobody reads a pipe during the run
        sub = await asyncio.create_subprocess_exec(
            *("mosquitto_sub", "-h", host, "-p", str(port), "-t", f"nlagg/{run_id}/#", "-v", "-q", "1"),
            stdout=sink,
        )
    try:
        await asyncio.sleep(0.5)  # let it subscribe
        summary = await run_testbed(
            cfg, broker_url=mosquitto_url, in_process=True, run_id=run_id, out_dir=tmp_path
        )
        await asyncio.sleep(0.5)
    finally:
        sub.terminate()
        await sub.wait()

    # Exact, and the same bits as the simulator (sealing changes the wire, not the numbers).
    sim = simulate(cfg.model_copy(update={"record": "all"}))
    with Transcript(tmp_path / "transcript.sqlite") as tr:
        assert np.array_equal(tr.x(cfg.n), sim.recorded_x[:, 0, :].T)
    finals = np.array([summary["final_x"][str(i)] for i in range(cfg.n)])
    assert np.array_equal(finals, sim.output[0])
    assert float(np.max(np.abs(finals - sim.truth_lo[0]))) < 1e-6
    assert summary["messages_rejected_by_nodes"] == 0

    # What an independent subscriber saw of the average group's z^(0).
    avg_z0 = []
    for line in capture.read_text().splitlines():
        topic, _, payload = line.partition(" ")
        if batch_range(topic, "nlagg", run_id) is not None:
            continue  # the host's x's, coalesced (split_x_batch): no z^(0) among them
        info, msg = decode(topic, payload.encode(), "nlagg", run_id)
        if info.kind == "z0" and msg.group == "average":  # type: ignore[union-attr]
            avg_z0.append((msg, json.loads(payload)))
    assert len(avg_z0) == 2 * len(sim.graphs[0])
    if channel == "plain":
        assert all(isinstance(m, Z0Msg) for m, _ in avg_z0)
    else:
        assert all(isinstance(m, SealedZ0Msg) for m, _ in avg_z0)
        assert all(
            "z" not in doc and not any(isinstance(v, float) for v in doc.values()) for _, doc in avg_z0
        )

    # The transcript attack, and the live eavesdropper, against the truth.
    report = attack_transcript(tmp_path / "transcript.sqlite")
    rank = sim.rank[0]
    assert sorted(int(rank[i]) for i in report.exposed) == exposed_ranks
    assert report.precision == 1.0
    assert sorted(int(rank[i]) for i in summary["exposed_nodes"]) == exposed_ranks


@needs_sub
async def test_node_surrounded_by_corrupted_nodes_is_recovered(mosquitto_url: str, tmp_path: Path) -> None:
    """Ring of 9 with nodes 0, 2, 5 corrupted: node 1's every neighbour forwards its duals."""
    cfg = RunConfig(op="trimmed-mean", n=9, graph="ring", k=1, trials=1, t_max=1500, avg_t_max=400, seed=0)
    summary = await run_testbed(
        cfg, broker_url=mosquitto_url, in_process=True, corrupt={0, 2, 5}, out_dir=tmp_path
    )
    sim = simulate(cfg)
    extremes = {i for i in range(cfg.n) if sim.rank[0, i] in (0, cfg.n - 1)}
    report = attack_transcript(tmp_path / "transcript.sqlite")
    assert set(report.exposed) == ({1} | extremes) - {0, 2, 5}
    assert report.precision == 1.0
    assert set(summary["exposed_nodes"]) == set(report.exposed)
