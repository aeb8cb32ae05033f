"""Issue 43, breaks 2 and 4: a plan run twice with the same run id, and node 1's broker password (not
its signing key) in the wrong hands for the second start.

The impostor plays node 1 in the second start from the first start's transcript: node 1's signed
statuses, z^(0) and X25519 key replayed verbatim, and x's of a value of its own carrying the chain
elements node 1 published in the first start. Before run instances (:mod:`nlagg_node.protocol.instance`)
every signature and chain verified again and every honest node exited 0 with the impostor's value
as its output. Now each honest neighbour refuses them, named as messages of another start of the
run, and no honest node exits 0 with an output beyond the honest values (node 1 counts as absent).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import pytest

from nlagg_node.config import RunConfig
from tests.harness.planbed import PlanBed
from tests.harness.rerun import FirstStart, Impostor

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

FORGED = 9999.0  # the impostor's x: far above every drawn value
CFG = RunConfig(op="max", n=6, graph="ring", trials=1, t_max=200, c=10.0, mu_z=30.0, seed=4, early_stop=False)


@pytest.mark.parametrize("channel", ["plain", "sealed"], ids=["plain-z0", "sealed-z0-replayed-key"])
async def test_a_second_start_refuses_the_first_starts_messages(tmp_path: Path, channel: str) -> None:
    cfg = CFG.model_copy(update={"init_channel": channel})
    async with PlanBed(cfg, tmp_path, run_id="rerun") as bed:
        await bed.start_nodes()
        first = await bed.finish()
        assert first.completed, (first.detail, bed.report())
        replay = FirstStart.of(bed.db, "nlagg", bed.run_id, 1)
        assert replay.chain, "the first start's x's of node 1 were not captured"
        assert replay.statuses, "the first start's statuses of node 1 were not captured"
        shutil.rmtree(bed.root / "state")  # the first start's finished checkpoints: a fresh start
        await bed.relaunch()
        await bed.start_nodes(skip=frozenset({1}))
        impostor = Impostor(
            url=bed.url,
            prefix="nlagg",
            run_id=bed.run_id,
            node=1,
            neighbours=[0, 2],
            password=bed.password("node1"),
            first=replay,
            value=FORGED,
            phase_at={t: bed.phase_at(t) for t in range(bed.t_total)},
        )
        playing = asyncio.create_task(impostor.play())
        try:
            outcomes = await bed.outcomes()
        finally:
            playing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await playing
    # Bounded influence with node 1's password only: node 1 absent, the output at most the honest max
    # (up to the run's own convergence error, well below the honest values' spread).
    honest = [v for i, v in bed.plan.values.items() if i != 1]
    bound = max(honest) + 0.1 * (max(honest) - min(honest))
    beyond = {
        i: result["output"]
        for i, (rc, result) in outcomes.items()
        if rc == 0 and result is not None and max(result["output"]) > bound
    }
    assert not beyond, (beyond, bound, bed.report())
    logs = {i: (bed.logs / f"node{i}.log").read_text() for i in (0, 2)}
    named = [i for i, log in logs.items() if "replayed from another start of the run" in log]
    assert named, bed.report()  # node 1's neighbours name why they refuse what it sent
