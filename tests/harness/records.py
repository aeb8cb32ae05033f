"""Results records forged by an insider on a continuous plan's broker (issue 43, break 6).

:class:`Records` publishes epoch 0's retained record on a node's results topic with that topic's
broker password (:class:`~tests.harness.hostile.Intruder`), signed with some node's key from the
plan (its whole bundle) or with none, and runs the warm-start reader every node runs before epoch
1 (:func:`~nlagg_node.runtime.warmstart.read_published_output`), as node 4 with its password.
"""

from __future__ import annotations

import time

from nlagg_node.deploy.identities import identity_file, load_identity, run_identities
from nlagg_node.epochplan import HeardOutput
from nlagg_node.protocol import Verifier
from nlagg_node.runtime.mqtt import MqttTransport
from nlagg_node.runtime.outputs import EpochOutput, results_topic, sign_record
from nlagg_node.runtime.warmstart import read_published_output
from tests.harness.hostile import Intruder
from tests.harness.mqtt_frames import publish_frame
from tests.harness.planbed import PlanBed

__all__ = ["READER", "Records"]

READER = 4  # the node whose warm start is read (no record of it is ever published here)


class Records:
    """Epoch 0's records on ``bed``'s broker (a continuous plan with identities) and the warm start."""

    def __init__(self, bed: PlanBed) -> None:
        keys = run_identities(bed.root / "run.toml")
        assert keys is not None, "a plan signs by default"
        self.bed = bed
        self.verifier = Verifier(keys)

    async def publish(self, topic_of: int, output: float, signer: int | None) -> None:
        """Epoch 0's record with ``output`` on node ``topic_of``'s results topic (its password),
        signed by node ``signer``'s key (None: unsigned)."""
        bed = self.bed
        topic = results_topic("nlagg", bed.run_id, topic_of)
        record = EpochOutput(node=topic_of, epoch=0, output=output, iterations=500, time=time.time())
        key = None if signer is None else load_identity(bed.root / identity_file(f"node{signer}"))
        sender = Intruder.with_password_of(bed, topic_of)
        await sender.send([publish_frame(topic, sign_record(record, topic, key), retain=True)])

    async def warm_start(self) -> HeardOutput | None:
        """What node :data:`READER`'s warm start reads before epoch 1 (None: a cold start)."""
        bed = self.bed
        user = f"node{READER}"
        reader = MqttTransport(bed.url, client_id="reader", username=user, password=bed.password(user))
        now = time.time()
        return await read_published_output(
            reader, ("nlagg", bed.run_id), 1, now + 1.0, now + 2.0, self.verifier, bed.cfg.n
        )
