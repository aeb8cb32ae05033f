"""Forged x's and departure claims of one node, from a holder of its broker password only (issue 31).

The plan's nodes sign what they publish (statuses, z^(0), keys) and authenticate their x's with a
hash chain whose anchor their signed statuses announce (:mod:`nlagg_node.protocol.chain`). A holder of
node j's broker password, not of its signing key, may still publish on node j's topics; this module
builds what it sends there, and :class:`Forger` sends it (one burst, raw MQTT as
:class:`~tests.harness.hostile.Intruder`; its connection takes node j's session over, so node j is
off the broker while the burst goes out):

* x_j^(t) for a run of iterations about the run's current one (those the nodes are about to take,
  inside their window), each five ways (:data:`X_WAYS`): without a key-chain element, with a random
  one, with the element of node j's latest real x (a true element of its chain, for another t), with
  the element of a chain of the forger's own, and that one signed with an identity of its own;
  never the element of node j's real x^(t) on an x^(t) with another number: that copy reaches every
  node after the real x, a conflict that stops the run by design (docs/protocol.md, "Signed
  messages": a denial of service, as a session takeover is, not a wrong result);
* node j's statuses, retained (:func:`forged_statuses`): node j says a neighbour departed, says a
  node it has no edge with departed, leaves the run itself, each unsigned and signed with the
  forger's identity (whose chain anchor it carries), and departure maps with malformed keys.

Every x is of the run's form and phase (it passes :func:`~nlagg_node.protocol.x_form_error`), so
only the key chain refuses it; every departure claim is refused for its signature or its form.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from nlagg_node.protocol import Identity, new_identity
from nlagg_node.protocol.chain import KeyChain, key_b64
from nlagg_node.runtime.wire import NodeState, StatusMsg, encode, encode_x, topics
from tests.harness.hostile import Intruder
from tests.harness.mqtt_frames import publish_frame

__all__ = ["MALFORMED_KEYS", "X_WAYS", "Forger", "Forgery", "ahead_of_use", "forged_statuses", "forged_xs"]

X_WAYS = ("no k", "random k", "copied k", "own chain", "signed")
"""How each forged x_j^(t) authenticates itself (:func:`forged_xs`)."""

MALFORMED_KEYS = ("abc", "-1", "01", "1.0", "", "9" * 40)
"""Keys of a ``departed`` map that name no node (each in a status of its own)."""


@dataclass(frozen=True)
class Forgery:
    """What a forger sends as node j: its identity and key chain, and the payloads by topic."""

    node: int
    identity: Identity  # the forger's own, not node j's
    chain: KeyChain  # a chain of the forger's own, anchored in its forged statuses
    xs: list[tuple[int, bytes]]  # (t, payload) on node j's x topic
    statuses: list[bytes]  # retained, on node j's status topic, the last one stays retained


def forged_xs(
    node: int,
    ts: Sequence[int],
    phase_at: Callable[[int], str],
    value: float,
    copied: tuple[int, str] | None,
    random_k: Callable[[], bytes],
    own: tuple[Identity, KeyChain],
    topic: str,
) -> list[tuple[int, bytes]]:
    """x_node^(t) of value ``value`` on ``topic`` for every t of ``ts``, each of :data:`X_WAYS`
    (``copied``: ``(t_k, k)`` of node j's latest real x, used on every t but ``t_k``, None leaves that
    way out; ``own``: the forger's identity and key chain)."""
    out: list[tuple[int, bytes]] = []
    for t in ts:
        phase = phase_at(t)
        out.append((t, encode_x(node=node, t=t, phase=phase, x=value)))
        out.append((t, encode_x(node=node, t=t, phase=phase, x=value, k=key_b64(random_k()))))
        if copied is not None and copied[0] != t:
            out.append((t, encode_x(node=node, t=t, phase=phase, x=value, k=copied[1])))
        chained = encode_x(node=node, t=t, phase=phase, x=value, k=key_b64(own[1].key(t)))
        out += [(t, chained), (t, own[0].sign(topic, chained))]
    return out


def forged_statuses(
    node: int, neighbour: int, stranger: int | None, at: int, identity: Identity, anchor: str, topic: str
) -> list[bytes]:
    """Node ``node``'s statuses claiming departures: of ``neighbour`` and of ``stranger`` (a node it
    has no edge with; None: it has none) at iteration ``at``, and its own ``leaving`` at ``at``, each
    unsigned and signed by ``identity`` (carrying its chain ``anchor``); then one status per
    :data:`MALFORMED_KEYS`. The claim about ``neighbour``, signed, comes last (it stays retained)."""

    def status(state: NodeState, departed: dict[str, int] | None, iterations: int | None = None) -> bytes:
        return encode(StatusMsg(node=node, state=state, departed=departed, iterations=iterations))

    def signed(body: bytes) -> bytes:
        return identity.sign(topic, body[:-1] + b',"chain":"' + anchor.encode() + b'"}')

    claims = [status("leaving", None, at)]
    if stranger is not None:
        claims.append(status("running", {str(stranger): at}))
    out = [c for body in claims for c in (body, signed(body))]
    for key in MALFORMED_KEYS:
        body = b'{"v":1,"node":%d,"state":"running","departed":{"%s":%d}}' % (node, key.encode(), at)
        out += [body, signed(body)]
    about_neighbour = status("running", {str(neighbour): at})
    return [*out, about_neighbour, signed(about_neighbour)]


@dataclass
class Forger(Intruder):
    """Node ``node``'s broker password in the wrong hands, mid-run (:meth:`forge`)."""

    def latest_real_x(self) -> tuple[float, tuple[int, str] | None]:
        """``(x, (t, k))`` of node j's latest x the transcript holds as valid (``(0.0, None)``: none)."""
        sql = "SELECT t, value, payload FROM messages WHERE valid = 1 AND kind = 'x' AND node = ?"
        sql += " ORDER BY t DESC LIMIT 1"
        with closing(sqlite3.connect(f"file:{self.transcript}?mode=ro", uri=True)) as db:
            row = db.execute(sql, (self.node,)).fetchone()
        if row is None:
            return 0.0, None
        payload = bytes(row[2])
        start = payload.find(b'"k":"')
        return float(row[1]), None if start < 0 else (int(row[0]), payload[start + 5 : start + 29].decode())

    def build(
        self, span: range, neighbour: int, stranger: int | None, random_k: Callable[[], bytes]
    ) -> Forgery:
        """The burst: node j's x's for every t of ``span`` and its departure claims."""
        tp = topics(self.prefix, self.run_id)
        identity = new_identity()
        chain = KeyChain(identity.chain_seed("forger"), self.t_total)
        x, k = self.latest_real_x()
        ts = [t for t in span if 0 <= t < self.t_total]
        xs = forged_xs(self.node, ts, self.phase_at, x + 1.0, k, random_k, (identity, chain), tp.x(self.node))
        at = max(min(span.start, self.t_total - 1), 0)
        anchor = key_b64(chain.anchor)
        statuses = forged_statuses(self.node, neighbour, stranger, at, identity, anchor, tp.status(self.node))
        return Forgery(self.node, identity, chain, xs, statuses)

    async def forge(
        self, forgery: Forgery, chunk: int = 12, tries: int = 5, within: float = 2.0
    ) -> tuple[int, int]:
        """Send ``forgery``, its x's first, then its statuses (retained); return the sessions it took
        and how many forgeries the eavesdropper never captured (0: all reached the broker).

        Each connection takes node j's session over, and node j, back within 50 ms, closes it: what
        the broker had not read by then (Mosquitto reads one packet per wake-up) is lost. So the
        frames go ``chunk`` per connection, with the CONNECT (``eager``), one connection after the
        other, and what the eavesdropper has not captured ``within`` s later goes again, ``tries``
        rounds at most.
        """
        tp = topics(self.prefix, self.run_id)
        pending = [(tp.x(self.node), payload, False) for _, payload in forgery.xs]
        pending += [(tp.status(self.node), body, True) for body in forgery.statuses]
        sessions = 0
        for _ in range(tries):
            for start in range(0, len(pending), chunk):
                part = pending[start : start + chunk]
                frames = [publish_frame(topic, payload, retain=retain) for topic, payload, retain in part]
                await self._session(f"forger-{self.node}", frames, eager=True)
                sessions += 1
            pending = await self._uncaptured(pending, within)
            if not pending:
                break
        return sessions, len(pending)

    async def _uncaptured(
        self, sent: list[tuple[str, bytes, bool]], within: float
    ) -> list[tuple[str, bytes, bool]]:
        """What of ``sent`` the transcript has not captured after ``within`` s (or sooner: none)."""
        topics_ = sorted({topic for topic, _, _ in sent})
        sql = f"SELECT payload FROM messages WHERE topic IN ({','.join('?' * len(topics_))})"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            with closing(sqlite3.connect(f"file:{self.transcript}?mode=ro", uri=True)) as db:
                seen = {bytes(row[0]) for row in db.execute(sql, topics_)}
            missing = [m for m in sent if m[1] not in seen]
            if not missing or loop.time() > deadline:
                return missing
            await asyncio.sleep(0.2)


def ahead_of_use(db: Path, topic: str) -> list[int]:
    """The iterations t whose forged x (a refused row on ``topic``) the transcript captured before
    the real x^(t): the broker delivered the forgery first, to the nodes as to the eavesdropper, so
    the nodes had not taken x^(t) yet when it came."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT id, valid, t, payload FROM messages WHERE topic = ?", (topic,)).fetchall()
    real = {int(t): int(i) for i, valid, t, _ in rows if valid}
    forged: dict[int, int] = {}
    for i, valid, _, payload in rows:
        if not valid:
            t = int(json.loads(bytes(payload))["t"])
            forged[t] = min(forged.get(t, i), i)
    return sorted(t for t, i in forged.items() if i < real.get(t, -1))
