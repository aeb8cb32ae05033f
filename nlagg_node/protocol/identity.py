"""Signed messages: every node's long-term Ed25519 identity, and the one check of a signature.

A run with identities (``nlagg deploy plan``: one key pair per node, the public keys in the public
run configuration) has every node sign what it publishes: x, z^(0) (plaintext and sealed), its
X25519 key, its statuses (its last will included) and a corrupted node's state. The signature is the
last field of the JSON object::

    {"v":1,"node":3,"t":7,"phase":"max","x":0.5,"sig":"<base64 of 64 bytes>"}

and signs the topic, the run instance and the message without it:
``topic + b"\\0" + instance + b"\\0" + body``, where ``body`` is the payload with its last
``,"sig":"..."`` removed (the exact bytes of the unsigned message, so a run without identities is
byte for byte what it was). The topic binds the prefix, the run id and the sender; the instance
(:mod:`nlagg_node.protocol.instance`: a nonce the operator's launcher signs at every start of a
plan) binds this start of the run, so a message replayed from another run, another topic or an
earlier start of the same run id does not verify. A run without an instance (the lab testbed,
whose identities are new at every run) signs ``topic + b"\\0" + body``.

Ed25519 signatures are publicly verifiable: the nodes and the eavesdropper apply the same check
(:func:`signature_error`), so a broker password alone forges nothing a node would use or the
transcript would count, and two different messages for one slot signed by the same node are proof
that node equivocated (:mod:`nlagg_node.protocol.equivocation`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

__all__ = [
    "SIG_FIELD",
    "SIG_SUFFIX_BYTES",
    "Identity",
    "Verifier",
    "new_identity",
    "public_b64",
    "sign_payload",
    "signature_error",
    "signed_bytes",
    "split_signed",
]

SIG_FIELD = b',"sig":"'
_SIG_B64 = 88  # base64 of a 64-byte Ed25519 signature
SIG_SUFFIX_BYTES = len(SIG_FIELD) + _SIG_B64 + 2  # ,"sig":"<88>"}


class Identity:
    """A node's signing key (private: it lives in the node's bundle, mode 0600)."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.public = public_b64(key.public_key())

    @classmethod
    def from_pem(cls, pem: bytes) -> Identity:
        """The identity of a PKCS#8 PEM private key (what :func:`new_identity` writes)."""
        key = load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("not an Ed25519 private key")
        return cls(key)

    def pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM."""
        return self.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())

    def chain_seed(self, context: str) -> bytes:
        """A secret of this identity for ``context`` (the seed of a run's key chain,
        :mod:`nlagg_node.protocol.chain`): the same identity and context give the same seed."""
        raw = self.key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return hashlib.blake2b(context.encode(), key=raw, digest_size=32, person=b"nlagg-chainseed").digest()

    def sign(self, topic: str, payload: bytes, instance: str | None = None) -> bytes:
        """``payload`` (an unsigned JSON object) with its signature for ``topic`` (and the run
        ``instance``, None: a run without one) appended."""
        return sign_payload(self.key, topic, payload, instance)


def new_identity() -> Identity:
    """A fresh identity from the OS's entropy (never from a run seed)."""
    return Identity(Ed25519PrivateKey.generate())


def public_b64(key: Ed25519PublicKey) -> str:
    """The standard base64 of a public key's 32 raw bytes (how the public config lists it)."""
    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def signed_bytes(topic: str, body: bytes, instance: str | None) -> bytes:
    """What a signature covers: the topic, the run instance (when the run has one) and the body."""
    if instance is None:
        return topic.encode() + b"\0" + body
    return topic.encode() + b"\0" + instance.encode() + b"\0" + body


def sign_payload(key: Ed25519PrivateKey, topic: str, payload: bytes, instance: str | None = None) -> bytes:
    """``payload`` with ``,"sig":"<base64>"`` inserted before its closing brace."""
    sig = key.sign(signed_bytes(topic, payload, instance))
    return payload[:-1] + SIG_FIELD + base64.b64encode(sig) + b'"}'


def split_signed(payload: bytes) -> tuple[bytes, bytes] | None:
    """``(body, signature)`` of a signed payload, or None when its last field is not a signature."""
    if len(payload) <= SIG_SUFFIX_BYTES or not payload.endswith(b'"}'):
        return None
    cut = len(payload) - SIG_SUFFIX_BYTES
    if payload[cut : cut + len(SIG_FIELD)] != SIG_FIELD:
        return None
    try:
        sig = base64.b64decode(payload[cut + len(SIG_FIELD) : -2], validate=True)
    except (binascii.Error, ValueError):
        return None
    return payload[:cut] + b"}", sig


class Verifier:
    """The public keys of a run's nodes (base64, index = node id), ready to check signatures made
    for the run ``instance`` (None: a run without one)."""

    def __init__(self, identities: Sequence[str], instance: str | None = None) -> None:
        self.instance = instance
        keys = []
        for i, text in enumerate(identities):
            try:
                raw = base64.b64decode(text, validate=True)
                keys.append(Ed25519PublicKey.from_public_bytes(raw))
            except (binascii.Error, ValueError) as exc:
                why = f"identities[{i}]: not the base64 of an Ed25519 public key ({exc})"
                raise ValueError(why) from None
        self.keys = keys

    def check(self, topic: str, node: int, payload: bytes) -> str | None:
        """Why ``payload`` on ``topic`` is not signed by node ``node`` (None: it is)."""
        if node >= len(self.keys):
            return f"node {node} has no identity in the run's configuration"
        parts = split_signed(payload)
        if parts is None:
            return f"unsigned message on {topic}: this run's nodes sign everything they publish"
        body, sig = parts
        try:
            self.keys[node].verify(sig, signed_bytes(topic, body, self.instance))
        except InvalidSignature:
            if self.instance is None:
                return f"signature on {topic} does not verify with node {node}'s identity; refused"
            return (
                f"signature on {topic} does not verify with node {node}'s identity for run instance "
                f"{self.instance} (forged, or replayed from another start of the run); refused"
            )
        return None


def signature_error(
    verifier: Verifier | None, topic: str, node: int | None, payload: bytes, signed: bool
) -> str | None:
    """Why a decoded message must be refused for its signature (None: it passes).

    ``node`` is the sender the topic names (None: the run configuration, which no node signs and
    whose model has no ``sig``);
    ``signed`` whether the message has a ``sig`` field. In a run with identities every node's
    message must carry a signature by that node's identity; in a run without, none may carry one.
    """
    if node is None:
        return None
    if verifier is None:
        return None if not signed else f"signed message on {topic} in a run without identities; refused"
    return verifier.check(topic, node, payload)
