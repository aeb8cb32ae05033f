"""A node's view of its neighbours (who is online) and its outbox (what a neighbour may have missed).

Every message a node publishes is idempotent for its receivers: they drop an identical copy as a
duplicate. So whenever a neighbour may have lost something, the node simply publishes it again:

* a neighbour announces ``online`` (it restarted, perhaps from a checkpoint) or ``running``
  again (it republished after a session loss, see below): our z^(0) to it, of every dual group
  so far, and our last two x's (:meth:`Outbox.resend_to`);
* our own connection came back without its session (a broker that crashed without persistence
  lost its queues, subscriptions and retained messages): our public key (sealed runs), our
  status, our z^(0), and our x's and adversary states of the last :data:`HISTORY` iterations
  (:meth:`Outbox.republish`), at once for the neighbours and again :data:`RESEND_AFTER` seconds
  later for a subscriber (the eavesdropper) that resubscribes after us: the broker lost what it
  had queued for it, and it hears nothing published before its new subscription (a node that
  finishes meanwhile waits for these resends before it exits, :meth:`Outbox.settle`);
* our own connection came back with its session: the broker published our last will
  (``offline``, retained) when the connection broke, so our status goes out again
  (:meth:`Outbox.republish_status`), or it would read ``offline`` while we run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from ..errors import NlaggError
from ..protocol.chain import KeyChain, key_b64
from .auth import SignedTransport
from .transport import Transport
from .wire import encode_x, topics

__all__ = ["HISTORY", "LIVE", "RESEND_AFTER", "Neighbours", "Outbox"]

LIVE = ("online", "running", "done")
HISTORY = 2048  # x's a node keeps to publish again after its session was lost (about 150 KB)
RESEND_AFTER = (2.0, 6.0, 15.0)  # seconds after a lost session at which it publishes them again


class Neighbours:
    """The last status of every neighbour, and an event set once all of them are live."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.state: dict[int, str] = {}
        self.all_live = asyncio.Event()

    def update(self, j: int, state: str) -> None:
        self.state[j] = state
        if all(self.state.get(k) in LIVE for k in self.ids):
            self.all_live.set()

    def not_live(self) -> list[int]:
        return [j for j in self.ids if self.state.get(j) not in LIVE]


