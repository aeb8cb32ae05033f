"""Issue 43, breaks 1 and 3, on a deployed plan: node 0's whole bundle in the wrong hands.

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
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from nlagg_node.config import RunConfig
from nlagg_node.runtime.wire import topics
from tests.harness.planbed import PlanBed
from tests.harness.turncoat import Forge

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

VALUES = "80 85 90 88 92 95\n"  # issue 43's values, node 0 holding 80
START = 2.99  # max's from-above start without a range at n = 6 (mu_z / c = 3, less 1 / c): no value above
LATE = 10**6  # the forge's last iteration: every x from its first on


Bounded = Callable[[Sequence[float]], tuple[float, float]]  # honest values -> the outputs node 0 may cause


def max_bound(top: float) -> Bounded:
    """Max: node 0 may claim any value up to ``top``, so the output lies in [honest max, top]."""
    return lambda honest: (max(honest), top)


CASES = [
    pytest.param(
        {"op": "median", "seed": 1},
        Forge(10, 15, stop=15),
        lambda honest: (88.0, 92.0),  # the middle pair of the five honest values and any sixth one
        "stop=15 from node 0 with its x^(",
        True,
        id="break1-forged-stop-median",
    ),
    pytest.param(
        {"op": "max", "seed": 4, "values_file": None},
        Forge(20, LATE, cand=1e6),
        max_bound(START),
        f"cand of x_0^(20)=1000000.0: not below the from-above start {START}",
        False,
        id="break3-cand-1e6-without-range",
    ),
    pytest.param(
        {"op": "max", "seed": 4, "value_range": (0.0, 100.0)},
        Forge(20, LATE, cand=1.5),  # protocol scale: 150 in the values' units
        max_bound(100.0),
        "cand of x_0^(20)=1.5: outside [0, 1]",
        False,
        id="break3-cand-outside-range",
    ),
]


@pytest.mark.parametrize(("kw", "forge", "bounded", "refusal", "completes"), CASES)
async def test_an_insider_with_node_0s_bundle_moves_no_output_beyond_bounded_influence(
    tmp_path: Path, kw: dict[str, Any], forge: Forge, bounded: Bounded, refusal: str, completes: bool
) -> None:
    values = tmp_path / "values.txt"
    values.write_text(VALUES)
    cfg = RunConfig(n=6, graph="ring", trials=1, **({"values_file": values} | kw))
    async with PlanBed(cfg, tmp_path, run_id="insider-bundle") as bed:
        await bed.start_nodes(extra=["--neighbour-timeout", "20"], turncoat=(0, forge))
        outcomes = await bed.outcomes()
    honest = [v for i, v in bed.plan.values.items() if i != 0]
    lo, hi = bounded(honest)
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
