"""The x's of a signed run: one hash chain per node, its anchor signed once, one element per x.

A signature per x costs every receiver an Ed25519 verification per neighbour and round (60-70 us of
CPU each, about as much as the rest of a node's round: ``benchmarks/bench_auth.py``). So in a run
with identities (:mod:`nlagg_node.protocol.identity`) node j authenticates its x's with a hash chain
instead: it derives ``K^(T-1)`` from its identity and the run, and ``K^(t-1) = H(K^(t))`` down to
the anchor ``K^(-1)``, which it announces in its signed statuses (``"chain"``). Its x^(t) carries
``K^(t)`` (``"k"``); a receiver checks ``H(K^(t)) == K^(t-1)``, the element of the x before (or
hashes several times across iterations it did not see): one hash per x.

``K^(t)`` is unknown to anyone but node j until x_j^(t) is published, so an x that carries it and
comes first is node j's. Each x is also signed (issue 43: two conflicting x's must be a proof), but
a receiver verifies that signature only when a second x for the same slot comes: a copy made from
the published element (another value, the same key) fails it and is refused as a forgery, and two
x's that both verify prove that node j equivocated (:mod:`nlagg_node.protocol.equivocation`).

The chain is a pure function of the node's identity, the prefix, the run id and its length, so a
node that restarts from its checkpoint publishes the same x's, byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

__all__ = ["CHAIN_STRIDE", "ChainCheck", "KeyChain", "chain_check", "chain_hash", "key_b64", "x_key_error"]

_KEY_BYTES = 16
CHAIN_STRIDE = 256  # elements kept per 256 (a segment is recomputed from its top when used)
_FAR = 4096  # elements a receiver hashes at most for one x (more: phase starts, see ChainCheck)


def chain_hash(key: bytes) -> bytes:
    """``H``: BLAKE2b-128, personalised for nlagg's chains."""
    return hashlib.blake2b(key, digest_size=_KEY_BYTES, person=b"nlagg-x-chain").digest()


def key_b64(key: bytes) -> str:
    return base64.b64encode(key).decode("ascii")


class KeyChain:
    """Node j's chain for a run of ``length`` iterations: ``key(t)`` for ``t = -1 .. length-1``.

    ``seed`` is secret (:meth:`~nlagg_node.protocol.identity.Identity.chain_seed`). Building it
    costs ``length`` hashes once; a key costs nothing more when taken in order.
    """

    def __init__(self, seed: bytes, length: int) -> None:
        self.length = length
        key = chain_hash(seed)  # K^(length-1), at u = length (u = t + 1)
        self._marks: dict[int, bytes] = {length: key}
        for u in range(length - 1, -1, -1):
            key = chain_hash(key)
            if u % CHAIN_STRIDE == 0:
                self._marks[u] = key
        self.anchor = key  # K^(-1)
        self._segment: tuple[int, list[bytes]] = (-1, [])

    def key(self, t: int) -> bytes:
        """``K^(t)`` (``-1 <= t < length``)."""
        u = t + 1
        base = (u // CHAIN_STRIDE) * CHAIN_STRIDE
        start, keys = self._segment
        if start != base:
            top = min(base + CHAIN_STRIDE, self.length)
            key = self._marks[top]
            keys = [key]
            for _ in range(top - base):
                key = chain_hash(key)
                keys.append(key)
            keys.reverse()  # keys[v] = K at u = base + v
            self._segment = (base, keys)
        return keys[u - base]


class ChainCheck:
    """A receiver's check of one sender's chain, from its signed anchor on.

    ``check(t, k)`` passes when hashing ``k`` ``t - t0`` times gives the element of the latest
    x it passed (``t0``; the anchor at first), or when ``k`` is the element it passed for ``t``
    already (a resend). It hashes at most 4096 times, or as far as ``far`` for the iterations in
    ``far`` (phase starts a run that stops early jumps to); a key it cannot reach is refused.
    """

    def __init__(self, anchor: bytes, far: dict[int, int] | None = None) -> None:
        self.t0, self.k0 = -1, anchor
        self.far = far or {}
        self.passed: dict[int, bytes] = {}  # the recent elements passed, by iteration

    def check(self, t: int, k: str | None) -> str | None:
        """Why ``k`` (base64) is not the sender's ``K^(t)`` (None: it is)."""
        if k is None:
            return "no key-chain element (k): this run's x's carry one"
        try:
            key = base64.b64decode(k, validate=True)
        except (binascii.Error, ValueError):
            return "k is not base64"
        if t <= self.t0:  # an x before the latest one: K^(t) is H^(t0 - t)(K^(t0))
            held = self.passed.get(t)
            if held is not None:
                return None if held == key else "k is not the element this node already passed for t"
            return self._reaches(self.k0, self.t0 - t, key, "behind")
        why = self._reaches(key, t - self.t0, self.k0, "ahead", self.far.get(t, _FAR))
        if why is None:
            self.t0, self.k0 = t, key
            self.passed[t] = key
            self.passed.pop(t - _FAR, None)
        return why

    def follow(self, t: int, k: str) -> None:
        """Take ``k`` as the element of ``t`` without hashing (one this receiver passed before)."""
        if t > self.t0:
            self.t0, self.k0 = t, base64.b64decode(k)

    @staticmethod
    def _reaches(start: bytes, steps: int, target: bytes, where: str, limit: int = _FAR) -> str | None:
        """Whether ``start`` hashed ``steps`` times is ``target``."""
        if steps > limit:
            return f"k cannot be checked: {steps} iterations {where} of the last one authenticated"
        for _ in range(steps):
            start = chain_hash(start)
        return None if start == target else "k is not on the sender's key chain"


def chain_check(anchor: str, far: dict[int, int]) -> ChainCheck:
    """The check of a chain from its anchor as a signed status carries it (base64, validated)."""
    return ChainCheck(base64.b64decode(anchor), far)


def x_key_error(
    authenticated: bool, check: ChainCheck | None, sender: int, t: int, k: str | None, sig: str | None
) -> str | None:
    """Why x_sender^(t) with key-chain element ``k`` (and signature ``sig``) is refused (None: it passes).

    ``authenticated``: the run has identities; ``check``: the sender's chain as far as this receiver
    has followed it (None: no signed anchor of the sender yet). The nodes and the transcript both
    decide with this function. The x's signature must be there but is not verified here (one hash,
    not one Ed25519 verification, per x): it is verified when a second x for the slot comes
    (:func:`~nlagg_node.protocol.equivocation.x_conflict_error`).
    """
    if not authenticated:
        if k is None and sig is None:
            return None
        return (
            f"x_{sender}^({t}) carries {'k' if k is not None else 'sig'} in a run without identities; refused"
        )
    if sig is None:
        return f"x_{sender}^({t}) is unsigned: this run's x's are signed; refused"
    if check is None:
        return f"x_{sender}^({t}) before a signed status of node {sender} announced its key chain; refused"
    why = check.check(t, k)
    return None if why is None else f"x_{sender}^({t}): {why}; refused"
