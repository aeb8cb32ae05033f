"""Issue 13's red team, replayed: one node's own credentials against a real Mosquitto with the plan's ACL.

Before the run's configuration is out it sends x's with t = 2^64 and t = 10^12; mid-run it forges
x's outside every barrier window and in no phase, publishes 10 MiB and 100 MiB payloads, and takes
over another node's client id three times. The eavesdropper keeps running, the transcript stays
complete and holds exactly the simulator's messages, the attack's precision stays 1.0, and every
node ends with the simulator's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from tests.harness.hostile import Intruder
from tests.harness.planbed import PlanBed

pytestmark = pytest.mark.mosquitto

# The fixed schedule: tests/harness/hostile.py forges x's without early-stop fields. 1200 iterations: the
# strike at 30% must land while the run (and the capture) still goes, on a loaded 2-core machine too.
CFG = RunConfig(
    op="max", n=6, graph="ring", trials=1, t_max=1200, c=10.0, mu_z=30.0, seed=4, early_stop=False
)


@pytest.mark.slow
async def test_a_hostile_credential_holder_changes_nothing(tmp_path: Path) -> None:
    async with PlanBed(
        CFG,
        tmp_path,
        corrupt="0,1,2",
        early=lambda bed: Intruder.with_password_of(bed, 0, victim=1).before_config(),
    ) as bed:
        await bed.start_nodes()
        await bed.wait_t(0.3)
        t_forged = await Intruder.with_password_of(bed, 0, victim=1).strike()
        verdict = await bed.finish()
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail
    assert (verdict.lost, verdict.extra) == (0, 0)
    assert verdict.precision == 1.0
    with Transcript(bed.db) as tr:
        refused = [why for _, why in tr.rejected()]
    assert sum("Expected `int` <= 9999999" in why for why in refused) == 2  # t = 2^64, 10^12: no config yet
    assert any("outside every neighbour's window" in why for why in refused), (t_forged, refused)
    assert any("phase 'not-a-phase'" in why for why in refused)
    assert any("the run has iterations" in why for why in refused)
