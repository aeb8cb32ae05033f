"""Issue 31's insider with a stolen broker password, against a plan with identities (its own files).

Node 1's password (not its signing key) in the wrong hands, on the plan's own Mosquitto and ACL:

* mid-run, one burst of three forged x_1^(t) inside the nodes' window (unsigned, and signed with a
  key of the intruder's own): every node refuses them for their signature and ends with the
  simulator's output, and the transcript stores them as rejected, never as truth;
* before node 1 starts, a retained X25519 key planted on node 1's key topic (a run that seals its
  z^(0)): its neighbours refuse it and wait for node 1's own signed key; the run completes exact.
"""

from __future__ import annotations

import base64
import contextlib
import sqlite3
from pathlib import Path

import pytest

from adversary.transcript import Transcript
from nlagg_node.config import RunConfig
from nlagg_node.protocol import new_identity
from nlagg_node.runtime.seal import new_key, public_bytes
from nlagg_node.runtime.wire import KeyMsg, encode, encode_x, topics
from tests.harness.hostile import Intruder
from tests.harness.mqtt_frames import publish_frame
from tests.harness.planbed import PlanBed

pytestmark = [pytest.mark.mosquitto, pytest.mark.slow]

FORGED = (2337.43, 2348.74, 13595.27)  # the outputs issue 31's forgeries produced before
CFG = RunConfig(
    op="max", n=6, graph="ring", trials=1, t_max=2400, c=10.0, mu_z=30.0, seed=4, early_stop=False
)


def stored(db: Path, needle: bytes) -> list[tuple[int, str | None]]:
    """``(valid, error)`` of every stored message whose payload holds ``needle``."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT valid, error, payload FROM messages").fetchall()
    return [(int(valid), error) for valid, error, payload in rows if needle in bytes(payload)]


async def test_forged_x_in_the_window_are_refused_by_every_node_and_the_transcript(tmp_path: Path) -> None:
    async with PlanBed(CFG, tmp_path, run_id="insider-x") as bed:
        assert bed.plan.identities, "a plan signs by default"
        await bed.start_nodes()
        await bed.wait_t(0.3)
        spy = Intruder.with_password_of(bed, 1)
        t_now = spy.current_t()
        x1 = topics("nlagg", bed.run_id).x(1)
        own_key = new_identity()  # signed, but not with node 1's identity
        frames = [
            publish_frame(x1, encode_x(node=1, t=t_now + 1, phase=bed.phase_at(t_now + 1), x=FORGED[0])),
            publish_frame(
                x1,
                own_key.sign(x1, encode_x(node=1, t=t_now + 2, phase=bed.phase_at(t_now + 2), x=FORGED[1])),
            ),
            publish_frame(x1, encode_x(node=1, t=t_now + 3, phase=bed.phase_at(t_now + 3), x=FORGED[2])),
        ]
        await spy.send(frames)
        verdict = await bed.finish()
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail  # every node's output is the simulator's
    assert (verdict.lost, verdict.extra) == (0, 0)
    for value in FORGED:
        rows = stored(bed.db, repr(value).encode())
        assert rows, f"the forged x {value} was not captured"
        assert all(valid == 0 for valid, _ in rows), rows  # rejected, never the transcript's truth
    # Each of node 1's two neighbours refused each forgery for its signature.
    assert verdict.rejected_by_nodes >= 2 * len(FORGED), bed.report()


async def test_a_planted_key_is_refused_and_the_run_completes(tmp_path: Path) -> None:
    planted = KeyMsg(node=1, key=base64.b64encode(public_bytes(new_key())).decode())

    async def plant(bed: PlanBed) -> None:
        topic = topics("nlagg", bed.run_id).key(1)
        await Intruder.with_password_of(bed, 1).send([publish_frame(topic, encode(planted), retain=True)])

    cfg = CFG.model_copy(update={"t_max": 300, "init_channel": "sealed"})
    async with PlanBed(cfg, tmp_path, run_id="insider-key", early=plant) as bed:
        await bed.start_nodes()
        verdict = await bed.finish()
    assert verdict.completed, (verdict.detail, bed.report())
    assert verdict.identical, verdict.detail
    rows = stored(bed.db, planted.key.encode())
    assert rows, "the planted key was not captured"
    assert all(valid == 0 for valid, _ in rows), rows
    assert any("unsigned message" in str(why) for _, why in rows), rows
    with Transcript(bed.db) as tr:
        assert any(topic.endswith("/node/1/key") for topic, _ in tr.rejected())
