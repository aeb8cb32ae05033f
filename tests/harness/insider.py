"""An insider holding one node's broker credentials, against the transcript (issue 31, "Poisoned
measurement"): injections before the nodes subscribe, and padded payloads that still decode.

Built on :class:`~tests.harness.hostile.Intruder` (raw MQTT 3.1.1, QoS 0, the plan's ACL: only its
own node's topics).
"""

from __future__ import annotations

from dataclasses import dataclass

from nlagg_node.runtime.wire import topics
from tests.harness.hostile import Intruder
from tests.harness.mqtt_frames import publish_frame

__all__ = ["Insider", "padded_x"]


def padded_x(node: int, t: int, x: float, phase: str, size: int) -> bytes:
    """An x of ``size`` bytes: JSON whitespace before its closing brace, so it still decodes."""
    body = b'{"v":1,"node":%d,"t":%d,"phase":"%s","x":%r' % (node, t, phase.encode(), x)
    return body + b" " * (size - len(body) - 1) + b"}"


@dataclass
class Insider(Intruder):
    """Node ``node``'s credentials in the wrong hands, after the run's configuration is out."""

    async def inject_start(self, neighbours: list[int], x: float, z: float) -> None:
        """Its node's x^(0) and z^(0) to ``neighbours``, before any node has connected (a run whose
        first phase and dual group are both ``phase_at(0)``, as max, min or median)."""
        phase = group = self.phase_at(0)
        tp = topics(self.prefix, self.run_id)
        i = self.node
        frames = [
            publish_frame(tp.x(i), b'{"v":1,"node":%d,"t":0,"phase":"%s","x":%r}' % (i, phase.encode(), x))
        ]
        for j in neighbours:
            body = b'{"v":1,"from":%d,"to":%d,"group":"%s","z":%r}' % (i, j, group.encode(), z)
            frames.append(publish_frame(tp.z0(i, j), body))
        await self._session(f"insider-{i}", frames)

    async def flood_padded(self, count: int, size: int) -> None:
        """``count`` different padded x's of ``size`` bytes that every node refuses (in no phase)."""
        tp = topics(self.prefix, self.run_id)
        t = self.current_t() + 1
        frames = [
            publish_frame(tp.x(self.node), padded_x(self.node, t, 42.0 + k, "not-a-phase", size))
            for k in range(count)
        ]
        await self._session(f"insider-{self.node}", frames)
