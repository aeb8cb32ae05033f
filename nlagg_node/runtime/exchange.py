"""A node's z^(0) exchanges: one per dual group, in plaintext (protocol v1) or sealed per edge (v2).

Every exchange publishes z_{i|j}^(0) to each neighbour j and waits for every z_{j|i}^(0) (a
barrier keyed by the exchange's index, :attr:`RunShape.exchanges`). A sealed group first needs
every neighbour's public key of the run (an ephemeral X25519 key, kept with the checkpoint so a
resumed node keeps its key); a sealed z^(0) that comes before its sender's key waits for it. What
a node accepts is the protocol's rule (:func:`nlagg_node.protocol.z0_error`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..errors import NeighbourTimeoutError
from ..protocol import RunShape, key_error, z0_error
from ..protocol.equivocation import equivocation_error
from .barrier import Barrier
from .checkpoint import CheckpointStore
from .intake import Tally
from .peers import Outbox
from .seal import KeyRing, load_or_create_key, new_key
from .wire import KeyMsg, SealedZ0Msg, WireError, Z0Msg, encode, topics

__all__ = ["Z0Exchange"]


class Z0Exchange:
    """The z^(0) exchanges of node ``node`` with its ascending ``neighbours``.

    Parameters
    ----------
    shape : the run's shape (its exchanges and sealed groups).
    node, neighbours : this node and its neighbours, ascending.
    outbox : where its z^(0) and key go.
    names : the run's topic names.
    tally : where refusals and duplicates are counted.
    timeout : seconds to wait for the keys and for each exchange (the startup timeout).
    checkpoint : where a sealed run keeps its key (None: a fresh one).
    active : the neighbours still here (the plaintext z^(0) go to them only), read when sending.
    run : ``(prefix, run_id)``, bound into the sealed messages.
    signed : the run's messages are signed (a conflict is then proof of equivocation).
    """

    def __init__(
        self,
        shape: RunShape,
        node: int,
        neighbours: list[int],
        outbox: Outbox,
        names: topics,
        tally: Tally,
        *,
        timeout: float,
        checkpoint: CheckpointStore | None,
        active: Callable[[], list[int]],
        run: tuple[str, str],
        signed: bool = False,
    ) -> None:
        self.shape = shape
        self.signed = signed
        self.node = node
        self.neighbours = neighbours
        self.slot = {j: k for k, j in enumerate(neighbours)}
        self.outbox = outbox
        self.topics = names
        self.tally = tally
        self.timeout = timeout
        self.active = active
        exchanges = shape.exchanges
        self.barrier = Barrier(
            node, neighbours, "z0 ({})", timeout=timeout, end=len(exchanges), window=len(exchanges), keep=None
        )
        self.barrier.labels = exchanges
        self.keys: KeyRing | None = None
        self._early: dict[int, list[SealedZ0Msg]] = {}
        self.resend_plain: dict[str, list[float]] = {}  # restored sealed groups, sealed once keys come
        if shape.sealed:
            key = new_key() if checkpoint is None else load_or_create_key(checkpoint.path.with_suffix(".key"))
            self.keys = KeyRing(node, neighbours, key, prefix=run[0], run_id=run[1])

    def restore(self, next_exchange: int, sent: dict[str, list[float]]) -> None:
        """Resumed: the next exchange to take, and the z^(0) sent so far (sent again on request)."""
        self.barrier.resume(next_exchange)
        for g, zs in sent.items():
            if g in self.shape.sealed:
                self.resend_plain[g] = zs
            else:
                self.outbox.keep_z0(g, self.payloads(g, zs))

    def _slot(self, msg: Z0Msg | SealedZ0Msg) -> tuple[int, int] | None:
        """``(neighbour slot, exchange)`` of a z^(0) addressed to this node; None (rejected) otherwise."""
        j = msg.from_
        why = z0_error(self.shape, j, msg.to, msg.group, isinstance(msg, SealedZ0Msg))
        if why is None and msg.to != self.node:
            why = f"z0 from node {j} to node {msg.to}: not addressed to node {self.node}"
        if why is not None:
            if "protocol v" in why:
                why += f" (init_channel={self.shape.cfg.init_channel}); refused"
            self.tally.reject(why)
            return None
        return self.slot[j], self.shape.exchange_of[msg.group]

    def _put(self, j: int, slot: int, key: int, group: str, z: float) -> None:
        outcome = self.barrier.put(key, slot, z)
        if outcome in ("dup", "stale"):  # stale: an exchange already done (a resent copy)
            self.tally.duplicates += 1
        elif outcome == "conflict":
            raise equivocation_error(j, f"z0 {j}->{self.node} ({group})", self.signed)

    def on_z0(self, msg: Z0Msg) -> None:
        where = self._slot(msg)
        if where is not None:
            self._put(msg.from_, *where, msg.group, msg.z)

    def on_sealed_z0(self, msg: SealedZ0Msg) -> None:
        """A sealed z^(0) (v2): opened with the edge's key, or kept until the sender's key comes."""
        where = self._slot(msg)
        if where is None or self.keys is None:
            return
        j = msg.from_
        if j not in self.keys.peers:
            early = self._early.setdefault(j, [])
            if len(early) >= 2 * len(self.shape.exchanges):
                self.tally.reject(f"sealed z0 from node {j} before its key, more than the run needs; dropped")
            else:
                early.append(msg)
            return
        try:
            z = self.keys.open(j, msg.nonce, msg.ct, self.topics.z0(j, self.node), msg.group)
        except WireError as exc:
            self.tally.reject(str(exc))
            return
        self._put(j, *where, msg.group, z)

    def on_key(self, msg: KeyMsg) -> None:
        """Neighbour j's public key of the run: open what waited for it, seal what we may resend to it."""
        j = msg.node
        why = key_error(self.shape, j)
        if why is None and j not in self.slot:
            why = f"key of node {j}: not a neighbour of node {self.node}"
        if why is not None or self.keys is None:
            self.tally.reject(str(why))
            return
        try:
            new = self.keys.add(j, msg.key)
        except WireError as exc:
            self.tally.reject(str(exc))
            return
        if not new:
            self.tally.duplicates += 1
            return
        for early in self._early.pop(j, []):
            self.on_sealed_z0(early)
        for g, zs in self.resend_plain.items():
            self.outbox.z0.setdefault(g, {})[j] = self.sealed_payload(g, j, zs[self.slot[j]])

    def payloads(self, group: str, z_out: list[float]) -> dict[int, bytes]:
        """The z0 messages of ``group``: plaintext (v1), or sealed per edge (v2, every key known)."""
        if group in self.shape.sealed:
            return {j: self.sealed_payload(group, j, z) for j, z in zip(self.neighbours, z_out, strict=True)}
        return {
            j: encode(Z0Msg.model_validate({"from": self.node, "to": j, "group": group, "z": z}))
            for j, z in zip(self.active(), z_out, strict=True)
        }

    def sealed_payload(self, group: str, j: int, z: float) -> bytes:
        assert self.keys is not None
        nonce, ct = self.keys.seal(j, z, self.topics.z0(self.node, j), group)
        return encode(
            SealedZ0Msg.model_validate({"from": self.node, "to": j, "group": group, "nonce": nonce, "ct": ct})
        )

    def announce_key(self) -> None:
        """Publish our public key of the run (sealed runs only)."""
        if self.keys is not None:
            self.outbox.send_key(encode(KeyMsg(node=self.node, key=self.keys.public, run=self.topics.named)))

    async def exchange(self, group: str, z_out: list[float]) -> list[float]:
        """Publish z_{i|j}^(0) (awaiting the broker) and wait for every z_{j|i}^(0) of ``group``.

        A sealed group first waits for every neighbour's public key (``timeout``).
        """
        if group in self.shape.sealed and self.keys is not None and not self.keys.complete.is_set():
            try:
                async with asyncio.timeout(self.timeout):
                    await self.keys.complete.wait()
            except TimeoutError:
                missing, within = self.keys.missing(), self.timeout
                raise NeighbourTimeoutError(
                    f"node {self.node}: no public key from neighbour(s) {missing} within {within:g} s"
                ) from None
        await self.outbox.send_z0(group, self.payloads(group, z_out))
        return await self.barrier.take(self.shape.exchange_of[group])
