"""Issue 31's poisoned measurement, replayed with a node's own credentials against a real Mosquitto
with the plan's ACL: the transcript holds what the nodes could use.

* An x^(0) and z^(0) published after the config, before the nodes connected, never reach the nodes;
  the real ones are the transcript's truth and the attack's precision stays 1.0 (it was 0.0).
* 300 different padded, decodable x's of 1 MB each (every node refuses them: in no phase) leave the
  transcript small: each is stored as at most 4 KiB, and the node's quota bounds their sum (it was
  315 MB).

The attack's memory on a transcript whose config announces far more than it holds is checked in
tests/unit/test_attack.py (the arrays' sizes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from adversary.transcript import MAX_INVALID_PAYLOAD, Transcript
from nlagg_node.config import RunConfig
from tests.harness.insider import Insider
from tests.harness.planbed import PlanBed

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

# The fixed schedule (the insider's x's carry no early-stop fields), as tests/integration/test_hostile.py.
CFG = RunConfig(
    op="max", n=6, graph="ring", trials=1, t_max=1200, c=10.0, mu_z=30.0, seed=4, early_stop=False
)


@pytest.mark.parametrize(
    ("auth", "refusals"),
    [(False, ("subscribed (they never received it)",)), (True, ("unsigned", "key chain"))],
    ids=["unsigned-plan-displaced", "signed-plan-refused"],
)
async def test_an_injection_before_the_nodes_subscribed_is_no_truth(
    tmp_path: Path, auth: bool, refusals: tuple[str, ...]
) -> None:
    """Without identities the real messages displace the early ones; with them (the default) the
    insider, who holds node 1's password but not its key, cannot sign: all three are refused."""
    async with PlanBed(CFG, tmp_path, auth=auth) as bed:  # the config is out, no node has connected
        await Insider.with_password_of(bed, 1).inject_start([0, 2], x=42.0, z=99.0)
        await bed.start_nodes()
        verdict = await bed.finish()
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail  # the transcript's x's and z^(0)'s are the simulator's
    assert (verdict.lost, verdict.extra) == (0, 0)
    assert verdict.precision == 1.0
    with Transcript(bed.db) as tr:
        refused = [why for _, why in tr.rejected()]
    assert sum(any(word in why for word in refusals) for why in refused) == 3, refused


async def test_padded_payloads_leave_the_transcript_small(tmp_path: Path) -> None:
    async with PlanBed(CFG, tmp_path) as bed:
        # Before the nodes start: mid-run, the insider's connection would take node 1's session
        # (sessions are bound to users) and node 1 would take it back, cutting the flood short.
        # 60 kB each: the plan's broker cuts a packet above its max_packet_size (64 KiB for this
        # plan, broker/README.md), so 1 MB payloads no longer reach anyone.
        await Insider.with_password_of(bed, 1).flood_padded(300, 60_000)
        await bed.start_nodes()
        verdict = await bed.finish()
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail
    assert verdict.precision == 1.0
    with Transcript(bed.db) as tr:
        refused = [why for _, why in tr.rejected()]
        stored = sum("not-a-phase" in why for why in refused)
        messages = tr.dropped().get(1, (0, 0))[0]
    assert stored + messages == 300, (stored, messages)
    assert stored * (MAX_INVALID_PAYLOAD + 64) < 4 * 1_000_000  # bounded by node 1's quota (18 MB sent)
    size = sum(p.stat().st_size for p in bed.db.parent.glob("transcript.sqlite*"))
    assert size < 20_000_000, size
