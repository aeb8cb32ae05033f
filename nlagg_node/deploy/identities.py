"""The nodes' signing identities in a plan: generated once, the private keys in the nodes' bundles,
the public keys in the public run.toml (``[identities] ed25519 = [...]``, index = node id), and the
operator's launcher key, which signs each start's run instance (``[identities] launcher``,
:mod:`nlagg_node.protocol.instance`).

A run.toml with that table is a run whose nodes sign every message and check every signature
(:mod:`nlagg_node.protocol.identity`); the launcher publishes the keys in the retained run
configuration, which is where the eavesdropper reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..inputs import parse_document, read_input_text
from ..protocol.identity import Identity, Verifier

__all__ = ["identity_file", "load_identity", "run_identities", "run_launcher"]


def identity_file(user: str) -> str:
    """Where a plan keeps a node user's private signing key (relative to the plan, mode 0600)."""
    return f"secrets/{user}.identity.pem"


def run_identities(config: Path) -> list[str] | None:
    """The ``[identities]`` public keys of a run.toml (or the ``identities`` object of a JSON run
    configuration, as the lab testbed writes it); None: a run without identities."""
    suffix = config.suffix.lower()
    if suffix not in (".toml", ".json"):
        return None
    kind: Literal["TOML", "JSON"] = "JSON" if suffix == ".json" else "TOML"
    doc = parse_document(read_input_text(config, "config"), kind, "config", config)
    table = doc.get("identities") if isinstance(doc, dict) else None
    if table is None:
        return None
    keys = table.get("ed25519") if isinstance(table, dict) else None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError("identities.ed25519", keys, f"must be a list of base64 public keys (in {config})")
    try:
        Verifier(keys)
    except ValueError as exc:
        raise ConfigError("identities.ed25519", len(keys), f"{exc} (in {config})") from None
    return list(keys)


def load_identity(path: Path) -> Identity:
    """A node's signing key from its PEM file (refused, naming the file, when it is not one)."""
    try:
        return Identity.from_pem(read_input_text(path, "signing_key").encode("ascii"))
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise ConfigError("signing_key", str(path), f"not an Ed25519 private key in PEM ({exc})") from None


def run_launcher(config: Path) -> str | None:
    """The ``[identities] launcher`` public key of a run.toml (None: the run has no run instance)."""
    if config.suffix.lower() != ".toml":
        return None
    doc = parse_document(read_input_text(config, "config"), "TOML", "config", config)
    table = doc.get("identities") if isinstance(doc, dict) else None
    key = table.get("launcher") if isinstance(table, dict) else None
    if key is None:
        return None
    try:
        if not isinstance(key, str):
            raise ValueError("not a string")
        Verifier([key])
    except ValueError as exc:
        raise ConfigError(
            "identities.launcher", key, f"not an Ed25519 public key ({exc}) (in {config})"
        ) from None
    return key
