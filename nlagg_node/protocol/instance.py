"""The run instance: what makes every start of a plan a run of its own (issue 43, "fresh runs").

A plan's identities, prefix and run id stay the same when the plan is run again, so a message
signed for them alone (a status, a z^(0), an X25519 key, the anchor of an x key chain) would verify
in every later start of the run: a holder of one node's broker password could replay the node's
messages of an earlier start and pass them off as its own. So every signature of a plan's run also
covers a *run instance* (:func:`~nlagg_node.protocol.identity.signed_bytes`), and each node's x key
chain is derived from it:

* the operator's launcher draws a fresh instance (16 bytes of OS entropy, base64) each time it
  publishes the run's retained configuration (``nlagg deploy publish-config``), and signs that
  configuration with the plan's launcher key (``secrets/launcher.identity.pem``; its public key is
  ``[identities] launcher`` in run.toml, which every node holds);
* a node, before it connects for the run, reads the retained configuration and takes its instance
  only when the launcher's signature verifies and the configuration is its own
  (:func:`instance_error`); no node chooses the instance, so no node can choose an old one;
* every message it signs from then on, its last will included, binds the instance, and it checks
  every message it reads against the same instance: a message of another start is refused, named.

A launcher that is not run again re-uses the retained instance: a re-run is a new
``publish-config`` first (commands.txt lists it before the nodes). The lab testbed needs no
instance: its identities are new at every run.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .identity import signed_bytes, split_signed

__all__ = ["INSTANCE_BYTES", "instance_error", "new_instance"]

INSTANCE_BYTES = 16


def new_instance() -> str:
    """A fresh run instance from the OS's entropy (never from a run seed: it must not repeat)."""
    return base64.b64encode(os.urandom(INSTANCE_BYTES)).decode("ascii")


def instance_error(topic: str, payload: bytes, launcher: str, instance: str | None) -> str | None:
    """Why a retained run configuration (``payload`` on ``topic``, its ``instance`` field) does not
    establish this start's run instance for a node that trusts launcher key ``launcher`` (None: it
    does). The configuration's own content is compared by the caller
    (:func:`~nlagg_node.runtime.public.config_mismatch`)."""
    if instance is None:
        return f"the retained configuration on {topic} has no run instance: run nlagg deploy publish-config"
    parts = split_signed(payload)
    if parts is None:
        return f"the retained configuration on {topic} is not signed by the plan's launcher key"
    body, sig = parts
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(launcher, validate=True))
        key.verify(sig, signed_bytes(topic, body, None))
    except (binascii.Error, ValueError):
        return f"identities.launcher={launcher!r}: not the base64 of an Ed25519 public key"
    except InvalidSignature:
        return f"the retained configuration on {topic} does not verify with the plan's launcher key; refused"
    return None