class Outbox:
    """Publishes a node's messages and keeps what it may have to publish again.

    Parameters
    ----------
    transport : the connection (shared by the nodes of a host).
    names : the run's topic names.
    node : this node's id.
    """

    def __init__(self, transport: Transport, names: topics, node: int, chain: KeyChain | None = None) -> None:
        self.transport = transport
        self._sign = transport.signed if isinstance(transport, SignedTransport) else None
        # A run with identities: each x carries its key-chain element, each status the chain's anchor.
        self.chain = chain
        self._anchor = b"" if chain is None else b',"chain":"%s"}' % key_b64(chain.anchor).encode()
        self.node = node
        self.run = names.named  # the run its status and key name (an epoch's, on shared topics)
        self.x_topic = names.x(node)
        self.adv_topic = names.adv(node)
        self.status_topic = names.status(node)
        self.key_topic = names.key(node)
        self._z0_topic = names.z0
        self.z0: dict[str, dict[int, bytes]] = {}  # group -> neighbour -> payload
        self.z0_open: str | None = None  # the group whose exchange is in progress
        self.x: dict[int, bytes] = {}  # the last two x payloads by iteration
        # The last HISTORY iterations' x's (and adversary states): (topic, payload).
        self.history: deque[tuple[str, bytes]] = deque(maxlen=2 * HISTORY)
        self._later: list[asyncio.TimerHandle] = []
        self.adv: bytes | None = None
        self.status: bytes | None = None
        self.key: bytes | None = None

    def send_x(
        self,
        t: int,
        phase: str,
        x: float,
        fields: tuple[int, int | None, Sequence[int], float | None] | None = None,
    ) -> None:
        """Publish x_i^(t) without waiting (hot path); with early stopping, ``fields`` are its quiet
        counter, stop (None while unknown), the departures it knows of and its certified stop's
        candidate (None: none, or not a certified run)."""
        self.transport.publish_nowait(self.x_topic, self._kept_x(t, phase, x, fields), qos=1)

    def x_item(
        self,
        t: int,
        phase: str,
        x: float,
        fields: tuple[int, int | None, Sequence[int], float | None] | None = None,
    ) -> bytes:
        """x_i^(t) as :meth:`send_x` would publish it (signed in a run with identities), kept as
        :meth:`send_x` keeps it, but not published: a host coalesces it with its other nodes' x's
        (:class:`~nlagg_node.runtime.wire.XBatchMsg`)."""
        payload = self._kept_x(t, phase, x, fields)
        return self._sign(self.x_topic, payload) if self._sign is not None else payload

    def _kept_x(
        self, t: int, phase: str, x: float, fields: tuple[int, int | None, Sequence[int], float | None] | None
    ) -> bytes:
        """x_i^(t)'s payload (unsigned: the transport signs it), kept for a neighbour or a republish."""
        k = None if self.chain is None else key_b64(self.chain.key(t))
        quiet, stop, departures, cand = (None, None, (), None) if fields is None else fields
        payload = encode_x(self.node, t, phase, x, quiet, stop, tuple(departures) or None, cand, k)
        self.x[t] = payload
        self.x.pop(t - 2, None)
        self.history.append((self.x_topic, payload))
        return payload

    @property
    def sent_x(self) -> bool:
        """Whether an x has been published (or restored from a checkpoint for a republish)."""
        return bool(self.x)

    def send_adv(self, payload: bytes) -> None:
        self.adv = payload
        self.history.append((self.adv_topic, payload))
        self.transport.publish_nowait(self.adv_topic, payload, qos=1)

    def keep_z0(self, group: str, payloads: dict[int, bytes]) -> None:
        self.z0[group] = payloads

    async def send_z0(self, group: str, payloads: dict[int, bytes]) -> None:
        """Publish z_{i|j}^(0) to every neighbour j, awaiting the broker (one round trip for all)."""
        self.z0[group] = payloads
        self.z0_open = group
        await asyncio.gather(
            *(self.transport.publish(self._z0_topic(self.node, j), p, qos=1) for j, p in payloads.items())
        )

    def z0_done(self) -> None:
        self.z0_open = None

    def set_status(self, payload: bytes) -> None:
        """Publish a new status without waiting (kept, like every status, for a republish)."""
        self.status = payload = self._anchored(payload)
        self.transport.publish_nowait(self.status_topic, payload, qos=1, retain=True)

    def send_key(self, payload: bytes) -> None:
        """Publish our public key of the run (retained) without waiting: the ``online`` status that
        follows on the same connection reaches every subscriber after it (QoS 1 keeps the order)."""
        self.key = payload
        self.transport.publish_nowait(self.key_topic, payload, qos=1, retain=True)

    def _anchored(self, status: bytes) -> bytes:
        """A status with the anchor of our key chain, in a run with identities."""
        return status[:-1] + self._anchor if self._anchor else status

    async def send_status(self, payload: bytes) -> None:
        self.status = payload = self._anchored(payload)
        await self.transport.publish(self.status_topic, payload, qos=1, retain=True)

    def resend_to(self, j: int) -> None:
        """Neighbour j (re)started: our z^(0) to it and our last two x's (idempotent for all)."""
        for payloads in self.z0.values():
            if j in payloads:
                self.transport.publish_nowait(self._z0_topic(self.node, j), payloads[j], qos=1)
        for t in sorted(self.x):
            self.transport.publish_nowait(self.x_topic, self.x[t], qos=1)

    def republish_status(self) -> None:
        """Our status again (it replaces the ``offline`` will a lost connection left retained)."""
        if self.status is not None:
            self.transport.publish_nowait(self.status_topic, self.status, qos=1, retain=True)

    def republish(self) -> None:
        """Our connection lost its session: everything a neighbour or the eavesdropper may miss.

        Now (the neighbours are waiting for it) and again at :data:`RESEND_AFTER` (a subscriber
        that resubscribed after us heard nothing of the first time). Receivers drop copies.
        """
        self.cancel_resends()
        self._publish_all()
        loop = asyncio.get_running_loop()
        self._later = [loop.call_later(delay, self._resend) for delay in RESEND_AFTER]

    def _resend(self) -> None:
        try:
            self._publish_all()
        except NlaggError:  # the transport closed meanwhile (the run ended): nothing to do
            self.cancel_resends()

    def _publish_all(self) -> None:
        if self.key is not None:
            self.transport.publish_nowait(self.key_topic, self.key, qos=1, retain=True)
        if self.status is not None:
            self.transport.publish_nowait(self.status_topic, self.status, qos=1, retain=True)
        for payloads in self.z0.values():
            for j, payload in payloads.items():
                self.transport.publish_nowait(self._z0_topic(self.node, j), payload, qos=1)
        for topic, payload in self.history:
            self.transport.publish_nowait(topic, payload, qos=1)

    async def settle(self) -> None:
        """Wait until the resends after a lost session have gone out (at most the last of
        :data:`RESEND_AFTER`): a node that finished meanwhile and exited at once took them with it,
        and a subscriber that resubscribed after its first republish never got what it had lost."""
        if not self._later:
            return
        loop = asyncio.get_running_loop()
        last = max(handle.when() for handle in self._later)
        await asyncio.sleep(max(0.0, last - loop.time()) + 0.05)

    def cancel_resends(self) -> None:
        for handle in self._later:
            handle.cancel()
        self._later = []
