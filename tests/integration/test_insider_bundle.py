"""Issue 43, breaks 1, 3 and 6, on a deployed plan: node 0's whole bundle in the wrong hands.

The plan's own Mosquitto (password file, graph ACL), identities and launcher; node 0 is run by an
insider holding its broker password, signing key and value file, whose node publishes node 0's own
signed x's with forged early-stop fields (:mod:`tests.harness.turncoat`):

* break 1, a forged stop: median of 80 85 90 88 92 95 on a ring of 6, node 0's x^(10..15) saying
  the phase stops at t = 15. Before stop claims were checked every node output 76.67 after 16
  iterations and exited 0; now node 0's neighbours refuse the claim naming node 0, and the run ends
  as the honest one;
* break 3, a forged candidate of the certified stop (max): 1e6 without a value range (every output
  was 1e6), and with a range one outside it. Node 0's neighbours and the eavesdropper's transcript
  refuse those x's, named (``cand of x_0^(t)=...``), and the neighbours, short of node 0's x, fail.

Each asserts bounded influence: no honest node exits 0 with an output node 0 could not have caused
by lying about its own value (the ideal world with a lying participant: any value a node may hold).

* break 6, forged results records: on a continuous plan's broker, a retained record on a results
  topic signed by no node or by another node's key is refused, named, by the warm-start reader
  every node runs before an epoch; node 0's own signed record is one record of the quorum's
  median (before signed results and the quorum, the reader warm-started from the forger's 99).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from nlagg_node.config import RunConfig
from nlagg_node.deploy.continuous import EpochTimetable
from nlagg_node.epochplan import HeardOutput
from nlagg_node.runtime.wire import topics
from tests.harness.planbed import PlanBed
from tests.harness.records import Records
from tests.harness.turncoat import Forge, bounded_influence

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

VALUES = "80 85 90 88 92 95\n"  # issue 43's values, node 0 holding 80
START = 2.99  # max's from-above start without a range at n = 6 (mu_z / c = 3, less 1 / c): no value above
LATE = 10**6  # the forge's last iteration: every x from its first on


CASES = [
    pytest.param(
        {"op": "median", "seed": 1},
        Forge(10, 15, stop=15),
        "stop=15 from node 0 with its x^(",
        True,
        id="break1-forged-stop-median",
    ),
    pytest.param(
        {"op": "max", "seed": 4, "values_file": None},
        Forge(20, LATE, cand=1e6),
        f"cand of x_0^(20)=1000000.0: not below the from-above start {START}",
        False,
        id="break3-cand-1e6-without-range",
    ),
    pytest.param(
        {"op": "max", "seed": 4, "value_range": (0.0, 100.0)},
        Forge(20, LATE, cand=1.5),  # protocol scale: 150 in the values' units
        "cand of x_0^(20)=1.5: outside [0, 1]",
        False,
        id="break3-cand-outside-range",
    ),
]


@pytest.mark.parametrize(("kw", "forge", "refusal", "completes"), CASES)
async def test_an_insider_with_node_0s_bundle_moves_no_output_beyond_bounded_influence(
    tmp_path: Path, kw: dict[str, Any], forge: Forge, refusal: str, completes: bool
) -> None:
    values = tmp_path / "values.txt"
    values.write_text(VALUES)
    cfg = RunConfig(n=6, graph="ring", trials=1, **({"values_file": values} | kw))
    async with PlanBed(cfg, tmp_path, run_id="insider-bundle") as bed:
        await bed.start_nodes(extra=["--neighbour-timeout", "20"], turncoat=(0, forge))
        outcomes = await bed.outcomes()
    # Median: the lower middle of the five honest values and any sixth one, [88, 90]; max: from the
    # honest max to the top of what a node may hold (the range's, or the start without one).
    lo, hi = bounded_influence(bed.cfg, [v for i, v in bed.plan.values.items() if i != 0])
    slack = 1e-6 * (hi - lo)
    beyond = {
        i: result["output"]
        for i, (rc, result) in outcomes.items()
        if i != 0 and rc == 0 and result is not None and not lo - slack <= result["output"][0] <= hi + slack
    }
    assert not beyond, (beyond, (lo, hi), bed.report())
    logs = {i: (bed.logs / f"node{i}.log").read_text() for i in (1, 5)}  # node 0's neighbours
    assert all(refusal in log for log in logs.values()), (refusal, bed.report())
    assert all(rc == 0 for _, (rc, _) in outcomes.items()) == completes, outcomes
    if forge.cand is not None:  # a refused x: the eavesdropper's transcript refuses it alike
        refused = refusals(bed.db, topics("nlagg", bed.run_id).x(0))
        assert any(refusal in why for why in refused), refused[:5]


def refusals(db: Path, topic: str) -> list[str]:
    """Why the transcript refused each message it captured on ``topic``."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as con:
        rows = con.execute("SELECT error FROM messages WHERE valid = 0 AND topic = ?", (topic,)).fetchall()
    return [str(why) for (why,) in rows]


HONEST = 95.0  # epoch 0's output as nodes 2, 3 and 5 publish it (signed, each with its own key)
FORGED_OUTPUT = 99.0  # above it: the middle of two records (sorted[1]), the warm start before signed results

RESULTS = [
    pytest.param(0, None, "unsigned message", id="unsigned-password-only"),
    pytest.param(1, 0, "does not verify with node 1's identity", id="node-0s-key-on-node-1s-topic"),
    pytest.param(0, 0, None, id="node-0s-own-record"),
]


@pytest.mark.parametrize(("topic_of", "signer", "refusal"), RESULTS)
async def test_forged_results_records_steer_no_warm_start(
    tmp_path: Path, topic_of: int, signer: int | None, refusal: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43, break 6, on a continuous plan's own broker, ACL and identities: a record of epoch 0
    on node ``topic_of``'s results topic (its password), output 99, signed by no node or by node
    0's key (its whole bundle), beside one honest record of node 2. The warm-start reader every
    node runs before epoch 1 refuses a record its node did not sign, named; node 0's own signed
    lie is one record, short of the quorum of three. With nodes 3 and 5's honest records too, a
    quorum: their median is an honest one, whatever node 0 signed."""
    cfg = RunConfig(op="max", n=6, graph="ring", trials=1, seed=4, value_range=(0.0, 100.0))
    # No epoch runs: only the broker, its ACL and the identities are used.
    schedule = EpochTimetable(every=60.0, origin=time.time() + 3600.0, epochs=2)
    async with PlanBed(cfg, tmp_path, run_id="signed-results", capture=False, schedule=schedule) as bed:
        records = Records(bed)
        await records.publish(2, HONEST, 2)
        await records.publish(topic_of, FORGED_OUTPUT, signer)
        with caplog.at_level(logging.WARNING, logger="nlagg.node"):
            alone = await records.warm_start()
        await records.publish(3, HONEST, 3)
        await records.publish(5, HONEST, 5)
        quorum = await records.warm_start()
    assert alone is None  # cold: one honest record, the forged one refused or short of the quorum
    assert quorum == HeardOutput(0, HONEST)
    named = [m for r in caplog.records if f"results/{topic_of} holds no output" in (m := r.getMessage())]
    if refusal is None:  # node 0's own record is signed by node 0: taken, one record among the others
        assert named == []
    else:
        assert named, "the forged record was not refused"
        assert all(refusal in m for m in named), named
