"""Sealed initialization (wire protocol v2): z^(0) encrypted per directed edge.

Each node draws an ephemeral X25519 key pair per run (OS entropy, never the run seed) and
publishes its public key, retained, on ``P/R/node/{i}/key``. The key of the directed edge
``i -> j`` is HKDF-SHA256 over the X25519 shared secret of i and j, with the info string
``nlagg-z0-v2|{prefix}|{run_id}|{i}->{j}``: bound to the run, the topic root and the ordered edge,
so a ciphertext replayed from another run, another edge or the opposite direction does not
authenticate. ``z_{i|j}^(0)`` travels as the ChaCha20-Poly1305 ciphertext of its 8 IEEE-754 bytes
(little-endian, so the number is exact) under a fresh random 96-bit nonce, with the topic and the
dual group as associated data. Everything here is the ``cryptography`` package's primitives; this
module only decides what is bound to what.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import struct
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import ConfigError, SealError, WireError
from ..private import write_private

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "SEALED_BYTES",
    "EdgeCipher",
    "KeyRing",
    "SealError",
    "b64decode_exact",
    "load_or_create_key",
    "new_key",
    "public_bytes",
    "shared_secret",
]

KEY_BYTES = 32
NONCE_BYTES = 12
SEALED_BYTES = 8 + 16  # one float64 and the Poly1305 tag


def b64decode_exact(text: str, size: int, field: str) -> bytes:
    """Standard base64 of exactly ``size`` bytes, else :class:`WireError` naming ``field``."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise WireError(field, text[:60], "not standard base64") from None
    if len(raw) != size:
        raise WireError(field, text[:60], f"must encode {size} bytes, not {len(raw)}")
    return raw


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def new_key() -> X25519PrivateKey:
    """A fresh ephemeral key pair from the OS's entropy."""
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def load_or_create_key(path: Path) -> X25519PrivateKey:
    """The run's private key kept next to a node's checkpoint (mode 0600), so a resumed node keeps it."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        key = new_key()
        raw = key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        write_private(path, raw)
        return key
    if len(raw) != KEY_BYTES:
        raise ConfigError("state_dir", str(path), f"not an X25519 private key ({len(raw)} bytes)")
    return X25519PrivateKey.from_private_bytes(raw)


def shared_secret(own: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The X25519 shared secret with ``peer_public`` (both directions of an edge derive from it)."""
    try:
        return own.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # an all-zero shared secret (a low-order public key)
        raise WireError("key", b64(peer_public), f"unusable X25519 public key ({exc})") from None


class EdgeCipher:
    """The AEAD of one directed edge ``sender -> receiver`` of one run.

    Parameters
    ----------
    shared : the X25519 shared secret of the edge's two ends (:func:`shared_secret`).
    prefix, run_id : the run's topic root, bound into the key.
    sender, receiver : the ordered edge.
    """

    def __init__(self, shared: bytes, *, prefix: str, run_id: str, sender: int, receiver: int) -> None:
        info = f"nlagg-z0-v2|{prefix}|{run_id}|{sender}->{receiver}".encode()
        secret = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
        self._aead = ChaCha20Poly1305(secret)
        self.edge = (sender, receiver)

    @staticmethod
    def _aad(topic: str, group: str) -> bytes:
        return f"{topic}|{group}".encode()

    def seal(self, z: float, topic: str, group: str) -> tuple[str, str]:
        """``(nonce, ciphertext)`` in base64 for ``z_{sender|receiver}^(0) = z``; a fresh OS nonce."""
        nonce = os.urandom(NONCE_BYTES)
        ct = self._aead.encrypt(nonce, struct.pack("<d", z), self._aad(topic, group))
        return b64(nonce), b64(ct)

    def open(self, nonce: str, ct: str, topic: str, group: str) -> float:
        """The z^(0) inside, or :class:`SealError` when it does not authenticate."""
        n = b64decode_exact(nonce, NONCE_BYTES, "nonce")
        c = b64decode_exact(ct, SEALED_BYTES, "ct")
        try:
            plain = self._aead.decrypt(n, c, self._aad(topic, group))
        except InvalidTag:
            s, r = self.edge
            raise SealError(
                "ct",
                f"z0 {s}->{r} ({group})",
                "does not authenticate (wrong key, tampered, or replayed from another run, edge or group)",
            ) from None
        (z,) = struct.unpack("<d", plain)
        return float(z)


class KeyRing:
    """A node's own key and its neighbours' public keys of one run, with the edge ciphers.

    The first public key heard from a neighbour is the one used; a different one later (a key
    that changes mid-run) is refused.
    """

    def __init__(
        self, node: int, neighbours: list[int], key: X25519PrivateKey, *, prefix: str, run_id: str
    ) -> None:
        self.node = node
        self.neighbours = neighbours
        self._key = key
        self.public = b64(public_bytes(key))
        self._where = {"prefix": prefix, "run_id": run_id}
        self.peers: dict[int, str] = {}
        self._out: dict[int, EdgeCipher] = {}  # node -> j
        self._in: dict[int, EdgeCipher] = {}  # j -> node
        self.complete = asyncio.Event()

    def add(self, j: int, key: str) -> bool:
        """Neighbour j's public key; True if new, False for a copy. Raises WireError if refused."""
        known = self.peers.get(j)
        if known is not None:
            if known != key:
                raise WireError("key", key, f"node {j}'s key changed mid-run; the first one is kept")
            return False
        shared = shared_secret(self._key, b64decode_exact(key, KEY_BYTES, "key"))
        self._out[j] = EdgeCipher(shared, sender=self.node, receiver=j, **self._where)
        self._in[j] = EdgeCipher(shared, sender=j, receiver=self.node, **self._where)
        self.peers[j] = key
        if all(k in self.peers for k in self.neighbours):
            self.complete.set()
        return True

    def missing(self) -> list[int]:
        return [j for j in self.neighbours if j not in self.peers]

    def seal(self, j: int, z: float, topic: str, group: str) -> tuple[str, str]:
        return self._out[j].seal(z, topic, group)

    def open(self, j: int, nonce: str, ct: str, topic: str, group: str) -> float:
        return self._in[j].open(nonce, ct, topic, group)
