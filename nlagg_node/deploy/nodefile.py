"""A node's private deployment file (``nodes/<i>.toml``) and the ``nlagg node`` command it stands for.

Relative paths in a node file are resolved against its ``base_dir`` (itself relative to the
node file; ``..`` in a plan, where node files live in ``nodes/``). The password never
appears on a command line: only the path of the file holding it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..argv import NLAGG
from ..errors import ConfigError
from ..options import NodeOptions, option_fields, to_argv
from ..valuesource import ValueSource, stored_value

__all__ = [
    "NodeFile",
    "ValueSource",
    "load_node_file",
    "node_file_argv",
    "node_file_options",
    "node_file_text",
]


class NodeFile(BaseModel):
    """Contents of ``nodes/<i>.toml``: everything one device needs besides the public run.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=0)
    run_id: str
    base_dir: str = ".."
    config: str = "run.toml"
    broker: str
    username: str
    password_file: str
    corrupt: bool = False
    seed: int | None = Field(None, ge=0)
    state_dir: str = "state"  # checkpoints: a restart with the same command resumes the run
    ca_file: str | None = None  # mqtts://: the CA that verifies the broker
    cert_file: str | None = None  # client certificate and key, when the broker requires one
    key_file: str | None = None
    signing_key: str | None = None  # the node's Ed25519 identity (a plan with identities)
    value: ValueSource
    every: float | None = Field(None, gt=0)  # a continuous deployment (nlagg_node.runtime.epochdriver)
    epochs: int | None = Field(None, ge=1)
    origin: float | None = None
    drift: float | None = Field(None, ge=0)  # warm starts' declared drift (nlagg_node.runtime.warmstart)
    cold_start: bool = False


def node_file_text(node: NodeFile) -> str:
    """TOML text of a node file, with a comment saying it is private."""
    doc = node.model_dump(exclude_none=True)
    head = (
        f"# Node {node.id} of run {node.run_id}: PRIVATE (its value source and credentials).\n"
        "# Keep it on the device. Relative paths are resolved against base_dir, which is\n"
        "# relative to this file. Start the node with: nlagg deploy node <this file>\n"
    )
    if node.seed is not None:
        head += "# seed: lab replay mode (z^(0) derived from the run seed, as in the simulator).\n"
    return head + tomli_w.dumps(doc)


def load_node_file(path: Path) -> NodeFile:
    """Read and validate a node file; errors name the field and the value."""
    from ..inputs import parse_document, read_input_text

    doc = parse_document(read_input_text(path, "node_file"), "TOML", "node_file", path)
    try:
        return NodeFile.model_validate(doc)
    except ValidationError as exc:
        from ..config import pydantic_reason

        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "node_file"
        raise ConfigError(loc, err.get("input"), f"{pydantic_reason(err)} (in {path})") from None


def node_file_options(
    node: NodeFile, *, broker: str | None = None, state_dir: str | None = None
) -> NodeOptions:
    """The ``nlagg node`` options of a node file, paths relative to its ``base_dir``.

    ``state_dir`` overrides the file's (the systemd unit gives its writable ``StateDirectory=``).
    """
    # A node file holds the node's options under their own names, and its value source as [value].
    shared = node.model_dump(include=set(option_fields(NodeOptions)) - {"run_id", "value"})
    src = node.value
    return NodeOptions(
        **{
            **shared,
            "broker": broker or node.broker,
            "state_dir": state_dir or node.state_dir,
            "value": src.value,
            "value_file": src.path,
            "value_cmd": src.command,
        }
    )


def node_file_argv(
    node: NodeFile, *, broker: str | None = None, program: Sequence[str] = NLAGG, state_dir: str | None = None
) -> list[str]:
    """The ``nlagg node`` argument vector of a node file (see :func:`node_file_options`)."""
    return [*program, "node", *to_argv(node_file_options(node, broker=broker, state_dir=state_dir))]


def shell_line(argv: list[str]) -> str:
    """One shell-quoted command line."""
    return shlex.join(argv)


def read_node_value(node: NodeFile, base: Path) -> float:
    """The value a node's constant or file source holds (a command is not run here)."""
    return stored_value(node.value, base)


def resolve_node(path: Path) -> tuple[NodeFile, Path]:
    """Load a node file and check that its config and password file exist; return it and its base dir."""
    node = load_node_file(path)
    base = (path.parent / node.base_dir).resolve()
    files = [("config", node.config), ("password_file", node.password_file)]
    files += [
        (f, p)
        for f, p in (
            ("ca_file", node.ca_file),
            ("cert_file", node.cert_file),
            ("key_file", node.key_file),
            ("signing_key", node.signing_key),
        )
        if p
    ]
    for field, rel in files:
        if not (base / rel).is_file():
            raise ConfigError(field, str(base / rel), f"no such file (from {path})")
    if node.value.source == "file" and not (base / str(node.value.path)).is_file():
        raise ConfigError("value.path", str(base / str(node.value.path)), f"no such file (from {path})")
    return node, base
