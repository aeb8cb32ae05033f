"""``nlagg deploy bundle``: the few files one device needs, as a tarball to copy to it.

A node needs the public ``run.toml`` and ``graph.json``, its own ``nodes/<i>.toml`` and its own
password file, nothing else: no other node's value source or credentials, no plan.toml.
Modes are kept (0600 for the private files), owners are reset to root (the installer chowns).
The tarball itself holds a password and maybe a private value: it is created 0600.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from ..errors import ConfigError
from ..private import write_private
from .nodefile import resolve_node

__all__ = ["bundle_members", "write_bundle"]


def bundle_members(plan_root: Path, node_id: int) -> list[str]:
    """Paths (relative to the plan) that go into node ``node_id``'s bundle."""
    node_file = plan_root / "nodes" / f"{node_id}.toml"
    if not node_file.is_file():
        raise ConfigError("node", node_id, f"no {node_file} (ids come from the plan)")
    node, base = resolve_node(node_file)
    if base != plan_root.resolve():
        raise ConfigError("base_dir", node.base_dir, f"{node_file} does not point at the plan root")
    members = [node.config, "graph.json", f"nodes/{node_id}.toml", node.password_file]
    members += [p for p in (node.ca_file, node.cert_file, node.key_file, node.signing_key) if p is not None]
    if node.value.source == "file" and not Path(str(node.value.path)).is_absolute():
        members.append(str(node.value.path))
    return members


def write_bundle(plan_root: Path, node_id: int, out: Path) -> list[str]:
    """Write ``out`` (.tar.gz) with node ``node_id``'s files; return the member names."""
    members = bundle_members(plan_root, node_id)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for rel in members:
            src = plan_root / rel
            data = src.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = src.stat().st_mode & 0o777
            info.mtime = int(src.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    try:
        write_private(out, raw.getvalue())
    except OSError as exc:
        raise ConfigError("out", str(out), f"cannot write it ({exc.strerror or exc})") from None
    return members
